// A trace's alloc / free_completed events compiled once, by the replayer's loop (replay_loop.hpp),
// into operations on dense slot and stream numbers, so a benchmark's timed loop does no hashing
// of trace addresses. The loop's rules hold: a free of an address never allocated is dropped; an
// alloc at an address still live first frees the old block (the trace lost its free); a block
// is freed at its free_completed, a deferred free too, as on the GPU rows. Blocks left live at
// the end are freed, so every pass starts from the same state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuarena/replay/trace.hpp"

namespace cuarena::bench {

struct TraceOp {
  bool alloc;            ///< true: allocate into `slot`; false: free `slot`
  std::uint32_t slot;    ///< index into the live-pointer table
  std::uint32_t stream;  ///< the block's allocation stream, an index into stream_handles
  std::uint64_t size;    ///< the block's requested bytes
};

struct TraceOps {
  std::vector<TraceOp> ops;
  std::size_t slots = 0;                      ///< size of the live-pointer table
  std::vector<std::uint64_t> stream_handles;  ///< dense stream index -> the trace's handle
};

TraceOps compile_trace_ops(const std::vector<replay::Event>& events);

}  // namespace cuarena::bench
