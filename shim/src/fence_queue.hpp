// FenceQueue: synchronous frees (cudaFree, cuMemFree) waiting for the device.
//
// CUDA's synchronous free waits for all earlier work on the device, and programs rely on that:
// memory they free may still be read or written by kernels already queued. The shim does not
// block the host per free. It defers each free into an open batch; a batch is closed by one set
// of events (StreamRegistry::record_fence) recorded after its last free, and its blocks go back
// to cuarena only once every one of those events has completed. Recording later than the free
// is always safe (it covers more work), which is what lets frees share a fence.
//
// `legacy_orders` (the caller's judgement, StreamRegistry::has_live_non_blocking): true when any
// later use of a block is ordered after its fence's legacy-stream event by CUDA's implicit
// synchronisation, so that event need not have completed, only the other streams' events.
//
// Invariants: every pointer is in at most one batch; outstanding_bytes() = bytes of the open
// batch + bytes of closed fences not yet taken. Not thread-safe: DeviceState locks.
#pragma once

#include <cstddef>
#include <deque>
#include <unordered_set>
#include <vector>

#include "cuarena/types.hpp"
#include "stream_registry.hpp"

namespace cuarena::shim {

class FenceQueue {
 public:
  struct Freed {
    DevicePtr ptr;
    std::size_t bytes;
  };

  /// Adds a free to the open batch. False (nothing changes) when `ptr` is already waiting here:
  /// a double free.
  bool defer(DevicePtr ptr, std::size_t bytes);
  bool waiting(DevicePtr ptr) const { return waiting_.count(ptr) != 0; }

  /// Closes the open batch with `events` (recorded after its last free). No-op when it is empty.
  void close(FenceEvents&& events);
  /// Moves the frees of every completed fence, oldest first, to `out`. Non-blocking.
  void take_completed(std::vector<Freed>& out, bool legacy_orders);
  /// Blocks until the oldest closed fence completes and moves its frees to `out`. False when no
  /// fence is closed, or when the driver refuses the wait (the fence stays, nothing is moved).
  bool wait_oldest(std::vector<Freed>& out, bool legacy_orders);

  std::size_t open_bytes() const { return open_bytes_; }
  std::size_t open_count() const { return open_.size(); }
  bool has_closed() const { return !fences_.empty(); }
  std::size_t outstanding_bytes() const { return open_bytes_ + closed_bytes_; }

 private:
  struct Fence {
    FenceEvents events;
    std::size_t done = 0;      // events.others[0, done) have completed
    bool legacy_done = false;  // events.legacy has completed
    std::vector<Freed> frees;
    std::size_t bytes = 0;
  };
  bool completed(Fence& f, bool legacy_orders);
  void take(Fence& f, std::vector<Freed>& out);

  std::vector<Freed> open_;
  std::size_t open_bytes_ = 0;
  std::deque<Fence> fences_;
  std::size_t closed_bytes_ = 0;
  std::unordered_set<DevicePtr> waiting_;
};

}  // namespace cuarena::shim
