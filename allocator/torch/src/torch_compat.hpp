// torch_compat: every difference between the torch minors the adapter supports, in one place.
//
// `CUARENA_TORCH_MINOR` (2.x's x) comes from CMake, which read it from the installed torch and
// refused one outside [kOldestMinor, kNewestMinor]. Nothing else in the adapter tests it:
//
//  - `CDA::` names the trace and snapshot types wherever that minor declares them (torch 2.11
//    moved them from c10::cuda::CUDACachingAllocator to c10::CachingDeviceAllocator);
//  - `VersionedAllocator` declares each CUDAAllocator virtual whose signature or existence
//    differs between minors with that minor's signature, and forwards it to one version-neutral
//    member TorchAllocator implements (`take_snapshot`, `create_or_incref_pool`, ...);
//  - a few helpers fill the fields later minors added to torch's structures.
//
// What each minor changed, as read from its wheel's c10/cuda/CUDACachingAllocator.h and
// c10/core/CachingDeviceAllocator.h:
//   2.9  CUDAAllocator derives from c10::DeviceAllocator; MempoolId_t moves from c10::cuda to c10.
//   2.10 getExpandableSegmentSizes, setNoSplit, set/getUserMetadata, getMemoryInfo; TraceEntry
//        user_metadata.
//   2.11 trace types move to c10::CachingDeviceAllocator; snapshot(pool, include_traces);
//        createOrIncrefPool takes a shared_ptr; setUseOnOOM(.., bool); recordHistory(.., skip).
//   2.12 attachOomRejectionObserver (pure), getContextForPointer; DeviceStats num_oom_rejections.
//   2.13 markCaptureBegin/End; DeviceStats reserved_bytes_by_private_pools; AllocatorConfigInfo
//        max_round_threshold, max_cached_size.
//   2.14 supportsUserMetadata, annotateMemory (TraceEntry::ANNOTATE).
//   2.15 nothing the adapter implements (expandable-segment reserve classes are free functions
//        of PyTorch's own allocator).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#ifndef CUARENA_TORCH_MINOR
#error "CUARENA_TORCH_MINOR must be defined (allocator/torch/CMakeLists.txt sets it)"
#endif

#if CUARENA_TORCH_MINOR < 9
namespace c10 {  // where 2.9 moved them to (2.9 and later keep these names in c10::cuda too)
using cuda::CaptureId_t;
using cuda::MempoolId_t;
}  // namespace c10
#endif

