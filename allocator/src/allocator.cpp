// Allocator: the façade over BlockPool and SlabArena. It owns the lock, the table of live
// allocations, frees waiting on record_stream events, the statistics, and the out-of-memory path.
//
// Invariants kept here: `live_` holds exactly the allocations handed out and not yet freed;
// `pending_` holds freed allocations whose record_stream events have not all completed, and
// their memory is still allocated in the pool/slab; allocation/allocated_bytes/requested_bytes
// count `live_`, active/active_bytes count `live_` plus `pending_`.
#include "cuarena/allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "block_pool.hpp"
#include "cuarena/size_classes.hpp"
#include "slab_arena.hpp"

namespace cuarena {

using detail::Block;
using detail::Slab;

namespace {
std::string hex(DevicePtr p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

std::size_t memory_limit(const DeviceBackend& backend, const Config& config) {
  const auto bytes = static_cast<std::size_t>(double(backend.capacity()) *
                                              config.per_process_memory_fraction);
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
             memory_limit(backend, config_),
             static_cast<std::size_t>(double(memory_limit(backend, config_)) *
                                      config_.defrag_threshold)},
        pool_(ctx_),
        slabs_(ctx_, pool_, classes_) {
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
    std::lock_guard lock(mu_);
    if (!pending_.empty()) process_pending(false);
    Live rec{bytes, 0, stream, nullptr, nullptr, {}};
    DevicePtr ptr = 0;
    const bool small = bytes <= config_.small_limit;
    if (small) {
      const std::size_t cls = classes_.index(bytes);
      rec.size = classes_.size(cls);
      ptr = slabs_.allocate(cls, stream, rec.slab);
      if (ptr == 0) {
        reclaim();
        ptr = slabs_.allocate(cls, stream, rec.slab);
      }
    } else {
      if (bytes <= SIZE_MAX - kMinBlockSize) {
        rec.size = round_up(bytes, kMinBlockSize);
        rec.block = pool_.try_allocate(rec.size, stream);
        if (rec.block == nullptr && rec.size <= ctx_.limit) {  // else no wait can help
          reclaim();
          rec.block = pool_.try_allocate(rec.size, stream);
        }
      }
      ptr = rec.block ? rec.block->addr : 0;
    }
    if (ptr == 0) throw out_of_memory(bytes, stream);

    const int pool = int(small ? Pool::kSmall : Pool::kLarge);
    for (int p : {int(Pool::kAll), pool}) {
      stats_.allocation[p].increase(1);
      stats_.active[p].increase(1);
      stats_.allocated_bytes[p].increase(std::int64_t(rec.size));
      stats_.active_bytes[p].increase(std::int64_t(rec.size));
      stats_.requested_bytes[p].increase(std::int64_t(rec.requested));
    }
    live_.emplace(ptr, std::move(rec));
    sync_inactive();
    return reinterpret_cast<void*>(ptr);
  }

  void deallocate(void* p) {
    if (p == nullptr) return;
    std::lock_guard lock(mu_);
    const auto ptr = reinterpret_cast<DevicePtr>(p);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      throw InvalidPointerError("cuarena: deallocate(" + hex(ptr) +
                                "): not a live allocation of this allocator (never allocated "
                                "here, or already freed)");
    }
    Live rec = std::move(it->second);
    live_.erase(it);
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
    std::lock_guard lock(mu_);
    const auto ptr = reinterpret_cast<DevicePtr>(p);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      throw InvalidPointerError("cuarena: record_stream(" + hex(ptr) +
                                "): not a live allocation of this allocator");
    }
    Live& rec = it->second;
    if (stream != rec.stream && std::find(rec.uses.begin(), rec.uses.end(), stream) == rec.uses.end())
      rec.uses.push_back(stream);
  }

  bool owns(const void* p) const {
    std::lock_guard lock(mu_);
    return pool_.owns(reinterpret_cast<DevicePtr>(p));
  }

  std::size_t release_cached() {
    std::lock_guard lock(mu_);
    process_pending(true);
    pool_.synchronize();
    const std::size_t bytes = pool_.release_cached();
    sync_inactive();
    return bytes;
  }

  void process_events() {
    std::lock_guard lock(mu_);
    process_pending(false);
    pool_.poll_sweeps();
    pool_.record_sweeps();
    sync_inactive();
  }

