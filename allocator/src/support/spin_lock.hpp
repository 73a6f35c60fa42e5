// SpinLock: a test-and-test-and-set lock for critical sections of a few hundred nanoseconds
// (one hash-map or vector operation), where a std::mutex's futex sleep and wake-up under
// contention costs more than the section. After a short spin it yields, so a holder that was
// preempted is not starved. Meets BasicLockable (std::lock_guard works).
#pragma once

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cuarena::detail {

class SpinLock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
      while (locked_.load(std::memory_order_relaxed)) {  // wait without writing the line
        if (++spins < 128)
          pause();
        else
          std::this_thread::yield();
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
  std::atomic<bool> locked_{false};
};

}  // namespace cuarena::detail
