// Allocator: the façade over BlockPool, SlabSet and the loop plans (PlanServer). It owns the
// device lock, the table of live allocations, the stream caches, frees waiting on events
// (PendingFrees), the statistics, and the out-of-memory path.
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
#include <bit>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "cuarena/size_classes.hpp"
#include "front/cache_returns.hpp"
#include "front/live_table.hpp"
#include "front/messages.hpp"
#include "front/pending_frees.hpp"
#include "front/segment_map.hpp"
#include "front/stat_updates.hpp"
#include "front/stream_cache.hpp"
#include "large/block_pool.hpp"
#include "plans/plan_server.hpp"
#include "slabs/slab_set.hpp"
#include "support/assert.hpp"

namespace cuarena {

using detail::Block;
using detail::CachedBlock;
using detail::hex;
using detail::LiveBlock;
using PendingFree = detail::PendingFrees::Entry;
using detail::Slab;
using detail::StreamCache;

namespace {
std::size_t limit_bytes(const DeviceBackend& backend, const Config& config) {
  const auto bytes =
      static_cast<std::size_t>(double(backend.capacity()) * config.per_process_memory_fraction);
  return bytes / backend.granularity() * backend.granularity();
}
}  // namespace

class Allocator::Impl final : private detail::PlanServer::Host {
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
                                      config_.defrag_threshold),
             {}},
        pool_(ctx_),
        slabs_(ctx_, pool_, classes_),
        returns_(caches_, stats_, slabs_, pool_),
        plans_(ctx_, pool_, *this),
        pending_(backend, stats_.events_recorded) {
    if (config_.slab_size < classes_.max_size()) {
      throw ConfigError("cuarena config: slab_size (" + std::to_string(config_.slab_size) +
                        ") must be at least the largest small class (" +
                        std::to_string(classes_.max_size()) + " bytes, from small_limit)");
    }
  }

  /// `cached_only`: nullptr where a block would have to be mapped, or one larger than
  /// `max_block` split (allocate_cached()). `alignment` above kMinBlockSize: the large pool only
  /// (allocate_aligned()). `isolated`: no device wait orders `stream` after another's free for
  /// it (allocate_isolated()).
  void* allocate(std::size_t bytes, StreamId stream, bool cached_only,
                 std::size_t max_block = SIZE_MAX, std::size_t alignment = kMinBlockSize,
                 bool isolated = false) {
    if (bytes == 0) return nullptr;
    const bool aligned = alignment > kMinBlockSize;
    const bool small = bytes <= config_.small_limit && !aligned;
    std::size_t cls = 0;
    LiveBlock rec{bytes, 0, stream, nullptr, nullptr, {}};
    if (small) {
      cls = classes_.index(bytes);
      rec.size = classes_.size(cls);
    } else if (bytes <= SIZE_MAX - kMinBlockSize) {
      rec.size = round_up(bytes, kMinBlockSize);
    }
    // Fast path: a block this stream parked while the device lock was taken.
    if (rec.size != 0 && !aligned) {
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
      const detail::CachedOnlyScope scope(ctx_, cached_only, max_block);
      if (!pending_.empty()) process_pending(false);
      // (A loop plan backs its range as it serves: not from the cache.)
      if (rec.size != 0 && !cached_only && !aligned && !isolated) ptr = plans_.serve(rec, stream);
      if (ptr != 0) {
        // served by the loop plan
      } else if (small) {
        ptr = slabs_.allocate(cls, stream, rec.slab);
        if (ptr == 0 && !cached_only) {
          reclaim();
          ptr = slabs_.allocate(cls, stream, rec.slab);
        }
      } else if (rec.size != 0) {
        if (ctx_.config.internal_dependencies && !cached_only && !isolated &&
            pool_.others_hold_frees(stream)) {
          // First from mapped memory; if that needs more, the other streams' frees, ordered
          // on the device.
          {
            const detail::CachedOnlyScope mapped_only(ctx_, true, SIZE_MAX);
            rec.block = pool_.try_allocate(rec.size, stream, alignment);
          }
          if (rec.block == nullptr && pool_.adopt_free(stream, rec.size, alignment))
            ++stats_.grow_stream_waits;
        }
        if (rec.block == nullptr && ctx_.config.wait_before_grow && !cached_only &&
            pool_.others_hold_frees(stream)) {
          // First without fresh memory; if that needs some, the other streams' frees may make
          // it unnecessary once the device has reached them.
          {
            const detail::GrowCeilingScope ceiling(ctx_, ctx_.reserved());
            rec.block = pool_.try_allocate(rec.size, stream, alignment);
          }
          if (rec.block == nullptr) {
            ++stats_.grow_waits;
            pool_.synchronize();
          }
        }
        if (rec.block == nullptr) rec.block = pool_.try_allocate(rec.size, stream, alignment);
        if (rec.block == nullptr && !cached_only && rec.size <= ctx_.limit) {  // else no wait helps
          reclaim();
          rec.block = pool_.try_allocate(rec.size, stream, alignment);
        }
        ptr = rec.block ? rec.block->addr : 0;
      }
      if (ptr == 0) {
        if (cached_only) return nullptr;
        throw out_of_memory(bytes, stream);
      }

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
    // Not under a loop plan: the planner must see every free, and the allocation that would take
    // a parked block back, in order (a parked free never reaches it).
    if (rec.uses.empty() && config_.stream_cache_bytes != 0 && !config_.loop_plan) {
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
      if (cache != nullptr && cache->maybe_nonempty()) returns_.drain(*cache);
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
      const std::vector<StreamId> uses = pf.live.uses;
      pending_.push(std::move(pf), uses);
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
    plans_.drop();
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
    detail::reset_peaks(stats_);
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
    ctx_.defrag_threshold_bytes =
        static_cast<std::size_t>(double(ctx_.limit) * config_.defrag_threshold);
  }

  void set_reservation_observer(std::function<void(const ReservationChange&)> observer) {
    std::lock_guard lock(mu_);
    if (!observer) {
      ctx_.on_reservation = nullptr;
      return;
    }
    ctx_.on_reservation = [f = std::move(observer)](std::int64_t bytes, DevicePtr address) {
      f(ReservationChange{bytes, address});
    };
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
      for (const PendingFree& pf : pending_.entries())
        used.push_back(
            {pf.ptr, pf.live.size, pf.live.requested, State::kPendingFree, pf.live.stream});
    }
    live_.for_each([&](DevicePtr ptr, const LiveBlock& rec) {
      used.push_back({ptr, rec.size, rec.requested, State::kAllocated, rec.stream});
    });
    return detail::segment_map(runs, used);
  }

  Fragmentation fragmentation() const {
    std::lock_guard lock(mu_);
    fold_caches();
    Fragmentation f;
    std::size_t slab_total = 0, slab_largest = 0;
    pool_.free_mapped_extents(f.free_bytes, f.largest_free);
    plans_.free_extents(f.free_bytes, f.largest_free);
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
      if (rec.planned)
        plans_.check_block(ptr, rec.size);
      else
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
    const std::size_t backings = pending_.backings();
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
    plans_.check_invariants();
  }

  bool drain_caches() { return returns_.drain_all(); }
  /// Folds the statistics changes of the fast path into stats_. Caller holds mu_.
  void fold_caches() const { returns_.fold(); }

  void finish_free(DevicePtr ptr, const LiveBlock& rec) {
    const int pool = int(rec.slab ? Pool::kSmall : Pool::kLarge);
    for (int q : {int(Pool::kAll), pool}) {
      stats_.active[q].decrease(1);
      stats_.active_bytes[q].decrease(std::int64_t(rec.size));
    }
    if (plans_.free(ptr, rec)) return;
    if (rec.slab)
      slabs_.deallocate(rec.slab, ptr);
    else
      pool_.deallocate(rec.block);
  }

  /// Caller holds mu_.
  std::size_t wait_and_release() override {
    process_pending(true);
    pool_.synchronize();
    return pool_.release_cached();
  }

  /// Caller holds mu_.
  void defer_backing_free(Block* piece, const std::vector<StreamId>& streams) override {
    PendingFree pf{piece->addr, LiveBlock{0, piece->size, piece->stream, nullptr, piece, {}}, {}};
    pf.backing = true;
    pending_.push(std::move(pf), streams);
  }

  /// Finishes the pending frees whose events have completed (all of them, waiting, when
  /// `wait`). Caller holds mu_.
  void process_pending(bool wait) {
    pending_.process(wait, [&](PendingFree& pf) {
      if (pf.backing)
        pool_.deallocate(pf.live.block);
      else
        finish_free(pf.ptr, pf.live);
    });
    stats_.pending_frees = std::int64_t(pending_.size());
  }

  /// The last resort before out of memory: finish every pending free and wait until every
  /// stream's free blocks may be reused or unmapped. (Empty slabs are never cached.)
  void reclaim() {
    ++stats_.num_alloc_retries;
    // Memory is short: a plan in use gives its range back (its live blocks' pieces once they
    // are freed). A plan on trial holds nothing and goes on learning.
    plans_.drop_backed();
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
    return OutOfMemoryError(detail::out_of_memory_message(bytes, stream, ctx_.backend.capacity(),
                                                          ctx_.limit, config_, stats_),
                            bytes);
  }

  void sync_inactive() const { detail::sync_inactive(stats_, pool_.free_block_count()); }

  mutable std::mutex mu_;  // the device lock
  Config config_;
  mutable Stats stats_;  // mutable: readers fold the stream caches' deltas in first
  SizeClasses classes_;
  detail::Context ctx_;
  detail::BlockPool pool_;  // declared before slabs_: slabs return blocks to it on destruction
  detail::SlabSet slabs_;
  mutable detail::LiveTable live_;
  detail::StreamCaches caches_;
  mutable detail::CacheReturns returns_;  // mutable: readers fold the caches in first
  detail::PlanServer plans_;              // config loop_plan
  detail::PendingFrees pending_;  // after plans_: its events are released before the arenas'
};