  Stats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }

  void reset_peak_stats() {
    std::lock_guard lock(mu_);
    for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                         &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                         &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      for (Stat& s : *a) s.reset_peak();
    }
  }

  const Config& config() const { return config_; }

  std::vector<BlockInfo> live_blocks() const {
    std::lock_guard lock(mu_);
    std::vector<BlockInfo> out;
    out.reserve(live_.size());
    for (const auto& [ptr, rec] : live_)
      out.push_back({ptr, rec.requested, rec.size, rec.stream, rec.slab != nullptr});
    return out;
  }

  Fragmentation fragmentation() const {
    std::lock_guard lock(mu_);
    Fragmentation f;
    std::size_t slab_total = 0, slab_largest = 0;
    pool_.free_mapped_extents(f.free_bytes, f.largest_free);
    slabs_.free_extents(slab_total, slab_largest);
    f.free_bytes += slab_total;
    f.largest_free = std::max(f.largest_free, slab_largest);
    const auto& all = int(Pool::kAll);
    f.rounding_waste =
        std::size_t(stats_.allocated_bytes[all].current - stats_.requested_bytes[all].current);
    return f;
  }

  MemoryBreakdown memory_breakdown() const {
    std::lock_guard lock(mu_);
    const detail::BlockPool::Breakdown b = pool_.breakdown();
    std::size_t slab_free = 0, largest = 0;
    slabs_.free_extents(slab_free, largest);
    return {b.allocated, slab_free, b.owned, b.shared, b.retired, b.idle};
  }

  void check_invariants() const {
    std::lock_guard lock(mu_);
    pool_.check_invariants();
    slabs_.check_invariants();
    std::int64_t bytes = 0, requested = 0;
    for (const auto& [ptr, rec] : live_) {
      bytes += std::int64_t(rec.size);
      requested += std::int64_t(rec.requested);
      if (rec.slab) {
        const Slab& s = *rec.slab;
        if (ptr < s.base() || ptr + rec.size > s.base() + std::size_t(s.slots) * s.slot_size)
          throw std::logic_error("cuarena invariant violated: " + hex(ptr) + " outside its slab");
      } else if (!rec.block->allocated || rec.block->addr != ptr || rec.block->size != rec.size) {
        throw std::logic_error("cuarena invariant violated: " + hex(ptr) + " block mismatch");
      }
    }
    const int all = int(Pool::kAll);
    if (stats_.allocation[all].current != std::int64_t(live_.size()) ||
        stats_.allocated_bytes[all].current != bytes ||
        stats_.requested_bytes[all].current != requested)
      throw std::logic_error("cuarena invariant violated: statistics disagree with live blocks");
    if (stats_.active[all].current != std::int64_t(live_.size() + pending_.size()))
      throw std::logic_error("cuarena invariant violated: active count disagrees");
    if (stats_.reserved_bytes[int(Pool::kSmall)].current != std::int64_t(slabs_.slab_bytes()))
      throw std::logic_error("cuarena invariant violated: small_pool reserved != slab bytes");
  }

 private:
  struct Live {
    std::size_t requested;
    std::size_t size;
    StreamId stream;
    Slab* slab;
    Block* block;
    std::vector<StreamId> uses;  // other streams from record_stream()
  };
  struct PendingFree {
    DevicePtr ptr;
    Live live;
    std::vector<EventId> events;
  };

  void finish_free(DevicePtr ptr, const Live& rec) {
    const int pool = int(rec.slab ? Pool::kSmall : Pool::kLarge);
    for (int q : {int(Pool::kAll), pool}) {
      stats_.active[q].decrease(1);
      stats_.active_bytes[q].decrease(std::int64_t(rec.size));
    }
    if (rec.slab) {
      slabs_.deallocate(rec.slab, ptr);
    } else {
      pool_.deallocate(rec.block);
    }
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
    process_pending(true);
    pool_.synchronize();
    // A segment backend cannot steal: give whole free segments back so a new one may fit.
    if (pool_.segment_mode()) pool_.release_cached();
  }

  OutOfMemoryError out_of_memory(std::size_t bytes, StreamId stream) {
    ++stats_.num_ooms;
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

  void sync_inactive() {
    auto set = [](Stat& s, std::int64_t value) {
      if (value > s.current) s.increase(value - s.current);
      else if (value < s.current) s.decrease(s.current - value);
    };
    for (int p : {int(Pool::kAll), int(Pool::kSmall), int(Pool::kLarge)}) {
      set(stats_.inactive_split_bytes[p],
          stats_.reserved_bytes[p].current - stats_.active_bytes[p].current);
    }
    set(stats_.inactive_split[int(Pool::kAll)], std::int64_t(pool_.free_block_count()));
    set(stats_.inactive_split[int(Pool::kLarge)], std::int64_t(pool_.free_block_count()));
  }

  mutable std::mutex mu_;
  Config config_;
  Stats stats_;
  SizeClasses classes_;
  detail::Context ctx_;
  detail::BlockPool pool_;  // declared before slabs_: slabs return blocks to it on destruction
  detail::SlabArena slabs_;
  std::unordered_map<DevicePtr, Live> live_;
  std::vector<PendingFree> pending_;
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
std::vector<Allocator::BlockInfo> Allocator::live_blocks() const { return impl_->live_blocks(); }
Allocator::Fragmentation Allocator::fragmentation() const { return impl_->fragmentation(); }
Allocator::MemoryBreakdown Allocator::memory_breakdown() const {
  return impl_->memory_breakdown();
}
void Allocator::check_invariants() const { impl_->check_invariants(); }

}  // namespace cuarena
