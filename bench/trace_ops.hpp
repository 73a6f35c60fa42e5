// A trace's alloc and free_completed events flattened into allocations and frees, for the
// benchmarks (compile_trace_ops) and cuarena_steady_state (flatten_trace).
//
// The replayer's loop (cuarena/replay/replay_loop.hpp) decides which frees happen, and its rules
// hold: a free of an address never allocated is dropped; an alloc at an address still live first
// frees the old block (the trace lost its free); a block is freed at its free_completed, a
// deferred free too, as on the GPU rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuarena/replay/trace.hpp"

namespace cuarena::bench {

/// One allocation or free of a flattened trace.
struct FlatOp {
  bool alloc;            ///< true: allocate `block`; false: free it
  std::uint32_t block;   ///< dense block number: the n-th alloc of the trace is block n
  std::uint64_t stream;  ///< the block's allocation stream (the trace's handle), frees too
  std::uint64_t size;    ///< the block's requested bytes, frees too
};

struct FlatTrace {
  std::vector<FlatOp> ops;   ///< in trace order; each block's free (if any) after its alloc
  std::uint32_t blocks = 0;  ///< allocations, so block numbers are < blocks
  std::vector<std::uint32_t> live_at_end;  ///< blocks the trace never frees, ascending
};

/// Flattens `events` (one device's, in trace order) by the replayer's loop. O(events).
FlatTrace flatten_trace(const std::vector<replay::Event>& events);

/// A flattened trace on dense slot and stream numbers, so a benchmark's timed loop does no
/// hashing of trace addresses. Blocks left live at the end are freed (in slot order), so every
/// pass starts from the same state.
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

/// flatten_trace(events) on slots: a freed block's slot is reused by the next allocation (last
/// freed, first reused); streams are numbered in order of their first allocation.
TraceOps compile_trace_ops(const std::vector<replay::Event>& events);

}  // namespace cuarena::bench
