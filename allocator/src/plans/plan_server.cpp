#include "plans/plan_server.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "front/messages.hpp"
#include "support/assert.hpp"
#include "tuning.hpp"

namespace cuarena::detail {

PlanServer::PlanServer(Context& ctx, BlockPool& pool, Host& host)
    : ctx_(ctx), pool_(pool), host_(host) {
  if (ctx_.config.loop_plan) {
    // With stream waits, a block may reuse another stream's bytes right after their free.
    planner_ = std::make_unique<LoopPlanner>(
        tuning::kLoopPlanMaxPeriod, stream_waits() ? 0 : tuning::kLoopPlanCrossStreamMargin);
    pool_.set_reclaimer(this);
  }
}

PlanServer::~PlanServer() {
  if (planner_) pool_.set_reclaimer(nullptr);
}

// Only a range whose blocks were all on `stream`: their work is then ordered before the
// request's. But a granule taken is unmapped on the host, at once or (dormant) later, and
// kernels queued on the blocks freed there may not have run yet: the host first waits for the
// stream (the pool's own granules move only once their sweep event says the same).
std::size_t PlanServer::reclaim(std::size_t granules, StreamId stream) {
  if (!arena_ || arena_->trial() || granules == 0) return 0;
  const std::vector<StreamId>& used = arena_->streams();
  if (used.size() > 1 || (used.size() == 1 && used.front() != stream)) return 0;
  // The host could not wait for a stream under graph capture (its work runs at replay).
  if (ctx_.backend.stream_capturing(stream)) return 0;
  const std::size_t gran = ctx_.granule;
  const DevicePtr base = arena_->base();
  if (reclaimed_.empty()) reclaimed_.assign(arena_->bytes() / gran + 1, kKept);
  std::size_t got = 0;
  std::vector<DevicePtr> taken;
  bool waited = false;
  auto wait_for_stream = [&] {
    const EventId e = ctx_.backend.record_event(stream);
    ++ctx_.stats.events_recorded;
    ctx_.backend.wait_event(e);
    ctx_.backend.release_event(e);
    waited = true;
  };
  arena_->for_each_gap([&](Block* piece, DevicePtr lo, DevicePtr hi) {
    // The gap's runs of granules not needed, from the top (as the pool frees them).
    const std::size_t g_lo = (lo - base) / gran, g_hi = (hi - base + gran - 1) / gran;
    for (std::size_t g = g_hi; g > g_lo && got < granules;) {
      const std::size_t top = g;
      while (g > g_lo && reclaimed_[g - 1] != kNeeded) --g;
      if (g < top) {
        if (!waited) wait_for_stream();
        got += pool_.idle_unused(piece, std::max(lo, base + g * gran),
                                 std::min(hi, base + top * gran), granules - got, taken);
      }
      while (g > g_lo && reclaimed_[g - 1] == kNeeded) --g;
    }
  });
  for (const DevicePtr at : taken) {
    reclaimed_[(at - base) / gran] = kGiven;
    ++given_;
  }
  return got;
}

void PlanServer::note_served(DevicePtr ptr, std::size_t size) {
  if (given_ == 0) return;
  const std::size_t gran = ctx_.granule;
  for (std::size_t g = (ptr - arena_->base()) / gran,
                   end = (ptr + size - 1 - arena_->base()) / gran;
       g <= end; ++g) {
    if (reclaimed_[g] != kGiven) continue;
    reclaimed_[g] = kNeeded;
    --given_;
  }
}

DevicePtr PlanServer::serve(LiveBlock& rec, StreamId stream) {
  if (!planner_) return 0;
  CUARENA_ASSERT(rec.size != 0, "a planned request needs a rounded size");
  Stats& stats = ctx_.stats;
  const Token token{rec.size, stream};
  rec.seq =
      planner_->on_allocate(token, std::size_t(stats.allocated_bytes[int(Pool::kAll)].current));
  DevicePtr ptr = arena_ ? arena_->place(token, planner_->window()) : 0;
  if (ptr != 0 && !pool_.back_part(arena_->piece(ptr), ptr, rec.size, stream)) {
    arena_->unplace(ptr);  // no memory for this part now: the pool serves it (or reclaims)
    ptr = 0;
  }
  if (ptr != 0) note_served(ptr, rec.size);
  if (arena_ && arena_->quiet_visits() > checked_visits_) {  // the loop holds least now
    checked_visits_ = arena_->quiet_visits();
    if (arena_->trial() && !arena_->missed()) {
      // Planned afresh from the iterations the trial followed: those of the plan's making may
      // hold a request made once for good where later ones free theirs.
      const std::size_t n = arena_->plan().entries.size();
      if (std::optional<Plan> fresh =
              planner_->refresh(arena_->plan(), rec.seq, (arena_->cursor() + n - 1) % n))
        arena_->replan(std::move(*fresh));
      back(*arena_, stream);
    } else if (!arena_->trial() && !trimmed_) {
      // One whole period served by the plan: what the pool still caches is memory the loop
      // no longer uses there (an older plan's range included, once its blocks are freed).
      // Given back once, waiting for the streams as back() does; requests the plan does not
      // hold take memory anew.
      trimmed_ = true;
      host_.wait_and_release();
    }
  }
  // A plan that missed requests stays (the cursor finds its place again) until a longer
  // period repeats: the loop around the one planned.
  std::size_t phase = 0;
  if (!arena_ || arena_->missed()) {
    if (std::optional<Plan> plan = planner_->take_plan(phase)) {
      if (arena_) end_plan(std::move(arena_));
      // Nothing outlives its iteration: a longer loop may. A plan wasting more over its live
      // peak than the pool holds over the iteration's allocated peak (and 2% more) would hold
      // more than the pool does: the pool serves that loop.
      const std::size_t reserved = ctx_.reserved();
      const std::size_t pool_waste = reserved > plan->job_peak ? reserved - plan->job_peak : 0;
      const bool tight = plan->bytes - plan->live_peak <=
                         pool_waste + plan->job_peak / 100 * tuning::kPlanSlackPercent;
      if (!tight) {
        ++ctx_.stats.plans_refused;
        planner_->refuse(plan->entries.size());
      }
      if (plan->live_peak != 0 && tight) {
        arena_ = std::make_unique<PlannedRange>(ctx_.backend, std::move(*plan), phase,
                                                stream_waits(), stats.stream_waits);
        checked_visits_ = 0;
      }
    }
  }
  rec.planned = ptr != 0;
  stats.planned_allocations += rec.planned;
  return ptr;
}

bool PlanServer::free(DevicePtr ptr, const LiveBlock& rec) {
  if (planner_) planner_->on_free(rec.seq);
  if (!rec.planned) return false;
  PlannedRange* a = arena_holding(ptr);
  CUARENA_ASSERT(a != nullptr, hex(ptr) + " planned but in no planned arena");
  if (Block* piece = a->free(ptr)) {  // a retired arena's last block in that piece
    give_back(piece, *a);
    if (!a->holds_memory()) std::erase_if(draining_, [&](const auto& d) { return d.get() == a; });
  }
  return true;
}

void PlanServer::drop() {
  if (!arena_) return;
  planner_->forget();
  end_plan(std::move(arena_));
}

void PlanServer::drop_backed() {
  if (arena_ && !arena_->trial()) drop();
}

// Over a lazy range (BlockPool::reserve_lazy): each part is backed when a block first lands
// there, with the memory the pool caches as the loop's older blocks die, so the range never
// stacks on top of that cache.
void PlanServer::back(PlannedRange& a, StreamId stream) {
  const std::size_t bytes = round_up(a.plan().bytes, kMinBlockSize);
  if (pool_.segment_mode()) {
    // A segment comes backed whole: give the cache back first (the loop holds least now).
    pool_.synchronize();
    pool_.release_cached();
  }
  Block* backing = pool_.reserve_lazy(bytes, stream);
  if (backing == nullptr) return;
  a.attach(backing);
  ++ctx_.stats.loop_plans;
  trimmed_ = false;
}

// The rest of the range comes back as its blocks are freed (free() -> give_back()).
void PlanServer::end_plan(std::unique_ptr<PlannedRange> a) {
  reclaimed_.clear();
  given_ = 0;
  for (Block* piece : a->carve(pool_, tuning::kLoopPlanCarveMinGap)) give_back(piece, *a);
  if (a->holds_memory()) draining_.push_back(std::move(a));
}

// The streams' work is fenced by events, as for a record_stream free.
void PlanServer::give_back(Block* piece, const PlannedRange& a) {
  std::vector<StreamId> others;
  for (StreamId s : a.streams()) {
    if (s != piece->stream) others.push_back(s);
  }
  if (others.empty())
    pool_.deallocate(piece);
  else
    host_.defer_backing_free(piece, others);
  trimmed_ = false;  // this range becomes cache: the next quiet point gives it back
}

PlannedRange* PlanServer::arena_holding(DevicePtr ptr) const {
  if (arena_ && arena_->contains(ptr)) return arena_.get();
  for (const auto& a : draining_) {
    if (a->contains(ptr)) return a.get();
  }
  return nullptr;
}

// A plan's range counts only where memory backs it (it is mapped as blocks first land).
void PlanServer::free_extents(std::size_t& total, std::size_t& largest) const {
  auto gaps = [&](const PlannedRange& a) {
    a.for_each_gap([&](const Block* piece, DevicePtr lo, DevicePtr hi) {
      pool_.mapped_extents(piece, lo, hi, total, largest);
    });
  };
  if (arena_) gaps(*arena_);
  for (const auto& a : draining_) gaps(*a);
}

void PlanServer::check_block(DevicePtr ptr, std::size_t size) const {
  const PlannedRange* a = arena_holding(ptr);
  CUARENA_CHECK(a != nullptr && a->piece(ptr) != nullptr,
                hex(ptr) + " planned but in no planned arena");
  CUARENA_CHECK(pool_.backed(a->piece(ptr), ptr, size), hex(ptr) + " planned, not backed");
}

void PlanServer::check_invariants() const {
  if (arena_) arena_->check_invariants();
  for (const auto& a : draining_) a->check_invariants();
}

}  // namespace cuarena::detail
