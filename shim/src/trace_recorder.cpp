#include "trace_recorder.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace cuarena::shim {

void TraceRecorder::record(cuat::Action action, int device, StreamId stream, DevicePtr addr,
                           std::size_t size) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  std::lock_guard lock(mu_);
  events_.push_back({action, std::uint16_t(device), stream, addr, size, us});
}

std::string TraceRecorder::cannot_write(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "it is a directory";
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return "cannot write in " + dir + ": " + std::strerror(errno);
  return "";
}

std::string TraceRecorder::fallback_path() {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp";
  return dir + "/cuarena-trace." + std::to_string(::getpid()) + ".cuat";
}

std::string TraceRecorder::write() {
  std::lock_guard lock(mu_);
  // FORMAT.md: all of device 0's events, then device 1's; each device's stay in time order.
  std::stable_sort(events_.begin(), events_.end(),
                   [](const cuat::Event& a, const cuat::Event& b) { return a.device < b.device; });
  try {
    cuat::write(path_, events_);
  } catch (const cuat::WriteError& e) {
    return e.what();
  }
  return "";
}

}  // namespace cuarena::shim
