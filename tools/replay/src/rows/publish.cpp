// `cuarena replay --publish`: the cuarena sim row's allocator on a monitor page while it
// replays, so that `cuarena top` shows a replay as it would a job.
#include <algorithm>
#include <iostream>

#include "cuarena/monitor_publisher.hpp"
#include "cuarena/replay/replay.hpp"

namespace cuarena::replay {

std::shared_ptr<void> publish_replay(const Allocator& allocator, std::uint64_t capacity,
                                     int device) {
  monitor::MonitorPublisher::Options o;
  o.kind = monitor::PageKind::kReplayer;
  o.device = device;
  // The simulated device has one user: its free memory is what this allocator does not hold.
  o.device_memory = [total = std::int64_t(capacity)](const Stats& s) {
    const std::int64_t reserved = s.reserved_bytes[std::size_t(Pool::kAll)].current;
    return monitor::DeviceMemory{std::max<std::int64_t>(total - reserved, 0), total};
  };
  o.log = [](const std::string& line) {
    std::cerr << "cuarena replay: --publish: " << line << '\n';
  };
  return std::make_shared<monitor::MonitorPublisher>(allocator, std::move(o));
}

}  // namespace cuarena::replay
