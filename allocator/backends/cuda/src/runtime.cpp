#include "runtime.hpp"

#include <string>

#include "cuarena/errors.hpp"

namespace cuarena::cuda {

void check_rt(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    throw BackendError(std::string("cuarena: ") + call + " failed: " + cudaGetErrorName(err) +
                       " (" + cudaGetErrorString(err) + ")");
  }
}

DeviceGuard::DeviceGuard(int device) {
  check_rt(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check_rt(cudaSetDevice(device), "cudaSetDevice");
  switched_ = previous_ != device;
}

DeviceGuard::~DeviceGuard() {
  if (switched_) cudaSetDevice(previous_);
}

EventPool::~EventPool() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

EventId EventPool::record(StreamId stream) {
  // Stream 0 means the current device's default stream: make it this pool's device (a free may
  // come while another device is current).
  DeviceGuard guard(device_);
  EventId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    cudaEvent_t e = nullptr;
    check_rt(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    events_.push_back(e);
    id = events_.size();
  }
  check_rt(log_.time("cudaEventRecord",
                [&] { return cudaEventRecord(events_[id - 1], reinterpret_cast<cudaStream_t>(stream)); }),
           "cudaEventRecord");
  return id;
}

bool EventPool::completed(EventId event) {
  const cudaError_t err = log_.time("cudaEventQuery", [&] { return cudaEventQuery(events_.at(event - 1)); });
  if (err == cudaErrorNotReady) return false;
  check_rt(err, "cudaEventQuery");
  return true;
}

void EventPool::wait(EventId event) {
  check_rt(cudaEventSynchronize(events_.at(event - 1)), "cudaEventSynchronize");
}

void mem_info(int device, std::size_t& free_bytes, std::size_t& total_bytes) {
  DeviceGuard guard(device);
  check_rt(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
}

}  // namespace cuarena::cuda
