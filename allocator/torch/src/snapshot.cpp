// Statistics and snapshots in PyTorch's structures (torch.cuda.memory_stats(),
// torch.cuda.memory._snapshot()), built from cuarena's own.
//
// A snapshot segment is a run of reserved memory mapped at consecutive addresses
// (Allocator::segments()); a private pool's segments are reported as their own segments, with
// the pool's id, and cut out of the main allocator's run that holds them.
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <map>

#include "torch_allocator_impl.hpp"

namespace cuarena::torch_adapter {

namespace {
void copy_stat(const Stat& from, const Stat& base, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated - base.allocated;
  to.freed = from.freed - base.freed;
}

void copy_array(const StatArray& from, const StatArray& base,
                c10::CachingAllocator::StatArray& to) {
  for (std::size_t i = 0; i < from.size(); ++i) copy_stat(from[i], base[i], to[i]);
}

using State = cuarena::Allocator::SegmentInfo::State;

CDA::BlockInfo block_info(std::size_t size, std::size_t requested, State state,
                          std::shared_ptr<c10::GatheredContext> ctx) {
  CDA::BlockInfo b;
  b.size = size;
  b.requested_size = requested;
  b.allocated = state == State::kAllocated;
  b.active = state != State::kInactive;
  b.context_when_allocated = std::move(ctx);
  return b;
}

/// Sums a segment's block figures into its totals.
void total_up(CDA::SegmentInfo& seg) {
  for (const CDA::BlockInfo& b : seg.blocks) {
    seg.total_size += b.size;
    seg.requested_size += b.requested_size;
    if (b.allocated) seg.allocated_size += b.size;
    if (b.active) seg.active_size += b.size;
  }
}
}  // namespace

CDA::DeviceStats to_device_stats(const Stats& s, const Stats& base) {
  CDA::DeviceStats d;
  copy_array(s.allocation, base.allocation, d.allocation);
  copy_array(s.segment, base.segment, d.segment);
  copy_array(s.active, base.active, d.active);
  copy_array(s.inactive_split, base.inactive_split, d.inactive_split);
  copy_array(s.allocated_bytes, base.allocated_bytes, d.allocated_bytes);
  copy_array(s.reserved_bytes, base.reserved_bytes, d.reserved_bytes);
  copy_array(s.active_bytes, base.active_bytes, d.active_bytes);
  copy_array(s.inactive_split_bytes, base.inactive_split_bytes, d.inactive_split_bytes);
  copy_array(s.requested_bytes, base.requested_bytes, d.requested_bytes);
  copy_stat(s.oversize_allocations, base.oversize_allocations, d.oversize_allocations);
  copy_stat(s.oversize_segments, base.oversize_segments, d.oversize_segments);
  d.num_alloc_retries = s.num_alloc_retries - base.num_alloc_retries;
  d.num_ooms = s.num_ooms - base.num_ooms;
  d.num_sync_all_streams = s.num_sync_all_streams - base.num_sync_all_streams;
  d.num_device_alloc = s.num_device_alloc - base.num_device_alloc;
  d.num_device_free = s.num_device_free - base.num_device_free;
  d.max_split_size = s.max_split_size;
  return d;
}

SnapshotInfo TorchAllocator::take_snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  SnapshotInfo info;
  const bool all = mempool_id == c10::MempoolId_t{0, 0};
  for (const auto& slot : devices_) {
    Device* d = slot.load(std::memory_order_acquire);
    if (d == nullptr) continue;
    // Pool segments by address: cut out of the main runs, reported on their own.
    std::map<DevicePtr, std::pair<c10::MempoolId_t, const PrivatePool::SegmentView*>> pooled;
    const auto pools = d->pools->segments();
    for (const auto& p : pools) {
      for (const auto& seg : p.segments) pooled[seg.addr] = {p.id, &seg};
    }
    for (const auto& [addr, entry] : pooled) {
      const auto& [id, seg] = entry;
      if (!all && id != mempool_id) continue;
      CDA::SegmentInfo out;
      out.device = d->index;
      out.address = seg->addr;
      out.stream = reinterpret_cast<decltype(out.stream)>(seg->stream);
      out.is_large = true;
      out.owner_private_pool_id = id;
      for (const auto& b : seg->blocks) {
        out.blocks.push_back(block_info(b.size, b.requested,
                                        b.allocated ? State::kAllocated : State::kInactive,
                                        b.allocated ? history_.context_of(b.addr) : nullptr));
      }
      total_up(out);
      info.segments.push_back(std::move(out));
    }
    if (!all) continue;
    for (const cuarena::Allocator::SegmentInfo& run : d->main->segments()) {
      CDA::SegmentInfo out;
      auto flush = [&] {
        if (out.blocks.empty()) return;
        total_up(out);
        info.segments.push_back(std::move(out));
        out = CDA::SegmentInfo{};
      };
      for (const auto& piece : run.blocks) {
        if (pooled.count(piece.addr) != 0) {
          flush();
          continue;
        }
        if (out.blocks.empty()) {
          out.device = d->index;
          out.address = piece.addr;
          out.stream = reinterpret_cast<decltype(out.stream)>(run.stream);
          out.is_large = true;
        }
        out.blocks.push_back(block_info(
            piece.size, piece.requested, piece.state,
            piece.state == State::kInactive ? nullptr : history_.context_of(piece.addr)));
      }
      flush();
    }
  }
  std::sort(info.segments.begin(), info.segments.end(),
            [](const CDA::SegmentInfo& a, const CDA::SegmentInfo& b) {
              return a.device != b.device ? a.device < b.device : a.address < b.address;
            });
  if (include_traces) {
    info.device_traces = history_.traces(std::max(device_count_.load(), 1));
    info.external_annotations = history_.annotations();
  }
  AllocatorConfigInfo& c = info.config_metadata;
  c.garbage_collection_threshold = 0;
  c.max_split_size = std::numeric_limits<size_t>::max();
  c.pinned_num_register_threads = 1;
  c.expandable_segments = false;
  c.release_lock_on_malloc = false;
  c.pinned_use_host_register = false;
  c.last_allocator_settings = "backend:cuarena," + config_.to_string();
  fill_newer_config(c);
  return info;
}

}  // namespace cuarena::torch_adapter
