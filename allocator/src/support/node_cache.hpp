// NodeCache and CachedAllocator: recycled nodes for the pool's node-based indexes (std::set,
// std::map) and its Block objects. Nearly every free and request erases and inserts index nodes
// and splits or merges blocks; taking a node back from a free list instead of malloc/free makes
// the pool's free path markedly cheaper (docs/results.md). Nodes are never returned to malloc
// before the cache goes.
//
// Not thread-safe: the pool is used under its allocator's lock. A cache serves one node size
// (the first it is asked for); another size, or an array, goes to operator new.
#pragma once

#include <cstddef>
#include <new>

// Under AddressSanitizer a cached node is poisoned, so a use after erase still fails loudly.
#if defined(__SANITIZE_ADDRESS__)
#define CUARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUARENA_ASAN 1
#endif
#endif
#ifdef CUARENA_ASAN
#include <sanitizer/asan_interface.h>
#define CUARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CUARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define CUARENA_POISON(p, n) ((void)(p), (void)(n))
#define CUARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace cuarena::detail {

class NodeCache {
 public:
  NodeCache() = default;
  ~NodeCache() {
    while (head_ != nullptr) {
      Free* n = head_;
      CUARENA_UNPOISON(n, size_);
      head_ = n->next;
      ::operator delete(n);
    }
  }
  NodeCache(const NodeCache&) = delete;
  NodeCache& operator=(const NodeCache&) = delete;

  void* take(std::size_t bytes) {
    if (size_ == 0 && bytes >= sizeof(Free)) size_ = bytes;
    if (bytes != size_ || head_ == nullptr) return ::operator new(bytes);
    Free* n = head_;
    CUARENA_UNPOISON(n, size_);
    head_ = n->next;
    return n;
  }
  void give(void* p, std::size_t bytes) {
    if (bytes != size_) {
      ::operator delete(p);
      return;
    }
    head_ = new (p) Free{head_};
    CUARENA_POISON(p, size_);
  }

 private:
  struct Free {
    Free* next;
  };
  Free* head_ = nullptr;
  std::size_t size_ = 0;  // the node size served; 0 until the first take()
};

/// A standard allocator over a NodeCache: single objects from the cache, arrays from operator new.
template <class T>
struct CachedAllocator {
  using value_type = T;
  NodeCache* cache;
  explicit CachedAllocator(NodeCache* c) noexcept : cache(c) {}
  template <class U>
  CachedAllocator(const CachedAllocator<U>& other) noexcept : cache(other.cache) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(n == 1 ? cache->take(sizeof(T)) : ::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1)
      cache->give(p, sizeof(T));
    else
      ::operator delete(p);
  }
  template <class U>
  bool operator==(const CachedAllocator<U>& other) const noexcept {
    return cache == other.cache;
  }
};

}  // namespace cuarena::detail
