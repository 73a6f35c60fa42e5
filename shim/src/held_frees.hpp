// HeldFrees: synchronous frees (cudaFree, cuMemFree) held back until a fence orders their reuse.
//
// CUDA's synchronous free waits for all earlier work on the device, and programs rely on that:
// memory they free may still be read or written by kernels already queued. The shim does not
// block the host per free. It holds each freed block here; when cuarena needs their memory (an
// allocation it cannot serve from what it holds) or too much is held, one fence
// (StreamRegistry::record_fence) orders every later command of the context after every earlier
// one, and every held block goes back to cuarena at once. Fencing later than the free is always
// safe (it covers more work), which is what lets all held frees share one fence.
//
// Invariants: every pointer is held at most once; bytes() is the sum of the held blocks' sizes,
// and sizes_ their multiset.
// Not thread-safe: DeviceState locks.
#pragma once

#include <cstddef>
#include <set>
#include <unordered_set>
#include <vector>

#include "cuarena/types.hpp"

namespace cuarena::shim {

class HeldFrees {
 public:
  struct Freed {
    DevicePtr ptr;
    std::size_t bytes;
  };

  /// Holds a freed block. False (nothing changes) when `ptr` is held already: a double free.
  bool hold(DevicePtr ptr, std::size_t bytes);
  bool held(DevicePtr ptr) const { return held_set_.count(ptr) != 0; }
  /// Whether a held block of [bytes, max_bytes] bytes exists: one a request of `bytes` would
  /// fit snugly once the held frees are given back. O(log held).
  bool holds_fit(std::size_t bytes, std::size_t max_bytes) const;

  /// Moves every held block to the back of `out`, oldest first. Call it only once a fence has
  /// been recorded after the last of them.
  void take_all(std::vector<Freed>& out);

  std::size_t bytes() const { return bytes_; }
  std::size_t count() const { return held_.size(); }

 private:
  std::vector<Freed> held_;
  std::unordered_set<DevicePtr> held_set_;
  std::multiset<std::size_t> sizes_;  // of held_
  std::size_t bytes_ = 0;
};

}  // namespace cuarena::shim