namespace cuarena::torch_adapter {

inline constexpr int kTorchMinor = CUARENA_TORCH_MINOR;
inline constexpr int kOldestMinor = 8;   // as CUARENA_TORCH_MINORS in the top-level CMakeLists.txt
inline constexpr int kNewestMinor = 15;  // ditto
static_assert(kTorchMinor >= kOldestMinor && kTorchMinor <= kNewestMinor,
              "the adapter supports torch 2.8 to 2.15");

/// The trace and snapshot types, wherever this minor declares them.
namespace CDA {
using c10::CachingDeviceAllocator::DeviceStats;
#if CUARENA_TORCH_MINOR >= 11
using c10::CachingDeviceAllocator::AllocatorTraceTracker;
using c10::CachingDeviceAllocator::AnnotationEntry;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::CreateContextFn;
using c10::CachingDeviceAllocator::parseTraceEntryAction;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::TraceEntry;
#else
using c10::cuda::CUDACachingAllocator::AllocatorTraceTracker;
using c10::cuda::CUDACachingAllocator::AnnotationEntry;
using c10::cuda::CUDACachingAllocator::BlockInfo;
using c10::cuda::CUDACachingAllocator::CreateContextFn;
using c10::cuda::CUDACachingAllocator::RecordContext;
using c10::cuda::CUDACachingAllocator::SegmentInfo;
using c10::cuda::CUDACachingAllocator::TraceEntry;
/// recordHistory's skip_actions arrive from 2.11 on only, so this is never reached before.
inline TraceEntry::Action parseTraceEntryAction(const std::string& name) {
  TORCH_CHECK(false, "cuarena: skipping trace action '", name, "' needs torch 2.11 or later");
}
#endif
}  // namespace CDA

/// Whether this minor has the post-facto "annotate" trace action (2.14 and later).
inline constexpr bool kTraceAnnotate = kTorchMinor >= 14;

/// A TraceEntry with `user_metadata` where this minor's TraceEntry has room for it.
inline CDA::TraceEntry make_trace_entry(CDA::TraceEntry::Action action, c10::DeviceIndex device,
                                        std::size_t addr, std::size_t size, void* stream,
                                        c10::MempoolId_t pool, c10::approx_time_t time,
                                        std::shared_ptr<c10::GatheredContext> context,
                                        [[maybe_unused]] const std::string& user_metadata) {
  CDA::TraceEntry entry(action, device, addr, size, static_cast<cudaStream_t>(stream), pool, time,
                        std::move(context));
#if CUARENA_TORCH_MINOR >= 10
  entry.user_metadata_ = user_metadata;
#endif
  return entry;
}

/// The ANNOTATE action (2.14 and later); only called where kTraceAnnotate.
inline CDA::TraceEntry::Action annotate_action() {
#if CUARENA_TORCH_MINOR >= 14
  return CDA::TraceEntry::Action::ANNOTATE;
#else
  return CDA::TraceEntry::Action::SNAPSHOT;  // unreachable: callers check kTraceAnnotate
#endif
}

/// Called with (device, requested bytes, bytes allocated, device total) when a request is
/// refused up front (throw_on_cudamalloc_oom); torch's OomRejectionObserver from 2.12.
using OomRejectionFn = std::function<void(int64_t, std::size_t, std::size_t, std::size_t)>;

/// PyTorch's throw_on_cudamalloc_oom (2.12 and later; false before): refuse a request that the
/// device cannot back before trying to reclaim memory for it.
inline bool throw_on_oom_setting() {
#if CUARENA_TORCH_MINOR >= 12
  return c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::throw_on_cudamalloc_oom();
#else
  return false;
#endif
}

/// Per-pool reserved bytes, as `fill_newer_stats` wants them.
struct PoolReserved {
  c10::MempoolId_t id;
  c10::CachingAllocator::StatArray reserved;
};

/// The DeviceStats fields later minors added: num_oom_rejections (2.12),
/// reserved_bytes_by_private_pools (2.13). A no-op where this minor lacks them.
inline void fill_newer_stats([[maybe_unused]] CDA::DeviceStats& d,
                             [[maybe_unused]] int64_t oom_rejections,
                             [[maybe_unused]] const std::vector<PoolReserved>& pools) {
#if CUARENA_TORCH_MINOR >= 12
  d.num_oom_rejections = oom_rejections;
#endif
#if CUARENA_TORCH_MINOR >= 13
  for (const PoolReserved& p : pools) d.reserved_bytes_by_private_pools[p.id] = p.reserved;
#endif
}

/// The AllocatorConfigInfo fields later minors added: graph_capture_record_stream_reuse (2.9;
/// cuarena never reuses a block freed during capture before the capture ends), and the pinned
/// host allocator's max_round_threshold and max_cached_size (2.13; PyTorch's own settings).
inline void fill_newer_config(
    [[maybe_unused]] c10::cuda::CUDACachingAllocator::AllocatorConfigInfo& c) {
#if CUARENA_TORCH_MINOR >= 9
  c.graph_capture_record_stream_reuse = false;
#endif
#if CUARENA_TORCH_MINOR >= 13
  c.max_round_threshold =
      c10::CachingAllocator::AcceleratorAllocatorConfig::pinned_max_round_threshold();
  c.max_cached_size = c10::CachingAllocator::AcceleratorAllocatorConfig::pinned_max_cached_size();
#endif
}

/// CUDAAllocator with this minor's signatures for the virtuals that differ between minors, each
/// forwarded to a version-neutral member. TorchAllocator implements the neutral members and the
/// virtuals every supported minor declares alike.
class VersionedAllocator : public c10::cuda::CUDACachingAllocator::CUDAAllocator {
 public:
  using SnapshotInfo = c10::cuda::CUDACachingAllocator::SnapshotInfo;
  using CUDAAllocator = c10::cuda::CUDACachingAllocator::CUDAAllocator;

