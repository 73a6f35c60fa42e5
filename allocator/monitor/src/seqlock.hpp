// The page's sequence lock, as monitor_page.hpp describes it (Boehm, "Can seqlocks get along
// with programming language memory models?", 2012): one writer per page; every 8-byte field is
// an atomic store with release and an atomic load with acquire (plain moves on x86-64 and
// ordered enough on AArch64), which order the fields against `seq` without standalone fences
// (ThreadSanitizer does not model those). A reader that loads a field of a rewrite under way
// then loads the odd `seq` stored before it, or a later one: its check fails.
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

/// Marks `page` as being written (seq odd). put()'s release stores are ordered after the mark.
inline void begin_write(MonitorPage& page) {
  auto seq = seq_of(page);
  seq.store(seq.load(std::memory_order_relaxed) | 1, std::memory_order_relaxed);
}

/// Publishes the stores since begin_write (seq even again, one step further).
inline void end_write(MonitorPage& page) {
  auto seq = seq_of(page);
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

/// One field's store between begin_write and end_write.
inline void put(std::int64_t& field, std::int64_t value) {
  std::atomic_ref<std::int64_t>(field).store(value, std::memory_order_release);
}
inline void put(std::uint64_t& field, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(field).store(value, std::memory_order_release);
}

}  // namespace cuarena::monitor::detail
