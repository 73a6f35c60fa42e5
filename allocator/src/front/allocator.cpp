// Allocator: the façade over BlockPool and SlabArena. It owns the device lock, the table of live
// allocations, the stream caches, frees waiting on record_stream events, the statistics, and the
// out-of-memory path.
//
// Invariants kept here: `live_` holds exactly the allocations handed out and not yet freed;
// `pending_` holds freed allocations whose record_stream events have not all completed, and the
// stream caches hold freed blocks parked there (stream_cache.hpp); the memory of both is still
// allocated in the pool/slab. Once the caches' deltas are folded in (every reader of the
// statistics folds first), allocation/allocated_bytes/requested_bytes count `live_`, and
// active/active_bytes count `live_` plus `pending_`.
//
// Locks: `mu_` (the device lock) guards everything but `live_` (striped, leaf locks) and the
// stream caches (their own locks, taken after `mu_` when both are held). The fast path, a stream
// cache hit or park, takes no `mu_`.
#include "cuarena/allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "cuarena/size_classes.hpp"
#include "front/live_table.hpp"
#include "front/stream_cache.hpp"
#include "large/block_pool.hpp"
#include "plans/loop_planner.hpp"
#include "plans/planned_arena.hpp"
#include "slabs/slab_arena.hpp"
#include "support/assert.hpp"
#include "tuning.hpp"

namespace cuarena {

using detail::Block;
using detail::CachedBlock;
using detail::LiveBlock;
using detail::PlannedArena;
namespace tuning = detail::tuning;
using detail::Slab;
using detail::StreamCache;

namespace {
std::string hex(DevicePtr p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

std::size_t limit_bytes(const DeviceBackend& backend, const Config& config) {
  const auto bytes =
      static_cast<std::size_t>(double(backend.capacity()) * config.per_process_memory_fraction);
  return bytes / backend.granularity() * backend.granularity();
}
}  // namespace

class Allocator::Impl {
 public:
  Impl(DeviceBackend& backend, Config config)
      : config_(config),
        classes_(config_.small_limit, config_.size_classes_per_doubling),
        ctx_{backend,
             config_,
             stats_,
             backend.granularity(),
             limit_bytes(backend, config_),
             static_cast<std::size_t>(double(limit_bytes(backend, config_)) *
                                      config_.defrag_threshold)},
        pool_(ctx_),
        slabs_(ctx_, pool_, classes_) {
    if (config_.loop_plan)
      planner_ = std::make_unique<detail::LoopPlanner>(detail::tuning::kLoopPlanMaxPeriod,
                                                       detail::tuning::kLoopPlanCrossStreamMargin);
    if (config_.slab_size < classes_.max_size()) {
      throw ConfigError("cuarena config: slab_size (" + std::to_string(config_.slab_size) +
                        ") must be at least the largest small class (" +
                        std::to_string(classes_.max_size()) + " bytes, from small_limit)");
    }
  }

  ~Impl() {
    for (PendingFree& p : pending_) {
      for (EventId e : p.events) ctx_.backend.release_event(e);
    }
  }

  void* allocate(std::size_t bytes, StreamId stream) {
    if (bytes == 0) return nullptr;
    const bool small = bytes <= config_.small_limit;
    std::size_t cls = 0;
    LiveBlock rec{bytes, 0, stream, nullptr, nullptr, {}};
    if (small) {
      cls = classes_.index(bytes);
      rec.size = classes_.size(cls);
    } else if (bytes <= SIZE_MAX - kMinBlockSize) {
      rec.size = round_up(bytes, kMinBlockSize);
    }
    // Fast path: a block this stream parked while the device lock was taken.
    if (rec.size != 0) {
      if (StreamCache* c = caches_.find(stream); c != nullptr && c->maybe_nonempty()) {
        CachedBlock hit;
        if (c->take(rec.size, small, bytes, hit)) {
          rec.slab = hit.slab;
          rec.block = hit.block;
          live_.insert(hit.ptr, std::move(rec));
          return reinterpret_cast<void*>(hit.ptr);
        }
      }
    }

    DevicePtr ptr = 0;
    {
      std::lock_guard lock(mu_);
      CUARENA_EXPENSIVE(check_structures());
      if (!pending_.empty()) process_pending(false);
      if (rec.size != 0) ptr = planned(rec, stream);
      if (ptr != 0) {
        // served by the loop plan
      } else if (small) {
        ptr = slabs_.allocate(cls, stream, rec.slab);
        if (ptr == 0) {
          reclaim();
          ptr = slabs_.allocate(cls, stream, rec.slab);
        }
      } else if (rec.size != 0) {
        rec.block = pool_.try_allocate(rec.size, stream);
        if (rec.block == nullptr && rec.size <= ctx_.limit) {  // else no wait can help
          reclaim();
          rec.block = pool_.try_allocate(rec.size, stream);
        }
        ptr = rec.block ? rec.block->addr : 0;
      }
      if (ptr == 0) throw out_of_memory(bytes, stream);

      // A planned block counts in the large pool, whose memory (the plan's range) it uses.
      detail::count_allocations(stats_, rec.slab ? Pool::kSmall : Pool::kLarge, 1,
                                std::int64_t(rec.size), std::int64_t(rec.requested));
      sync_inactive();
    }
    live_.insert(ptr, std::move(rec));  // nobody can free ptr before it is returned
    return reinterpret_cast<void*>(ptr);
  }

