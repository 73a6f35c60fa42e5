// A publisher's page and thread (MonitorPublisher::State), and the process-wide list of them
// that the exit and fork handlers walk (publisher_registry.cpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "cuarena/monitor_publisher.hpp"

namespace cuarena::monitor {

class MonitorPublisher::State {
 public:
  State(const Allocator& allocator, Options options, std::string name);

  /// Claims the name, creates the page, fills its header and starts the thread. False (and
  /// nothing left behind) with `error` saying why.
  bool start(std::string& error);
  /// Stops the thread, removes and unmaps the page. Idempotent; does nothing in a process
  /// other than the one that started it (a fork child).
  void stop();
  /// True in the process that created it (not in a fork child).
  bool owned_here() const;

  const std::string& name() const { return name_; }

 private:
  void run();
  void rewrite();

  const Allocator& alloc_;
  const Options options_;
  const std::string name_;
  const pid_t owner_;
  MonitorPage* page_ = nullptr;
  bool stopped_ = false;

  std::mutex mu_;  // guards stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;

  // The latest pool walk (memory_breakdown, fragmentation), and when the next is due.
  Allocator::MemoryBreakdown breakdown_{};
  std::int64_t largest_free_ = 0;
  std::chrono::steady_clock::time_point next_walk_{};
};

namespace detail {

/// Adds `s` to the process's list, unless a publisher in it holds the same name (false). The
/// first call registers the exit and fork handlers.
bool register_publisher(MonitorPublisher::State* s);
/// Removes `s` (absent: nothing). After it returns the exit handler no longer reaches `s`.
void unregister_publisher(MonitorPublisher::State* s);

/// Bracket a publisher thread's reads of its allocator, so that fork() waits for them: a child
/// must not inherit the allocator's lock held by a thread it does not have. False while a fork
/// is under way: read nothing then (end_allocator_read() is not called).
bool begin_allocator_read();
void end_allocator_read();

}  // namespace detail

}  // namespace cuarena::monitor
