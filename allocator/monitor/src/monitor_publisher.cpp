#include "cuarena/monitor_publisher.hpp"

#include <unistd.h>

#include "publisher_state.hpp"

namespace cuarena::monitor {

MonitorPublisher::MonitorPublisher(const Allocator& allocator, Options options) {
  name_ = options.name.empty() ? page_name(geteuid(), getpid(), options.device) : options.name;
  const auto log = options.log;
  auto state = std::make_unique<State>(allocator, std::move(options), name_);
  std::string error;
  if (!state->start(error)) {
    if (log) log("cuarena: no monitor page (cuarena top will not list this process): " + error);
    return;
  }
  state_ = std::move(state);
  publishing_ = true;
}

MonitorPublisher::~MonitorPublisher() {
  if (!state_) return;
  if (!state_->owned_here()) {
    // A fork child's copy: the thread is not here and the page is the parent's. Its mutexes
    // may have been held by that thread, so nothing of it is touched, not even freed.
    (void)state_.release();
    return;
  }
  detail::unregister_publisher(state_.get());
  state_->stop();
}

std::string MonitorPublisher::page_name(unsigned uid, long pid, int device) {
  return "/cuarena." + std::to_string(uid) + "." + std::to_string(pid) + "." +
         std::to_string(device);
}

}  // namespace cuarena::monitor
