// StreamRegistry: the streams of one context, and the fences that order a synchronous free's
// block (cudaFree, cuMemFree) before its next use.
//
// A fence orders every command the program issues after it, on any stream of the context, after
// every command issued before it, so a block freed before the fence may be reused at once, with
// no host wait:
//   1. what a non-blocking stream has queued (and a destroyed stream's last event until it
//      completes), the legacy stream waits for: one event each;
//   2. one event on the legacy stream: it completes only after every earlier command of every
//      blocking stream (CUDA's implicit synchronisation), and, after 1., of every stream;
//   3. every live non-blocking stream waits for that event; a blocking stream's later commands
//      wait for it by CUDA's implicit synchronisation ("any CUDA command to the NULL stream"
//      separates two streams' commands), and a non-blocking stream new to the program (created,
//      or a parked one handed back) first waits for the newest fence (order_after_fences).
// This is weaker than CUDA's own free (which blocks the host until the device is idle) and
// stronger than the block needs; its cost is one driver call or two per non-blocking stream,
// so the shim records a fence only when held memory is needed (held_frees.hpp). A stream the
// shim never saw (made through a path it does not hook) is not ordered.
//
// A stream cuarena has allocated or freed on is never really destroyed: cuarena keeps blocks and
// events per stream and would record on a dead handle (and a new stream could get the old
// handle, with the old one's blocks "in stream order"). The program's destroy parks it instead,
// and its next create of a stream with the same flags and priority gets a parked one back, so the
// streams kept stay bounded by the most the program ever had at once. (A parked stream keeps
// attributes the program set on it.)
//
// Not thread-safe: DeviceState calls it under its own lock, with the context current.
#pragma once

#include <cuda.h>

#include <memory>
#include <vector>

namespace cuarena::shim {

/// A CUevent that returns to its registry's spares when the last holder lets it go.
using FenceEvent = std::shared_ptr<CUevent_st>;

class StreamRegistry {
 public:
  StreamRegistry() = default;
  ~StreamRegistry();
  StreamRegistry(const StreamRegistry&) = delete;
  StreamRegistry& operator=(const StreamRegistry&) = delete;

  /// A stream the program created or used; `used` when cuarena allocates or frees on it (legacy
  /// and per-thread handles are ignored).
  void add(CUstream stream, bool used);
  /// The program destroys `stream`. True: the caller destroys it for real (its last event is
  /// kept for the fences); false: it is parked (it was used), and must not be destroyed.
  bool retire(CUstream stream);
  /// A parked stream made with `flags` and `priority`, handed back to the program, or nullptr.
  CUstream reuse(unsigned flags, int priority);
  /// Records a fence (above). Returns false, recording nothing, while any known stream is
  /// capturing a graph (an event there, or on the legacy stream in global capture mode, would
  /// break the capture). A stream the driver no longer knows is forgotten. Throws BackendError
  /// when the driver refuses the legacy stream's event.
  bool record_fence();
  /// Non-blocking streams the program may still launch work on (parked ones excluded): what a
  /// fence makes wait.
  std::size_t live_non_blocking() const;
  /// True while a capture the program began (cuStreamBeginCapture*, counted by the hooks) has
  /// not ended, or while the legacy stream answers that it would capture (a blocking stream
  /// captures in global mode). One driver call at most; a capture on a non-blocking stream begun
  /// through a path the hooks do not see is not detected.
  bool any_capturing() const;
  /// The program begins a capture on `stream` (counted before the driver starts it) and ends it
  /// (or its begin failed).
  void capture_begins(CUstream stream) { capturing_.push_back(stream); }
  void capture_ends(CUstream stream);

 private:
  FenceEvent record(CUstream stream);      // throws BackendError
  FenceEvent try_record(CUstream stream);  // null when the driver refuses
  /// Makes `stream` (non-blocking, new to the program) wait for the newest fence.
  void order_after_fences(CUstream stream);
  struct Known {
    CUstream stream;
    unsigned flags;
    bool used;    // cuarena has blocks or events on it
    bool parked;  // destroyed by the program, kept for cuarena
  };
  std::vector<Known> streams_;
  std::vector<FenceEvent> retired_;
  std::vector<CUstream> capturing_;  // one entry per capture begun and not ended
  FenceEvent newest_legacy_;         // the legacy event of the newest fence, for order_after_fences
  std::shared_ptr<std::vector<CUevent>> spare_ = std::make_shared<std::vector<CUevent>>();
};

}  // namespace cuarena::shim