  void deallocate(void* p) {
    if (p == nullptr) return;
    const auto ptr = reinterpret_cast<DevicePtr>(p);
    std::optional<LiveBlock> taken = live_.take(ptr);
    if (!taken) {
      throw InvalidPointerError("cuarena: deallocate(" + hex(ptr) +
                                "): not a live allocation of this allocator (never allocated "
                                "here, or already freed)");
    }
    LiveBlock& rec = *taken;
    std::unique_lock lock(mu_, std::defer_lock);
    StreamCache* cache = nullptr;
    if (rec.uses.empty() && config_.stream_cache_bytes != 0 && !rec.planned) {
      // Park the block in its stream's cache rather than queue for the device lock: when the
      // lock is taken, or while the stream is parking (it met a taken lock since its last drain).
      const CachedBlock b{ptr, rec.size, rec.slab, rec.block};
      cache = caches_.find(rec.stream);
      if (cache != nullptr && cache->parking() &&
          cache->park(b, rec.requested, config_.stream_cache_bytes))
        return;
      if (!lock.try_lock()) {
        if (cache == nullptr) cache = caches_.get(rec.stream);
        if (cache != nullptr && cache->park(b, rec.requested, config_.stream_cache_bytes)) {
          cache->start_parking();
          return;
        }
        lock.lock();
      }
      // A full cache goes back to the pool whole, so it never holds stale sizes for long.
      if (cache != nullptr && cache->maybe_nonempty()) drain_cache(*cache);
    } else {
      lock.lock();
    }
    CUARENA_EXPENSIVE(check_structures());
    const int pool = int(rec.slab ? Pool::kSmall : Pool::kLarge);
    for (int q : {int(Pool::kAll), pool}) {
      stats_.allocation[q].decrease(1);
      stats_.allocated_bytes[q].decrease(std::int64_t(rec.size));
      stats_.requested_bytes[q].decrease(std::int64_t(rec.requested));
    }
    if (rec.uses.empty()) {
      finish_free(ptr, rec);
    } else {
      PendingFree pf{ptr, std::move(rec), {}};
      for (StreamId s : pf.live.uses) {
        pf.events.push_back(ctx_.backend.record_event(s));
        ++stats_.events_recorded;
      }
      pending_.push_back(std::move(pf));
      stats_.pending_frees = std::int64_t(pending_.size());
    }
    sync_inactive();
  }

  void record_stream(void* p, StreamId stream) {
    const auto ptr = reinterpret_cast<DevicePtr>(p);
    const bool live = live_.update(ptr, [&](LiveBlock& rec) {
      if (stream != rec.stream &&
          std::find(rec.uses.begin(), rec.uses.end(), stream) == rec.uses.end())
        rec.uses.push_back(stream);
    });
    if (!live) {
      throw InvalidPointerError("cuarena: record_stream(" + hex(ptr) +
                                "): not a live allocation of this allocator");
    }
  }

  bool owns(const void* p) const {
    std::lock_guard lock(mu_);
    return pool_.owns(reinterpret_cast<DevicePtr>(p));
  }

  std::size_t release_cached() {
    std::lock_guard lock(mu_);
    CUARENA_EXPENSIVE(check_structures());
    drain_caches();
    process_pending(true);
    if (arena_) {  // empty_cache(): the plan's range goes back, but for its live blocks
      planner_->forget();
      retire(std::move(arena_));
    }
    const std::size_t bytes = wait_and_release();
    sync_inactive();
    return bytes;
  }