  // --- The version-neutral members ---------------------------------------------------------
  virtual SnapshotInfo take_snapshot(c10::MempoolId_t pool, bool include_traces) = 0;
  /// `allocator`: the allocator the MemPool was created with, or nullptr.
  virtual void create_or_incref_pool(c10::DeviceIndex device, c10::MempoolId_t pool,
                                     const CUDAAllocator* allocator) = 0;
  virtual void set_use_on_oom(c10::DeviceIndex device, c10::MempoolId_t pool, bool use) = 0;
  virtual void set_no_split(c10::DeviceIndex device, c10::MempoolId_t pool) = 0;
  virtual void record_history(bool enabled, CDA::CreateContextFn recorder, std::size_t max_entries,
                              CDA::RecordContext when, bool clear,
                              const std::vector<std::string>& skip_actions) = 0;
  virtual void add_oom_rejection_observer(OomRejectionFn observer) = 0;
  /// The stack recorded when the live allocation at `ptr` was made, or nullptr.
  virtual std::shared_ptr<c10::GatheredContext> context_for(const void* ptr) = 0;
  /// The calling thread's metadata for trace entries (_set_memory_metadata).
  virtual void set_user_metadata(const std::string& metadata) = 0;
  virtual std::string user_metadata() = 0;
  /// Records an "annotate" trace entry for the live allocation at `ptr`.
  virtual void annotate_memory(const void* ptr, const std::string& metadata) = 0;
  /// (free, total) device bytes, as cudaMemGetInfo.
  virtual std::pair<std::size_t, std::size_t> memory_info(c10::DeviceIndex device) = 0;

  // --- This minor's signatures ---------------------------------------------------------------
#if CUARENA_TORCH_MINOR >= 11
  SnapshotInfo snapshot(c10::MempoolId_t pool = {0, 0}, bool include_traces = true) final {
    return take_snapshot(pool, include_traces);
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                          std::shared_ptr<CUDAAllocator> allocator = nullptr) final {
    create_or_incref_pool(device, pool, allocator.get());
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t pool, bool use) final {
    set_use_on_oom(device, pool, use);
  }
  void recordHistory(bool enabled, CDA::CreateContextFn recorder, std::size_t max_entries,
                     CDA::RecordContext when, bool clear,
                     const std::vector<std::string>& skip_actions) final {
    record_history(enabled, recorder, max_entries, when, clear, skip_actions);
  }
#else
  SnapshotInfo snapshot(c10::MempoolId_t pool = {0, 0}) final { return take_snapshot(pool, true); }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                          CUDAAllocator* allocator = nullptr) final {
    create_or_incref_pool(device, pool, allocator);
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t pool) final {
    set_use_on_oom(device, pool, true);
  }
  void recordHistory(bool enabled, CDA::CreateContextFn recorder, std::size_t max_entries,
                     CDA::RecordContext when, bool clear) final {
    record_history(enabled, recorder, max_entries, when, clear, {});
  }
#endif
#if CUARENA_TORCH_MINOR >= 10
  std::vector<c10::cuda::CUDACachingAllocator::StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex) final {
    return {};  // cuarena has no expandable segments: it maps granules wherever they are needed
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t pool) final {
    set_no_split(device, pool);
  }
  void setUserMetadata(const std::string& metadata) final { set_user_metadata(metadata); }
  std::string getUserMetadata() final { return user_metadata(); }
  std::pair<std::size_t, std::size_t> getMemoryInfo(c10::DeviceIndex device) final {
    return memory_info(device);
  }
#endif
#if CUARENA_TORCH_MINOR >= 12
  void attachOomRejectionObserver(c10::cuda::CUDACachingAllocator::OomRejectionObserver o) final {
    add_oom_rejection_observer(std::move(o));
  }
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) final {
    return context_for(ptr);
  }
#endif
#if CUARENA_TORCH_MINOR >= 14
  bool supportsUserMetadata() final { return true; }
  void annotateMemory(const void* ptr, const std::string& metadata) final {
    annotate_memory(ptr, metadata);
  }
#endif
};

}  // namespace cuarena::torch_adapter
