// The page's sequence lock, as monitor_page.hpp describes it (Boehm, "Can seqlocks get along
// with programming language memory models?", 2012): one writer per page; every 8-byte field is
// stored and loaded as a relaxed atomic, and the fences order them against `seq`.
#pragma once

#include <atomic>
#include <cstdint>

#include "cuarena/monitor_page.hpp"

namespace cuarena::monitor::detail {

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free,
              "a reader in another process needs lock-free 8-byte atomics");

inline std::atomic_ref<std::uint64_t> seq_of(MonitorPage& page) {
  return std::atomic_ref<std::uint64_t>(page.seq);
}

/// Marks `page` as being written (seq odd). Every store after it is ordered after the mark.
inline void begin_write(MonitorPage& page) {
  auto seq = seq_of(page);
  seq.store(seq.load(std::memory_order_relaxed) | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

/// Publishes the stores since begin_write (seq even again, one step further).
inline void end_write(MonitorPage& page) {
  auto seq = seq_of(page);
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

/// One field's store between begin_write and end_write.
inline void put(std::int64_t& field, std::int64_t value) {
  std::atomic_ref<std::int64_t>(field).store(value, std::memory_order_relaxed);
}
inline void put(std::uint64_t& field, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(field).store(value, std::memory_order_relaxed);
}

}  // namespace cuarena::monitor::detail