  void process_events() {
    std::lock_guard lock(mu_);
    CUARENA_EXPENSIVE(check_structures());
    drain_caches();
    process_pending(false);
    pool_.poll_sweeps();
    pool_.record_sweeps();
    sync_inactive();
  }

  Stats stats() const {
    std::lock_guard lock(mu_);
    fold_caches();
    sync_inactive();
    return stats_;
  }

  void reset_peak_stats() {
    std::lock_guard lock(mu_);
    fold_caches();
    for (StatArray* a :
         {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
          &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
          &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      for (Stat& s : *a) s.reset_peak();
    }
  }

  const Config& config() const { return config_; }

  void set_memory_fraction(double fraction) {
    if (!(fraction > 0.0 && fraction <= 1.0))
      throw ConfigError("cuarena: memory fraction " + std::to_string(fraction) +
                        " is outside (0, 1]");
    std::lock_guard lock(mu_);
    CUARENA_EXPENSIVE(check_structures());
    config_.per_process_memory_fraction = fraction;
    ctx_.limit = limit_bytes(ctx_.backend, config_);
    ctx_.soft_limit = static_cast<std::size_t>(double(ctx_.limit) * config_.defrag_threshold);
  }

  void with_device_lock(const std::function<void()>& fn) {
    std::lock_guard lock(mu_);
    fn();
  }

  std::size_t limit() const {
    std::lock_guard lock(mu_);
    return ctx_.limit;
  }

  std::vector<BlockInfo> live_blocks() const {
    std::vector<BlockInfo> out;
    live_.for_each([&](DevicePtr ptr, const LiveBlock& rec) {
      out.push_back({ptr, rec.requested, rec.size, rec.stream, rec.slab != nullptr});
    });
    std::sort(out.begin(), out.end(),
              [](const BlockInfo& a, const BlockInfo& b) { return a.ptr < b.ptr; });
    return out;
  }

  std::optional<BlockInfo> find(const void* p) const {
    std::optional<BlockInfo> out;
    live_.update(reinterpret_cast<DevicePtr>(p), [&](const LiveBlock& rec) {
      out = BlockInfo{reinterpret_cast<DevicePtr>(p), rec.requested, rec.size, rec.stream,
                      rec.slab != nullptr};
    });
    return out;
  }

  std::vector<SegmentInfo> segments() const {
    using State = SegmentInfo::State;
    std::vector<std::pair<DevicePtr, std::size_t>> runs;
    std::vector<SegmentInfo::Piece> used;  // live and pending-free allocations
    {
      std::lock_guard lock(mu_);
      pool_.mapped_runs(runs);
      for (const PendingFree& pf : pending_)
        used.push_back(
            {pf.ptr, pf.live.size, pf.live.requested, State::kPendingFree, pf.live.stream});
    }
    live_.for_each([&](DevicePtr ptr, const LiveBlock& rec) {
      used.push_back({ptr, rec.size, rec.requested, State::kAllocated, rec.stream});
    });
    std::sort(used.begin(), used.end(),
              [](const auto& a, const auto& b) { return a.addr < b.addr; });
    std::sort(runs.begin(), runs.end());
    std::vector<SegmentInfo> out;
    auto next = used.begin();
    for (const auto& [addr, size] : runs) {
      SegmentInfo seg{addr, size, 0, {}};
      DevicePtr pos = addr;
      next = std::lower_bound(next, used.end(), addr,
                              [](const auto& piece, DevicePtr a) { return piece.addr < a; });
      for (; next != used.end() && next->addr + next->size <= addr + size; ++next) {
        if (next->addr > pos) seg.blocks.push_back({pos, next->addr - pos, 0, State::kInactive, 0});
        if (seg.stream == 0) seg.stream = next->stream;
        seg.blocks.push_back(*next);
        pos = next->addr + next->size;
      }
      if (pos < addr + size) seg.blocks.push_back({pos, addr + size - pos, 0, State::kInactive, 0});
      out.push_back(std::move(seg));
    }
    return out;
  }

  Fragmentation fragmentation() const {
    std::lock_guard lock(mu_);
    fold_caches();
    Fragmentation f;
    std::size_t slab_total = 0, slab_largest = 0;
    pool_.free_mapped_extents(f.free_bytes, f.largest_free);
    // A plan's range counts only where memory backs it (it is mapped as blocks first land).
    auto gaps = [&](const PlannedArena& a) {
      a.for_each_gap([&](const Block* piece, DevicePtr lo, DevicePtr hi) {
        pool_.mapped_extents(piece, lo, hi, f.free_bytes, f.largest_free);
      });
    };
    if (arena_) gaps(*arena_);
    for (const auto& a : draining_) gaps(*a);
    slabs_.free_extents(slab_total, slab_largest);
    f.free_bytes += slab_total + std::size_t(stats_.stream_cached_bytes);
    f.largest_free = std::max(f.largest_free, slab_largest);
    const auto& all = int(Pool::kAll);
    f.rounding_waste =
        std::size_t(stats_.allocated_bytes[all].current - stats_.requested_bytes[all].current);
    return f;
  }

  MemoryBreakdown memory_breakdown() const {
    std::lock_guard lock(mu_);
    fold_caches();
    const detail::BlockPool::Breakdown b = pool_.breakdown();
    std::size_t slab_free = 0, largest = 0;
    slabs_.free_extents(slab_free, largest);
    return {b.allocated, slab_free, std::size_t(stats_.stream_cached_bytes), b.owned, b.shared,
            b.retired,   b.idle};
  }

  void check_invariants() const {
    std::lock_guard lock(mu_);
    fold_caches();
    check_structures();
    std::int64_t bytes = 0, requested = 0, count = 0;
    auto check_memory = [](DevicePtr ptr, std::size_t size, const Slab* slab, const Block* block) {
      if (slab) {
        CUARENA_CHECK(ptr >= slab->base() &&
                          ptr + size <= slab->base() + std::size_t(slab->slots) * slab->slot_size,
                      hex(ptr) + " outside its slab");
      } else {
        CUARENA_CHECK(block->allocated && block->addr == ptr && block->size == size,
                      hex(ptr) + " block mismatch");
      }
    };
    live_.for_each([&](DevicePtr ptr, const LiveBlock& rec) {
      ++count;
      bytes += std::int64_t(rec.size);
      requested += std::int64_t(rec.requested);
      if (rec.planned) {
        const PlannedArena* a = arena_holding(ptr);
        CUARENA_CHECK(a != nullptr && a->piece(ptr) != nullptr,
                      hex(ptr) + " planned but in no planned arena");
        CUARENA_CHECK(pool_.backed(a->piece(ptr), ptr, rec.size),
                      hex(ptr) + " planned, not backed");
      } else
        check_memory(ptr, rec.size, rec.slab, rec.block);
    });
    caches_.for_each([&](StreamCache& c) {
      c.for_each_block([&](const CachedBlock& b) {
        CUARENA_CHECK(!live_.contains(b.ptr), hex(b.ptr) + " both live and in a stream cache");
        check_memory(b.ptr, b.size, b.slab, b.block);
      });
    });
    const int all = int(Pool::kAll);
    CUARENA_CHECK(stats_.allocation[all].current == count &&
                      stats_.allocated_bytes[all].current == bytes &&
                      stats_.requested_bytes[all].current == requested,
                  "statistics disagree with live blocks");
    const auto backings = std::count_if(pending_.begin(), pending_.end(),
                                        [](const PendingFree& p) { return p.backing; });
    CUARENA_CHECK(stats_.active[all].current == count + std::int64_t(pending_.size() - backings),
                  "active count disagrees");
    CUARENA_CHECK(
        stats_.reserved_bytes[int(Pool::kSmall)].current == std::int64_t(slabs_.slab_bytes()),
        "small_pool reserved != slab bytes");
  }

 private:
  /// What the device lock guards alone: the pool's and the slabs' structures. The live table and
  /// the stream caches change outside it, so only check_invariants() (no call in flight) looks
  /// at them. Caller holds mu_.
  void check_structures() const {
    pool_.check_invariants();
    slabs_.check_invariants();
    if (arena_) arena_->check_invariants();
    for (const auto& a : draining_) a->check_invariants();
  }

  struct PendingFree {
    DevicePtr ptr;
    LiveBlock live;
    std::vector<EventId> events;
    bool backing = false;  ///< a retired planned arena's block, never counted as allocated
  };

  /// Returns every block parked in a stream cache to its slab or the pool (their statistics
  /// were counted at park time); true when there was any. Caller holds mu_.
  bool drain_caches() {
    if (!caches_.any()) return false;
    caches_.for_each([&](StreamCache& c) { c.drain(drained_, deltas_); });
    return return_drained();
  }
  void drain_cache(StreamCache& c) {
    c.drain(drained_, deltas_);
    return_drained();
  }
  /// Applies deltas_ (fold order) and returns drained_ to the slabs and the pool, leaving both
  /// empty.
  bool return_drained() {
    apply_deltas();
    for (const CachedBlock& b : drained_) {
      if (b.slab)
        slabs_.deallocate(b.slab, b.ptr);
      else
        pool_.deallocate(b.block);
    }
    const bool any = !drained_.empty();
    drained_.clear();
    return any;  // stream_cached_bytes is refreshed by every reader's fold_caches()
  }

  /// Folds the statistics changes of the fast path into stats_. Caller holds mu_.
  void fold_caches() const {
    if (!caches_.any()) return;
    std::size_t bytes = 0;
    caches_.for_each([&](StreamCache& c) { bytes += c.take_delta(deltas_); });
    apply_deltas();
    stats_.stream_cached_bytes = std::int64_t(bytes);
  }
  /// Every cache's decreases before any increase: a peak is never over-read.
  void apply_deltas() const {
    for (const detail::CacheDelta& d : deltas_) d.apply_decreases(stats_);
    for (const detail::CacheDelta& d : deltas_) d.apply_increases(stats_);
    deltas_.clear();
  }

  void finish_free(DevicePtr ptr, const LiveBlock& rec) {
    const int pool = int(rec.slab ? Pool::kSmall : Pool::kLarge);
    for (int q : {int(Pool::kAll), pool}) {
      stats_.active[q].decrease(1);
      stats_.active_bytes[q].decrease(std::int64_t(rec.size));
    }
    if (planner_) planner_->on_free(rec.seq);
    if (rec.slab) {
      slabs_.deallocate(rec.slab, ptr);
      return;
    }
    if (rec.planned) {
      PlannedArena* a = arena_holding(ptr);
      CUARENA_ASSERT(a != nullptr, hex(ptr) + " planned but in no planned arena");
      if (Block* piece = a->free(ptr)) {  // a retired arena's last block in that piece
        give_back(piece, *a);
        if (!a->holds_memory())
          std::erase_if(draining_, [&](const auto& d) { return d.get() == a; });
      }
    } else {
      pool_.deallocate(rec.block);
    }
  }

  // --- Loop plans (config loop_plan) -----------------------------------------------------------

  /// Tells the planner about a request and serves it from the planned arena when the plan
  /// has a free place for it; 0 otherwise. Installs a plan the request completed. Caller holds
  /// mu_.
  DevicePtr planned(LiveBlock& rec, StreamId stream) {
    if (!planner_) return 0;
    const detail::Token token{rec.size, stream};
    rec.seq =
        planner_->on_allocate(token, std::size_t(stats_.allocated_bytes[int(Pool::kAll)].current));
    DevicePtr ptr = arena_ ? arena_->place(token, planner_->window()) : 0;
    if (ptr != 0 && !pool_.back_part(arena_->piece(ptr), ptr, rec.size, stream)) {
      arena_->unplace(ptr);  // no memory for this part now: the pool serves it (or reclaims)
      ptr = 0;
    }
    if (arena_ && arena_->quiet_visits() > checked_visits_) {  // the loop holds least now
      checked_visits_ = arena_->quiet_visits();
      if (arena_->trial() && !arena_->missed()) {
        back(*arena_, stream);
      } else if (!arena_->trial() && !trimmed_) {
        // One whole period served by the plan: what the pool still caches is memory the loop
        // no longer uses there (an older plan's range included, once its blocks are freed).
        // Given back once, waiting for the streams as back() does; requests the plan does not
        // hold take memory anew.
        trimmed_ = true;
        wait_and_release();
      }
    }
    // A plan that missed requests stays (the cursor finds its place again) until a longer
    // period repeats: the loop around the one planned.
    std::size_t phase = 0;
    if (!arena_ || arena_->missed()) {
      if (std::optional<detail::Plan> plan = planner_->take_plan(phase)) {
        if (arena_) retire(std::move(arena_));
        if (plan->live_peak != 0) {  // else nothing outlives its iteration: a longer loop may
          arena_ = std::make_unique<PlannedArena>(ctx_.backend, std::move(*plan), phase);
          checked_visits_ = 0;
        }
      }
    }
    rec.planned = ptr != 0;
    stats_.planned_allocations += rec.planned;
    return ptr;
  }

  /// Waits for every pending free and every stream's freed blocks, then releases what the pool
  /// caches (empty_cache()). Returns the bytes released. Caller holds mu_.
  std::size_t wait_and_release() {
    process_pending(true);
    pool_.synchronize();
    return pool_.release_cached();
  }

  /// Puts a plan that passed its trial in use over a lazy range (BlockPool::reserve_lazy):
  /// each part is backed when a block first lands there, with the memory the pool caches as
  /// the loop's older blocks die, so the range never stacks on top of that cache. Caller holds
  /// mu_.
  void back(PlannedArena& a, StreamId stream) {
    const std::size_t bytes = round_up(a.plan().bytes, kMinBlockSize);
    if (pool_.segment_mode()) {
      // A segment comes backed whole: give the cache back first (the loop holds least now).
      pool_.synchronize();
      pool_.release_cached();
    }
    Block* backing = pool_.reserve_lazy(bytes, stream);
    if (backing == nullptr) return;
    a.attach(backing);
    ++stats_.loop_plans;
    trimmed_ = false;
  }

  /// Stops placing in `a` and gives the pool every part of its range no live block uses; the
  /// rest comes back as its blocks are freed (give_back). Caller holds mu_.
  void retire(std::unique_ptr<PlannedArena> a) {
    for (Block* piece : a->carve(pool_, tuning::kLoopPlanCarveMinGap)) give_back(piece, *a);
    if (a->holds_memory()) draining_.push_back(std::move(a));
  }

  /// Frees a piece of a planned arena's backing into the pool once the work of every stream
  /// that had blocks in the arena has finished (events, as for a record_stream free). Caller
  /// holds mu_.
  void give_back(Block* b, const PlannedArena& a) {
    PendingFree pf{b->addr, LiveBlock{0, b->size, b->stream, nullptr, b, {}}, {}};
    pf.backing = true;
    for (StreamId s : a.streams()) {
      if (s == b->stream) continue;
      pf.events.push_back(ctx_.backend.record_event(s));
      ++stats_.events_recorded;
    }
    if (pf.events.empty())
      pool_.deallocate(b);
    else
      pending_.push_back(std::move(pf));
    trimmed_ = false;  // this range becomes cache: the next quiet point gives it back
  }

  PlannedArena* arena_holding(DevicePtr ptr) const {
    if (arena_ && arena_->contains(ptr)) return arena_.get();
    for (const auto& a : draining_) {
      if (a->contains(ptr)) return a.get();
    }
    return nullptr;
  }

  void process_pending(bool wait) {
    for (std::size_t i = 0; i < pending_.size();) {
      PendingFree& pf = pending_[i];
      bool done = true;
      for (EventId e : pf.events) {
        if (wait) ctx_.backend.wait_event(e);
        if (!ctx_.backend.event_completed(e)) {
          done = false;
          break;
        }
      }
      if (!done) {
        ++i;
        continue;
      }
      for (EventId e : pf.events) ctx_.backend.release_event(e);
      if (pf.backing)
        pool_.deallocate(pf.live.block);
      else
        finish_free(pf.ptr, pf.live);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
    stats_.pending_frees = std::int64_t(pending_.size());
  }

  /// The last resort before out of memory: finish every pending free and wait until every
  /// stream's free blocks may be reused or unmapped. (Empty slabs are never cached.)
  void reclaim() {
    ++stats_.num_alloc_retries;
    // Memory is short: a plan in use gives its range back (its live blocks' pieces once they
    // are freed). A plan on trial holds nothing and goes on learning.
    if (arena_ && !arena_->trial()) {
      planner_->forget();
      retire(std::move(arena_));
    }
    // Frees of other threads park while this waits: a second round gives those back too.
    for (int round = 0; round < 2; ++round) {
      if (!drain_caches() && round == 1) break;
      process_pending(true);
      pool_.synchronize();
    }
    // A segment backend cannot steal: give whole free segments back so a new one may fit.
    if (pool_.segment_mode()) pool_.release_cached();
  }

  OutOfMemoryError out_of_memory(std::size_t bytes, StreamId stream) {
    ++stats_.num_ooms;
    fold_caches();
    const int all = int(Pool::kAll);
    const auto reserved = std::size_t(stats_.reserved_bytes[all].current);
    const auto allocated = std::size_t(stats_.allocated_bytes[all].current);
    std::ostringstream msg;
    msg << "cuarena: out of memory: tried to allocate " << format_bytes(bytes) << " (" << bytes
        << " bytes) on stream " << hex(stream) << ". Device capacity "
        << format_bytes(ctx_.backend.capacity()) << ", limit " << format_bytes(ctx_.limit)
        << " (per_process_memory_fraction " << config_.per_process_memory_fraction
        << "); cuarena holds " << format_bytes(reserved) << " reserved, of which "
        << format_bytes(allocated) << " is allocated and " << format_bytes(reserved - allocated)
        << " is reserved but unallocated (after defragmentation). Free tensors, lower the batch "
           "size, or raise per_process_memory_fraction.";
    return OutOfMemoryError(msg.str(), bytes);
  }

  void sync_inactive() const {
    auto set = [](Stat& s, std::int64_t value) {
      if (value > s.current)
        s.increase(value - s.current);
      else if (value < s.current)
        s.decrease(s.current - value);
    };
    for (int p : {int(Pool::kAll), int(Pool::kSmall), int(Pool::kLarge)}) {
      set(stats_.inactive_split_bytes[p],
          stats_.reserved_bytes[p].current - stats_.active_bytes[p].current);
    }
    set(stats_.inactive_split[int(Pool::kAll)], std::int64_t(pool_.free_block_count()));
    set(stats_.inactive_split[int(Pool::kLarge)], std::int64_t(pool_.free_block_count()));
  }

  mutable std::mutex mu_;  // the device lock
  Config config_;
  mutable Stats stats_;  // mutable: readers fold the stream caches' deltas in first
  SizeClasses classes_;
  detail::Context ctx_;
  detail::BlockPool pool_;  // declared before slabs_: slabs return blocks to it on destruction
  detail::SlabArena slabs_;
  mutable detail::LiveTable live_;
  detail::StreamCaches caches_;
  std::vector<CachedBlock> drained_;                // drain scratch, under mu_; empty between calls
  mutable std::vector<detail::CacheDelta> deltas_;  // fold scratch, under mu_; empty between calls
  std::vector<PendingFree> pending_;
  std::unique_ptr<detail::LoopPlanner> planner_;  // config loop_plan
  std::unique_ptr<PlannedArena> arena_;           // the plan in use
  std::vector<std::unique_ptr<PlannedArena>> draining_;
  bool trimmed_ = false;            // the pool's cache was given back after the plan's first period
  std::size_t checked_visits_ = 0;  // arena_->periods() at the last period boundary seen
};

Allocator::Allocator(DeviceBackend& backend, Config config)
    : impl_(std::make_unique<Impl>(backend, std::move(config))) {}
Allocator::~Allocator() = default;
void* Allocator::allocate(std::size_t bytes, StreamId stream) {
  return impl_->allocate(bytes, stream);
}
void Allocator::deallocate(void* ptr) { impl_->deallocate(ptr); }
void Allocator::record_stream(void* ptr, StreamId stream) { impl_->record_stream(ptr, stream); }
bool Allocator::owns(const void* ptr) const { return impl_->owns(ptr); }
std::size_t Allocator::release_cached() { return impl_->release_cached(); }
void Allocator::process_events() { impl_->process_events(); }
Stats Allocator::stats() const { return impl_->stats(); }
void Allocator::reset_peak_stats() { impl_->reset_peak_stats(); }
const Config& Allocator::config() const { return impl_->config(); }
void Allocator::set_memory_fraction(double fraction) { impl_->set_memory_fraction(fraction); }
void Allocator::with_device_lock(const std::function<void()>& fn) { impl_->with_device_lock(fn); }
std::size_t Allocator::memory_limit() const { return impl_->limit(); }
std::vector<Allocator::BlockInfo> Allocator::live_blocks() const { return impl_->live_blocks(); }
std::optional<Allocator::BlockInfo> Allocator::find(const void* ptr) const {
  return impl_->find(ptr);
}
std::vector<Allocator::SegmentInfo> Allocator::segments() const { return impl_->segments(); }
Allocator::Fragmentation Allocator::fragmentation() const { return impl_->fragmentation(); }
Allocator::MemoryBreakdown Allocator::memory_breakdown() const { return impl_->memory_breakdown(); }
void Allocator::check_invariants() const { impl_->check_invariants(); }

}  // namespace cuarena