Allocator::Allocator(DeviceBackend& backend, Config config)
    : impl_(std::make_unique<Impl>(backend, std::move(config))) {}
// The observer is dropped first: whoever set it may be going away too.
Allocator::~Allocator() { impl_->set_reservation_observer(nullptr); }
void* Allocator::allocate(std::size_t bytes, StreamId stream) {
  return impl_->allocate(bytes, stream, /*cached_only=*/false);
}
namespace {
/// The public entry points' check, kept off allocate()'s path (its alignment is a constant).
void check_alignment(std::size_t bytes, std::size_t alignment) {
  if (!std::has_single_bit(alignment))
    throw std::invalid_argument("cuarena: allocate_aligned(" + std::to_string(bytes) + ", " +
                                std::to_string(alignment) +
                                "): the alignment must be a power of two");
}
}  // namespace
void* Allocator::allocate_aligned(std::size_t bytes, std::size_t alignment, StreamId stream) {
  check_alignment(bytes, alignment);
  return impl_->allocate(bytes, stream, /*cached_only=*/false, SIZE_MAX, alignment);
}
void* Allocator::allocate_isolated(std::size_t bytes, StreamId stream) {
  return impl_->allocate(bytes, stream, /*cached_only=*/false, SIZE_MAX, kMinBlockSize,
                         /*isolated=*/true);
}
void* Allocator::allocate_cached(std::size_t bytes, StreamId stream, std::size_t max_block,
                                 std::size_t alignment) {
  check_alignment(bytes, alignment);
  return impl_->allocate(bytes, stream, /*cached_only=*/true, max_block, alignment);
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
void Allocator::set_reservation_observer(std::function<void(const ReservationChange&)> observer) {
  impl_->set_reservation_observer(std::move(observer));
}
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
