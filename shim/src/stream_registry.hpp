// StreamRegistry: the streams of one context that a synchronous free (cudaFree, cuMemFree) must
// wait for, and the events that fence such frees.
//
// An event recorded on the legacy default stream completes only after all earlier work of every
// blocking stream of the context (per-thread default streams included), so one covers them all;
// non-blocking streams do not synchronise with it and get an event each. A destroyed stream's
// work still runs: its last event stays in every fence until it completes.
//
// The legacy stream's record is also a command every later command of a blocking stream waits
// for (CUDA's implicit synchronisation: "any CUDA command to the NULL stream" separates two
// streams' commands). So while the context has no live non-blocking stream, a fenced block may be
// reused as soon as its fence is recorded: whatever stream the program uses it on next, that work
// is ordered after the fence, hence after every earlier user (FenceQueue's `legacy_orders`). A
// non-blocking stream created later first waits for the newest fence (order_after_fences), so
// blocks handed out before it existed are safe there too.
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

/// A CUevent that returns to its registry's spares when the last fence holding it is done.
using FenceEvent = std::shared_ptr<CUevent_st>;

/// One fence: what a batch of synchronous frees waits for.
struct FenceEvents {
  FenceEvent legacy;               ///< on the legacy stream: covers every blocking stream
  std::vector<FenceEvent> others;  ///< non-blocking streams and retired streams' last events
};

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
  /// Fills `out` with one event recorded now on the legacy stream and one on each non-blocking
  /// stream, and the retired streams' events not yet complete. Returns false, recording
  /// nothing, while any known stream is capturing a graph (an event there, or on the legacy
  /// stream in global capture mode, would break the capture). Throws BackendError when the
  /// driver refuses an event.
  bool record_fence(FenceEvents& out);
  /// True while a non-blocking stream the program may still launch work on is known (parked
  /// ones are not: the program destroyed them). Without one, a recorded fence orders every
  /// later use of its blocks (see above).
  bool has_live_non_blocking() const;
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
  FenceEvent record(CUstream stream);
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
