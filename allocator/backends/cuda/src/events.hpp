// EventPool: CUevents (timing disabled) behind EventIds, created on demand and reused.
#pragma once

#include <cuda.h>

#include <vector>

#include "call_log.hpp"
#include "cuarena/types.hpp"

namespace cuarena::cuda {

/// Ids are 1-based indexes. Records and queries are timed into the owning backend's CallLog.
/// Events are created and recorded in `context` (null: the primary context of `device`). Not
/// thread-safe: the owning backend is called under its allocator's lock.
class EventPool {
 public:
  EventPool(int device, CallLog& log, CUcontext context = nullptr)
      : device_(device), context_(context), log_(log) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  /// Records on `stream` (a CUstream/cudaStream_t of this context; 0 is its legacy default
  /// stream). Throws BackendError on failure.
  EventId record(StreamId stream);
  bool completed(EventId event);
  void wait(EventId event);
  /// Makes `stream`'s later work wait for `event` on the device. Throws BackendError on failure.
  void stream_wait(StreamId stream, EventId event);
  /// True while `stream` is being captured. Throws BackendError on failure.
  bool capturing(StreamId stream);
  void release(EventId event) { free_.push_back(event); }

 private:
  int device_;
  CUcontext context_;
  CallLog& log_;
  std::vector<CUevent> events_;
  std::vector<EventId> free_;
};

}  // namespace cuarena::cuda
