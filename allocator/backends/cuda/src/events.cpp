#include "events.hpp"

#include "context.hpp"
#include "cuarena/driver_api.hpp"

namespace cuarena::cuda {

EventPool::~EventPool() {
  if (events_.empty()) return;
  const DriverApi& api = DriverApi::get();
  for (CUevent e : events_) api.event_destroy(e);
}

EventId EventPool::record(StreamId stream) {
  // A free may come while another device's context (or none) is current.
  DeviceGuard guard(device_, context_);
  const DriverApi& api = DriverApi::get();
  EventId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    CUevent e = nullptr;
    check(api.event_create(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    events_.push_back(e);
    id = events_.size();
  }
  const CUresult r = log_.time("cudaEventRecord", [&] {
    return api.event_record(events_[id - 1], reinterpret_cast<CUstream>(stream));
  });
  if (r != CUDA_SUCCESS) {
    free_.push_back(id);
    check(r, "cuEventRecord");
  }
  return id;
}

bool EventPool::completed(EventId event) {
  const DriverApi& api = DriverApi::get();
  const CUresult r =
      log_.time("cudaEventQuery", [&] { return api.event_query(events_.at(event - 1)); });
  if (r == CUDA_ERROR_NOT_READY) return false;
  check(r, "cuEventQuery");
  return true;
}

void EventPool::stream_wait(StreamId stream, EventId event) {
  DeviceGuard guard(device_, context_);
  const DriverApi& api = DriverApi::get();
  check(log_.time("cudaStreamWaitEvent",
                  [&] {
                    return api.stream_wait_event(reinterpret_cast<CUstream>(stream),
                                                 events_.at(event - 1), 0);
                  }),
        "cuStreamWaitEvent");
}

bool EventPool::capturing(StreamId stream) {
  DeviceGuard guard(device_, context_);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r =
      DriverApi::get().stream_is_capturing(reinterpret_cast<CUstream>(stream), &status);
  // The legacy stream while a blocking stream captures: using it would join that capture.
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return true;
  check(r, "cuStreamIsCapturing");
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void EventPool::wait(EventId event) {
  check(DriverApi::get().event_synchronize(events_.at(event - 1)), "cuEventSynchronize");
}

}  // namespace cuarena::cuda
