// Helpers of the monitor tests: a simulated device, a publisher that rewrites often, polling.
#pragma once

#include <unistd.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "cuarena/allocator.hpp"
#include "cuarena/monitor_publisher.hpp"
#include "cuarena/monitor_reader.hpp"
#include "cuarena/sim_backend.hpp"

namespace cuarena::monitor::test {

inline constexpr std::size_t kCapacity = std::size_t{1} << 30;

inline SimBackend::Options sim_options() {
  SimBackend::Options o;
  o.capacity = kCapacity;
  o.granularity = std::size_t{2} << 20;
  return o;
}

/// A publisher's options for `device`, rewriting every 5 ms, the simulator's memory as the
/// replayer reports it.
inline MonitorPublisher::Options options(int device) {
  MonitorPublisher::Options o;
  o.kind = PageKind::kReplayer;
  o.device = device;
  o.device_uuid = "GPU-00000000-1111-2222-3333-444444444444";
  o.interval = std::chrono::milliseconds(5);
  o.device_memory = [](const Stats& s) {
    const std::int64_t reserved = s.reserved_bytes[int(Pool::kAll)].current;
    return DeviceMemory{std::int64_t(kCapacity) - reserved, std::int64_t(kCapacity)};
  };
  return o;
}

/// Polls `done` for up to 5 s (no timing assertion: the publisher rewrites every 5 ms).
inline bool eventually(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// The page as its latest consistent copy, once the publisher has written figures to it.
inline std::optional<MonitorPage> published(const std::string& name) {
  std::optional<MonitorPage> page;
  eventually([&] {
    page = read_page(name);
    return page && page->update_ns != 0;
  });
  return page;
}

inline bool page_exists(const std::string& name) {
  return access(("/dev/shm" + name).c_str(), F_OK) == 0;
}

}  // namespace cuarena::monitor::test
