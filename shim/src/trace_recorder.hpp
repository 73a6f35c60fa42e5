// TraceRecorder: CUARENA_TRACE. Keeps the job's allocations and frees in memory and writes them
// as a .cuat trace (trace/FORMAT.md) at exit, for `cuarena replay`. Times are microseconds
// since the shim loaded. Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "cuarena/trace/writer.hpp"
#include "cuarena/types.hpp"

namespace cuarena::shim {

class TraceRecorder {
 public:
  explicit TraceRecorder(std::string path) : path_(std::move(path)) {}
  void record(cuat::Action action, int device, StreamId stream, DevicePtr addr, std::size_t size);
  /// Writes the trace (devices one after another). Returns an error message, or "" on success.
  std::string write();
  const std::string& path() const { return path_; }
  /// Why a trace could not be written at `path` (its folder missing or not writable: the
  /// writer makes a temporary there and renames it), or "" when it can. No side effect.
  static std::string cannot_write(const std::string& path);
  /// Where a trace goes when its path cannot be written: $TMPDIR (else
  /// /tmp)/cuarena-trace.<pid>.cuat.
  static std::string fallback_path();
  bool empty() {
    std::lock_guard lock(mu_);
    return events_.empty();
  }

 private:
  std::string path_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  std::vector<cuat::Event> events_;
};

}  // namespace cuarena::shim
