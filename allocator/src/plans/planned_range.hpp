// PlannedRange: serves a loop's requests at the offsets a Plan gives them, inside one pool
// block that stays allocated while the plan is in use: a lazy one (BlockPool::reserve_lazy),
// whose parts the allocator backs as blocks first land there, and which stay mapped.
//
// It follows the request sequence with a cursor over the plan's entries. A request that matches
// the entry at the cursor goes to that entry's offset when those bytes are free: no live block
// of the arena overlaps them, and every free of another stream over them is finished (a fence:
// an event recorded at that free) or, with stream waits, waited for by the request's stream on
// the device (DeviceBackend::stream_wait_event). Anything else (a request the plan did not foresee,
// an unplanned entry, bytes still busy) is served by the pool, and the cursor finds its place again
// from the window of recent requests (Plan::resume).
//
// A plan is first on trial: it follows the requests for a whole period without memory, and is
// backed only if it foresaw every one (a plan that misses would hold memory the pool then lacks).
//
// Invariants: live_ holds the arena's blocks handed out and not freed, pairwise disjoint, inside
// [base, base + bytes); each lies in one held piece, and (once carved) each held piece holds at
// least one; every fence's event is unreleased; cursor_ < entries.size().
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "large/block_pool.hpp"
#include "plans/loop_planner.hpp"

namespace cuarena::detail {

class PlannedRange {
 public:
  /// A plan on trial (no memory yet: place() follows the requests and serves none); `phase`:
  /// the entry the next request corresponds to. `stream_waits`: a request may take bytes whose
  /// free on another stream the device has not reached, its stream made to wait for it; each
  /// wait made adds one to `waits_made` (Stats::stream_waits), which must outlive the range.
  PlannedRange(DeviceBackend& backend, Plan plan, std::size_t phase, bool stream_waits,
               std::int64_t& waits_made);
  ~PlannedRange();
  PlannedRange(const PlannedRange&) = delete;
  PlannedRange& operator=(const PlannedRange&) = delete;

  /// Follows one request (`window` includes it). Returns where to serve it in the arena,
  /// or 0 to serve it elsewhere.
  DevicePtr place(const Token& token, const TokenWindow& window);
  /// Frees a block place() returned (its stream's work is ordered before any later reuse on
  /// that stream; other streams wait for the fence the plan asks for). Once carved, returns the
  /// held piece of the backing this free emptied (to give back to the pool), else nullptr.
  Block* free(DevicePtr ptr);

  /// Takes back the block place() just returned at `ptr`, its memory having been refused.
  void unplace(DevicePtr ptr);

  /// Puts the plan in use over `backing`, an allocated pool block of at least plan().bytes;
  /// a lazy one (BlockPool::reserve_lazy) is backed by the caller as place() hands out parts.
  void attach(Block* backing);
  /// The pool block holding `ptr` (the backing, or once carved the held piece), or nullptr.
  Block* piece(DevicePtr ptr) const;
  /// On trial: never backed.
  bool trial() const { return bytes_ == 0; }

  bool contains(DevicePtr p) const { return !held_.empty() && p >= base_ && p < base_ + bytes_; }
  /// The range's first address and its bytes (0 while on trial).
  DevicePtr base() const { return base_; }
  std::size_t bytes() const { return bytes_; }
  /// For an arena no longer placing (the plan no longer fits the loop, or memory is short): cuts
  /// the backing
  /// around the blocks still live: returns the pieces no block uses, in address order, for the
  /// pool (runs under `min_gap` bytes stay in the pieces held). The held pieces come back one
  /// by one from free(). A block that lives on (the loop changed) so pins only itself.
  std::vector<Block*> carve(BlockPool& pool, std::size_t min_gap);
  /// Pieces of the backing still held (all of it until carve()).
  bool holds_memory() const { return !held_.empty(); }
  /// Some request since the plan was put in use was not one it foresaw: a plan for a longer
  /// loop (one this plan's loop is inside) should replace it.
  bool missed() const { return missed_ != 0; }
  /// Times the cursor reached the plan's quiet entry (Plan::quiet) after following a whole
  /// period: where the plan is put in use, and the pool's cache trimmed a period later.
  std::size_t quiet_visits() const { return quiet_visits_; }
  /// Streams that had blocks here: their work must finish before the backing is reused.
  const std::vector<StreamId>& streams() const { return streams_; }
  const Plan& plan() const { return plan_; }
  /// The entry the next request corresponds to.
  std::size_t cursor() const { return cursor_; }
  /// On trial: replaces the plan by `fresh`, the same requests in the same order (replanned
  /// from later iterations: LoopPlanner::refresh()).
  void replan(Plan fresh);

  /// Calls f(piece, lo, hi) for each run [lo, hi) of a held piece under no live block, in
  /// address order (a lazy range's runs may lack memory: the caller asks the pool).
  template <class F>
  void for_each_gap(F&& f) const {
    for (const auto& [addr, piece] : held_) {
      DevicePtr pos = addr;
      for (auto it = live_.lower_bound(std::size_t(addr - base_));
           it != live_.end() && base_ + it->first < piece->end(); ++it) {
        if (base_ + it->first > pos) f(piece, pos, base_ + it->first);
        pos = base_ + it->second.end;
      }
      if (piece->end() > pos) f(piece, pos, piece->end());
    }
  }
  /// Throws std::logic_error naming the first broken invariant.
  void check_invariants() const;

 private:
  struct Live {
    std::size_t end;  ///< offset past the block
    StreamId stream;
    bool fence;
  };
  struct Fence {
    std::size_t offset, end;
    StreamId stream;
    EventId event;
    std::uint64_t seq;  ///< recorded after every fence of a lower seq on the same stream
  };
  /// The newest fence (by seq) of stream `from` that stream `to` was made to wait for: one
  /// wait orders `to` after every earlier fence of `from` too.
  struct Waited {
    StreamId to, from;
    std::uint64_t seq;
  };
  /// True when [offset, offset + size) may be handed out on `stream` now (having made `stream`
  /// wait for the unfinished frees of other streams there, with stream waits).
  bool available(std::size_t offset, std::size_t size, StreamId stream);

  DeviceBackend& backend_;
  Plan plan_;
  Block* backing_ = nullptr;  ///< until carve(): the whole range; then see held_
  DevicePtr base_ = 0;
  std::size_t bytes_ = 0;             ///< of the range; 0 while on trial
  std::map<DevicePtr, Block*> held_;  ///< pieces of the backing held, by address
  std::size_t cursor_;
  bool synced_ = true;
  std::size_t missed_ = 0;    ///< requests the plan did not foresee
  std::size_t followed_ = 0;  ///< requests followed since the trial began, up to a period
  std::size_t quiet_visits_ = 0;
  std::map<std::size_t, Live> live_;  ///< by offset
  std::vector<Fence> fences_;
  std::vector<StreamId> streams_;
  bool may_wait_;                      ///< stream waits allowed (Config::plan_stream_waits)
  std::int64_t& waits_made_;           ///< counts the stream waits made
  std::vector<const Fence*> to_wait_;  ///< available()'s scratch: fences to wait for
  std::uint64_t fence_seq_ = 0;
  std::vector<Waited> waited_;  ///< one per (to, from) pair of streams
};

}  // namespace cuarena::detail
