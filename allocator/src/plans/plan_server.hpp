// PlanServer: serves requests from the installed loop plan (config loop_plan).
//
// It tells the LoopPlanner about every request and free, installs each plan the planner hands
// out (on trial first, then backed over a lazy pool range: PlannedRange), serves the requests
// the plan foresaw at their offsets, and gives a plan's range back to the pool when a longer
// loop's plan replaces it or memory is short. Blocks it serves count in the large pool, whose
// memory (the plan's range) they use.
//
// Invariants: a live block marked planned lies in the plan in use or in a retired arena still
// holding memory (draining_); a retired arena leaves draining_ once its last piece is given
// back.
//
// Locks: every call is made under the allocator's device lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuarena/types.hpp"
#include "front/context.hpp"
#include "front/live_table.hpp"
#include "large/block_pool.hpp"
#include "plans/loop_planner.hpp"
#include "plans/planned_range.hpp"

namespace cuarena::detail {

class PlanServer final : public LazyReclaimer {
 public:
  /// What the server needs from the allocator around it; called under the device lock.
  class Host {
   public:
    /// Frees `piece` (a planned arena's backing) into the pool once `streams` (non-empty: the
    /// other streams that used the arena) have finished the work queued on them so far, in
    /// order with the allocator's other frees that wait on events.
    virtual void defer_backing_free(Block* piece, const std::vector<StreamId>& streams) = 0;
    /// Waits for every pending free and every stream's freed blocks, then releases what the
    /// pool caches (empty_cache()). Returns the bytes released.
    virtual std::size_t wait_and_release() = 0;

   protected:
    ~Host() = default;
  };

  /// Plans loops when ctx.config.loop_plan is set; otherwise serves nothing. `pool` and `host`
  /// must outlive the server.
  PlanServer(Context& ctx, BlockPool& pool, Host& host);
  ~PlanServer();
  PlanServer(const PlanServer&) = delete;
  PlanServer& operator=(const PlanServer&) = delete;

  /// Tells the planner about a request of rec.size bytes (rounded, non-zero) on `stream` and
  /// serves it from the plan in use when the plan has a free, backed place for it; returns the
  /// address (rec.planned set, rec.seq the planner's number) or 0 to serve it elsewhere.
  /// Installs a plan the request completed.
  DevicePtr serve(LiveBlock& rec, StreamId stream);

  /// Tells the planner `rec` (allocated at `ptr`) was freed; when it was served here
  /// (rec.planned), frees it in its arena and returns true, else changes no memory and returns
  /// false.
  bool free(DevicePtr ptr, const LiveBlock& rec);

  /// empty_cache(): the plan in use (if any) is forgotten and its range goes back to the pool,
  /// but for its live blocks' pieces, which come back as those are freed.
  void drop();
  /// Memory is short: as drop() for a plan in use; a plan on trial holds nothing and goes on
  /// learning.
  void drop_backed();

  /// The pool is short: the plan in use gives back granules its range holds mapped under no
  /// live block, when every block it served was on `stream` (so stream order covers their
  /// work). Its later blocks there are backed again (back_part); a granule the plan so needed
  /// again is never given back again (one moving every iteration would cost driver calls every
  /// iteration). Returns the granules made idle.
  std::size_t reclaim(std::size_t granules, StreamId stream) override;

  /// Adds the backed runs of the planned ranges under no live block to `total`, and raises
  /// `largest` to the longest (as BlockPool::mapped_extents). Bytes.
  void free_extents(std::size_t& total, std::size_t& largest) const;
  /// Throws std::logic_error unless the `size` bytes at `ptr`, a live planned block, lie in a
  /// planned arena and are backed.
  void check_block(DevicePtr ptr, std::size_t size) const;
  /// Throws std::logic_error naming the first broken invariant of an arena.
  void check_invariants() const;

 private:
  /// Planned blocks may reuse other streams' bytes at once, ordered by stream waits
  /// (Config::plan_stream_waits, and a backend able to).
  bool stream_waits() const {
    return ctx_.config.plan_stream_waits && ctx_.backend.supports_stream_waits();
  }
  /// Puts a plan that passed its trial in use over a lazy pool range.
  void back(PlannedRange& a, StreamId stream);
  /// Stops placing in `a` and gives the pool every part of its range no live block uses.
  void end_plan(std::unique_ptr<PlannedRange> a);
  /// Frees a piece of `a`'s backing into the pool once every stream that used `a` is done.
  void give_back(Block* piece, const PlannedRange& a);
  PlannedRange* arena_holding(DevicePtr ptr) const;
  /// Notes that the plan in use served [ptr, ptr+size): granules reclaim() gave away there
  /// become needed.
  void note_served(DevicePtr ptr, std::size_t size);

  Context& ctx_;
  BlockPool& pool_;
  Host& host_;
  std::unique_ptr<LoopPlanner> planner_;  // null unless config loop_plan
  std::unique_ptr<PlannedRange> arena_;   // the plan in use
  std::vector<std::unique_ptr<PlannedRange>> draining_;
  bool trimmed_ = false;            // the pool's cache was given back after the plan's first period
  std::size_t checked_visits_ = 0;  // arena_->quiet_visits() at the last quiet point seen
  /// Per granule of arena_'s range, once reclaim() ran: kGiven (reclaim() took it and the plan
  /// has not served there since) or kNeeded (served there after that: never taken again).
  enum GranuleState : std::uint8_t { kKept = 0, kGiven = 1, kNeeded = 2 };
  std::vector<GranuleState> reclaimed_;
  std::size_t given_ = 0;  // granules in kGiven
};

}  // namespace cuarena::detail
