// The publisher's thread: a rewrite of the page every interval, and the page's creation and
// removal around it.
#include "publisher_state.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "page_fields.hpp"
#include "shm_page.hpp"

namespace cuarena::monitor {

namespace {
// The pool walks hold the device lock; spaced so that they hold it at most 1/500 of the time.
constexpr int kWalkSpacing = 500;
}  // namespace

using Clock = std::chrono::steady_clock;

MonitorPublisher::State::State(const Allocator& allocator, Options options, std::string name)
    : alloc_(allocator), options_(std::move(options)), name_(std::move(name)), owner_(getpid()) {}

bool MonitorPublisher::State::owned_here() const { return getpid() == owner_; }

bool MonitorPublisher::State::start(std::string& error) {
  if (!detail::register_publisher(this)) {
    error = "another publisher of this process holds " + name_;
    return false;
  }
  page_ = detail::create_page(name_, error);
  if (page_ == nullptr) {
    detail::unregister_publisher(this);
    return false;
  }
  detail::write_identity(*page_, {options_.kind, options_.device, std::int64_t(owner_),
                                  detail::now_ns(), options_.device_uuid, detail::command_line()});
  // The thread takes no signal: the program's handlers run on its own threads.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    error = std::string("starting its thread: ") + e.what();
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (!thread_.joinable()) {
    detail::unregister_publisher(this);
    detail::remove_page(name_);
    detail::unmap_page(page_);
    page_ = nullptr;
    return false;
  }
  return true;
}

void MonitorPublisher::State::stop() {
  if (stopped_ || !owned_here()) return;
  stopped_ = true;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  detail::remove_page(name_);
  detail::unmap_page(page_);
  page_ = nullptr;
}

void MonitorPublisher::State::run() {
  pthread_setname_np(pthread_self(), "cuarena-monitor");
  const auto interval = std::max(options_.interval, std::chrono::milliseconds(1));
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    try {
      rewrite();
    } catch (...) {  // (std::bad_alloc) the next rewrite may succeed; the program goes on
    }
    lock.lock();
    wake_.wait_for(lock, interval, [this] { return stopping_; });
  }
}

void MonitorPublisher::State::rewrite() {
  detail::Reading r;
  if (!detail::begin_allocator_read()) return;  // fork() under way: next time
  try {
    r.stats = alloc_.stats();
    const Clock::time_point start = Clock::now();
    if (start >= next_walk_) {
      breakdown_ = alloc_.memory_breakdown();
      largest_free_ = std::int64_t(alloc_.fragmentation().largest_free);
      const Clock::time_point end = Clock::now();
      next_walk_ = end + (end - start) * kWalkSpacing;
    }
    r.limit = std::int64_t(alloc_.memory_limit());
  } catch (...) {
    detail::end_allocator_read();
    throw;
  }
  detail::end_allocator_read();
  r.breakdown = breakdown_;
  r.largest_free = largest_free_;
  if (options_.device_memory) {
    try {
      r.device = options_.device_memory(r.stats);
    } catch (...) {  // the driver may be going away at exit: unknown this time
      r.device = {};
    }
  }
  r.now_ns = detail::now_ns();
  detail::write_reading(*page_, r);
}

}  // namespace cuarena::monitor
