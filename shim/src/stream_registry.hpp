// StreamRegistry: the streams of one context that a synchronous free (cudaFree, cuMemFree) must
// wait for, and the events that fence such frees.
//
// An event recorded on the legacy default stream completes only after all earlier work of every
// blocking stream of the context (per-thread default streams included), so one covers them all;
// non-blocking streams do not synchronise with it and get an event each. A destroyed stream's
// work still runs: its last event stays in every fence until it completes.
//
// Not thread-safe: DeviceState calls it under its own lock, with the context current.
#pragma once

#include <cuda.h>

#include <memory>
#include <vector>

namespace cuarena::shim {

/// A CUevent that returns to its registry's spares when the last fence holding it is done.
using FenceEvent = std::shared_ptr<CUevent_st>;

class StreamRegistry {
 public:
  StreamRegistry() = default;
  ~StreamRegistry();
  StreamRegistry(const StreamRegistry&) = delete;
  StreamRegistry& operator=(const StreamRegistry&) = delete;

  /// A stream the program created or used (legacy and per-thread handles are ignored).
  void add(CUstream stream);
  /// Before the program destroys `stream`: records its last event and forgets the stream.
  void retire(CUstream stream);
  /// Appends to `out` one event recorded now on the legacy stream and on each non-blocking
  /// stream, and the retired streams' events not yet complete. Returns false, recording
  /// nothing, while any known stream is capturing a graph (an event there, or on the legacy
  /// stream in global capture mode, would break the capture). Throws BackendError when the
  /// driver refuses an event.
  bool record_fence(std::vector<FenceEvent>& out);

 private:
  FenceEvent record(CUstream stream);
  struct Known {
    CUstream stream;
    bool non_blocking;
  };
  std::vector<Known> streams_;
  std::vector<FenceEvent> retired_;
  std::shared_ptr<std::vector<CUevent>> spare_ = std::make_shared<std::vector<CUevent>>();
};

}  // namespace cuarena::shim
