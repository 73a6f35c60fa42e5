// Runtime-API helpers shared by the CUDA backends: error checks, a device guard, an event pool.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuarena/types.hpp"

namespace cuarena::cuda {

/// Throws BackendError naming `call` unless `err` is cudaSuccess.
void check_rt(cudaError_t err, const char* call);

/// Makes `device` current for a scope and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// Counts driver calls and their host wall time, per call name, in microseconds. Not
/// thread-safe, like the backend that owns it.
class CallLog {
 public:
  /// Runs f() (one driver call) as `call` (a string literal) and returns its result.
  template <class F>
  auto operator()(const char* call, F&& f) {
    ++calls_;
    return time(call, std::forward<F>(f));
  }
  /// Times f() as `call` without counting it among calls() (event records and queries are not
  /// memory calls).
  template <class F>
  auto time(const char* call, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = f();
    us_[call] += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return result;
  }
  std::size_t calls() const { return calls_; }
  std::map<std::string, double> us() const { return {us_.begin(), us_.end()}; }

 private:
  std::map<const char*, double> us_;  // keyed by the literal's address: no string per call
  std::size_t calls_ = 0;
};

/// cudaEvent_t (timing disabled) behind EventIds, created on demand and reused. Ids are
/// 1-based indexes. Records and queries are timed into the owning backend's CallLog. Not
/// thread-safe: the owning backend is called under its allocator's lock.
class EventPool {
 public:
  EventPool(int device, CallLog& log) : device_(device), log_(log) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  /// Records on `stream` (a cudaStream_t of this device; 0 is its default stream).
  EventId record(StreamId stream);
  bool completed(EventId event);
  void wait(EventId event);
  void release(EventId event) { free_.push_back(event); }

 private:
  int device_;
  CallLog& log_;
  std::vector<cudaEvent_t> events_;
  std::vector<EventId> free_;
};

/// Free and total bytes of `device` (cudaMemGetInfo).
void mem_info(int device, std::size_t& free_bytes, std::size_t& total_bytes);

}  // namespace cuarena::cuda
