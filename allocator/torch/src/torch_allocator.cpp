// TorchAllocator: the CUDAAllocator virtuals, each a short routing over CudaAllocators (one
// cuarena::Allocator per device), PrivatePools and History. See torch_allocator.hpp.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "torch_allocator_impl.hpp"

namespace cuarena::torch_adapter {

namespace {
std::atomic<TorchAllocator*> g_self{nullptr};  // for the raw deleter; never freed

void raw_free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  try {
    g_self.load(std::memory_order_acquire)->free(ptr);
  } catch (const std::exception& e) {
    // A deleter must not throw. At exit the CUDA runtime may be unloading before the last
    // tensors go; their memory goes with the process, so that is not worth a word.
    const std::string what = e.what();
    if (what.find("unloading") == std::string::npos &&
        what.find("shutting down") == std::string::npos)
      std::fprintf(stderr, "cuarena: freeing %p failed: %s\n", ptr, what.c_str());
  }
}

cudaStream_t as_stream(StreamId s) { return reinterpret_cast<cudaStream_t>(s); }
StreamId as_id(cudaStream_t s) { return reinterpret_cast<StreamId>(s); }

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

std::string bytes_text(std::size_t bytes) { return format_bytes(bytes); }

/// The device's monitor page: its UUID, and free memory as the driver reports it. The callable
/// runs on the publisher's thread, which captures nothing: relaxed capture mode, so that its
/// cudaMemGetInfo never invalidates a global-mode capture on another thread.
std::unique_ptr<monitor::MonitorPublisher> start_monitor(c10::DeviceIndex index,
                                                         const cuarena::Allocator& main) {
  monitor::MonitorPublisher::Options o;
  o.kind = monitor::PageKind::kTorch;
  o.device = index;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess)
    o.device_uuid = monitor::format_gpu_uuid(prop.uuid.bytes);
  else
    (void)cudaGetLastError();  // no UUID then; not the program's error
  o.device_memory = [index](const Stats&) {
    static thread_local const bool relaxed = [] {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      return cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    }();
    std::size_t free = 0, total = 0;
    if (!relaxed || cudaSetDevice(index) != cudaSuccess ||
        cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return monitor::DeviceMemory{};
    }
    return monitor::DeviceMemory{std::int64_t(free), std::int64_t(total)};
  };
  return std::make_unique<monitor::MonitorPublisher>(main, std::move(o));
}
}  // namespace

TorchAllocator::TorchAllocator(Config config) : config_(config), allocators_(config) {
  g_self.store(this, std::memory_order_release);
}

// --- Per-device state --------------------------------------------------------------------------

TorchAllocator::Device& TorchAllocator::device(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < CudaAllocators::kMaxDevices, "cuarena: invalid device ",
              int(index));
  Device* d = devices_[std::size_t(index)].load(std::memory_order_acquire);
  if (d != nullptr) return *d;
  std::lock_guard lock(create_mu_);
  d = devices_[std::size_t(index)].load(std::memory_order_relaxed);
  if (d != nullptr) return *d;
  c10::cuda::CUDAGuard guard(index);
  auto owned = std::make_unique<Device>();
  owned->index = index;
  owned->main = &allocators_.allocator(index);
  // Read at first use, not at install: PyTorch parses its settings once, and the Python
  // package removes cuarena's own keys from them between install and CUDA's initialisation.
  owned->reject_unbackable = throw_on_oom_setting();
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&owned->segment_stream, cudaStreamNonBlocking));
  cuarena::Allocator* main = owned->main;
  const StreamId seg_stream = as_id(owned->segment_stream);
  owned->pools = std::make_unique<PrivatePools>(PrivatePool::Upstream{
      [main, seg_stream](std::size_t bytes) -> DevicePtr {
        try {
          // Isolated: the pool hands its blocks to streams the main allocator never sees.
          return reinterpret_cast<DevicePtr>(main->allocate_isolated(bytes, seg_stream));
        } catch (const OutOfMemoryError&) {
          return 0;
        }
      },
      [main](DevicePtr ptr, std::size_t) { main->deallocate(reinterpret_cast<void*>(ptr)); }});
  // Reserved memory into the allocation history: snapshots and CUARENA_TRACE recordings then
  // carry cuarena's own segments (memory_viz's timeline, the replayer's `recorded` row).
  main->set_reservation_observer([this, index](const cuarena::Allocator::ReservationChange& c) {
    history_.record_reservation(index, std::size_t(c.address), c.bytes);
  });
  if (monitor::monitor_enabled()) owned->monitor = start_monitor(index, *owned->main);
  d = owned.get();
  owned_devices_.push_back(std::move(owned));
  devices_[std::size_t(index)].store(d, std::memory_order_release);
  return *d;
}

TorchAllocator::Device* TorchAllocator::existing(c10::DeviceIndex index) const {
  if (index < 0 || index >= CudaAllocators::kMaxDevices) return nullptr;
  return devices_[std::size_t(index)].load(std::memory_order_acquire);
}

bool TorchAllocator::any_context() const {
  for (const auto& d : devices_) {
    const Device* p = d.load(std::memory_order_acquire);
    if (p != nullptr && p->pools->any_context()) return true;
  }
  return false;
}

// --- Allocation --------------------------------------------------------------------------------

c10::DataPtr TorchAllocator::allocate(size_t nbytes) {
  const c10::DeviceIndex dev = c10::cuda::current_device();
  void* ptr = malloc(dev, nbytes, c10::cuda::getCurrentCUDAStream(dev).stream());
  return {ptr, ptr, &raw_free, c10::Device(c10::DeviceType::CUDA, dev)};
}

c10::DeleterFnPtr TorchAllocator::raw_deleter() const { return &raw_free; }

void* TorchAllocator::raw_alloc(size_t nbytes) {
  const c10::DeviceIndex dev = c10::cuda::current_device();
  return malloc(dev, nbytes, c10::cuda::getCurrentCUDAStream(dev).stream());
}

void* TorchAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  return malloc(c10::cuda::current_device(), nbytes, stream);
}

void TorchAllocator::raw_delete(void* ptr) { free(ptr); }

void* TorchAllocator::malloc(c10::DeviceIndex dev, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  Device& d = device(dev);
  void* ptr = nullptr;
  c10::MempoolId_t pool{0, 0};
  if (d.pools->any_context()) {
    // Event queries and driver calls are "unsafe" while a global-mode capture runs anywhere;
    // relaxed mode lets this thread make them (as PyTorch's allocator does around cudaMalloc).
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    if (auto routed = d.pools->allocate(bytes, stream)) {
      ptr = routed->ptr;
      pool = routed->pool;
    } else {
      ptr = main_allocate(d, bytes, stream, pool);
    }
  } else {
    ptr = main_allocate(d, bytes, stream, pool);
  }
  history_.record(History::Action::ALLOC, dev, reinterpret_cast<std::size_t>(ptr), bytes, stream,
                  pool);
  return ptr;
}

void* TorchAllocator::main_allocate(Device& d, std::size_t bytes, cudaStream_t stream,
                                    c10::MempoolId_t& pool) {
  if (d.reject_unbackable && !can_back(d, bytes)) reject(d, bytes);
  try {
    return d.main->allocate(bytes, as_id(stream));
  } catch (const OutOfMemoryError& e) {
    if (auto routed = d.pools->allocate_on_oom(bytes, stream)) {
      pool = routed->pool;
      return routed->ptr;
    }
    out_of_memory(d, bytes, e.what());
  }
}

void TorchAllocator::free(void* ptr) {
  const bool contexts = any_context();
  std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed;
  if (contexts) relaxed.emplace(cudaStreamCaptureModeRelaxed);
  const int dev = allocators_.device_of(ptr);
  TORCH_CHECK(dev >= 0, "cuarena: free of ", ptr, ", which cuarena did not allocate");
  Device& d = device(c10::DeviceIndex(dev));
  std::size_t size = 0;
  cudaStream_t stream = nullptr;
  c10::MempoolId_t pool{0, 0};
  if (d.pools->any_pool() && d.pools->deallocate(ptr, &pool)) {
    // a pool block: pool memory is reused only inside the pool
  } else if (!contexts && !history_.wanted()) {
    d.main->deallocate(ptr);  // the common case: no look-up beyond the core's own
    return;
  } else {
    const auto info = d.main->find(ptr);
    TORCH_CHECK(info.has_value(), "cuarena: free of ", ptr,
                ", which is not a live allocation (double free?)");
    size = info->requested;
    stream = as_stream(info->stream);
    if (contexts && capturing(stream)) {
      // Its stream is being captured: a sweep event cannot be recorded there. Free it once the
      // capture is over (PyTorch defers the events of such frees the same way).
      std::lock_guard lock(d.deferred_mu);
      d.deferred.push_back(ptr);
      history_.record(History::Action::FREE_REQUESTED, d.index, reinterpret_cast<std::size_t>(ptr),
                      size, stream, pool);
      return;
    }
    d.main->deallocate(ptr);
  }
  history_.forget(reinterpret_cast<std::size_t>(ptr));
  if (history_.wanted()) {
    for (auto action : {History::Action::FREE_REQUESTED, History::Action::FREE_COMPLETED})
      history_.record(action, d.index, reinterpret_cast<std::size_t>(ptr), size, stream, pool);
  }
}

void TorchAllocator::flush_deferred(Device& d) {
  std::vector<void*> ptrs;
  {
    std::lock_guard lock(d.deferred_mu);
    ptrs.swap(d.deferred);
  }
  for (void* p : ptrs) {
    d.main->deallocate(p);
    history_.record(History::Action::FREE_COMPLETED, d.index, reinterpret_cast<std::size_t>(p), 0,
                    nullptr, {0, 0});
  }
}

bool TorchAllocator::can_back(Device& d, std::size_t bytes) {
  // The cache alone is within every bound memory_available() takes: no driver call then.
  if (std::int64_t(bytes) <= monitor::reusable_bytes(d.main->memory_breakdown())) return true;
  return bytes <= memory_available(d.index);
}

[[noreturn]] void TorchAllocator::reject(Device& d, std::size_t bytes) {
  d.oom_rejections.fetch_add(1, std::memory_order_relaxed);
  std::size_t device_free = 0, device_total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&device_free, &device_total));
  const auto allocated = std::size_t(d.main->stats().allocated_bytes[0].current);
  std::vector<OomRejectionFn> observers;
  {
    std::lock_guard lock(observers_mu_);
    observers = rejection_observers_;
  }
  for (const auto& o : observers) o(d.index, bytes, allocated, device_total);
  std::ostringstream msg;
  msg << "CUDA out of memory (cuarena, throw_on_cudamalloc_oom). Refused to allocate "
      << bytes_text(bytes) << " on GPU " << int(d.index) << ": free device memory and cuarena's "
      << "reusable cache add up to " << bytes_text(memory_available(d.index))
      << " within its limit of " << bytes_text(d.main->memory_limit()) << " (device total "
      << bytes_text(device_total) << ", " << bytes_text(allocated)
      << " allocated by PyTorch). Refused before reclaiming, as throw_on_cudamalloc_oom asks.";
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
}

[[noreturn]] void TorchAllocator::out_of_memory(Device& d, std::size_t bytes,
                                                const std::string& core_message) {
  std::size_t device_free = 0, device_total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&device_free, &device_total));
  const Stats s = d.main->stats();
  const auto reserved = std::size_t(s.reserved_bytes[0].current);
  const auto allocated = std::size_t(s.allocated_bytes[0].current);
  history_.record(History::Action::OOM, d.index, device_free, bytes, nullptr, {0, 0});
  std::vector<OutOfMemoryObserver> observers;
  {
    std::lock_guard lock(observers_mu_);
    observers = oom_observers_;
  }
  for (const auto& o : observers) o(d.index, allocated, device_total, device_free);
  // What a user needs to decide: what this process holds and could reuse, what the device and
  // the other processes have, the largest block that could be built, and how to find a fit.
  const std::size_t reclaimable = std::size_t(monitor::reusable_bytes(d.main->memory_breakdown()));
  const std::size_t limit = d.main->memory_limit();
  const std::size_t others = device_total > device_free + reserved
                                 ? device_total - device_free - reserved  // contexts included
                                 : 0;
  const std::size_t headroom = std::min(device_free, limit > reserved ? limit - reserved : 0);
  std::ostringstream msg;
  msg << "CUDA out of memory (cuarena). Tried to allocate " << bytes_text(bytes) << " on GPU "
      << int(d.index) << ". This process: " << bytes_text(allocated) << " allocated by PyTorch, "
      << bytes_text(reserved) << " reserved by cuarena, of which " << bytes_text(reclaimable)
      << " is free and reusable; limit " << bytes_text(limit)
      << " (per_process_memory_fraction). The GPU: " << bytes_text(device_total) << " total, "
      << bytes_text(device_free) << " free, " << bytes_text(others)
      << " used by other processes and CUDA contexts. The largest block cuarena could build now "
         "is "
      << bytes_text(reclaimable + headroom)
      << " (its free memory stitched together plus the device's free memory within the limit). "
         "Before failing it returned blocks parked in stream caches, waited for pending frees "
         "and moved cached memory where it was needed. To see which setting fits: record the "
         "job with CUARENA_TRACE=oom.pickle.gz, then `python -m cuarena replay oom.pickle.gz "
         "--min-capacity` (and `--config whole_chunk_min:0` for memory first); or free tensors, "
         "lower the batch size, or raise per_process_memory_fraction. ("
      << core_message << ")";
  TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
}

// --- Lifecycle ---------------------------------------------------------------------------------

void TorchAllocator::init(int device_count) {
  device_count_.store(device_count, std::memory_order_release);
  initialized_.store(true, std::memory_order_release);
}

bool TorchAllocator::initialized() { return initialized_.load(std::memory_order_acquire); }

void TorchAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  for (const auto& slot : devices_) {
    Device* d = slot.load(std::memory_order_acquire);
    if (d == nullptr || d->pools->any_context()) continue;  // never synchronise into a capture
    c10::cuda::CUDAGuard guard(d->index);
    flush_deferred(*d);
    if (d->pools->any_pool()) {
      C10_CUDA_CHECK(cudaDeviceSynchronize());  // released graphs may still be replaying
      d->pools->release_cached(mempool_id);
    }
    if (mempool_id == c10::MempoolId_t{0, 0}) d->main->release_cached();
  }
}

void TorchAllocator::enable(bool value) { enabled_.store(value); }
bool TorchAllocator::isEnabled() const { return enabled_.load(); }

double TorchAllocator::getMemoryFraction(c10::DeviceIndex dev) {
  return device(dev).main->config().per_process_memory_fraction;
}

void TorchAllocator::setMemoryFraction(double fraction, c10::DeviceIndex dev) {
  TORCH_CHECK(fraction > 0 && fraction <= 1, "cuarena: invalid fraction ", fraction,
              ": it must be in (0, 1]");
  device(dev).main->set_memory_fraction(fraction);
}

void TorchAllocator::cacheInfo(c10::DeviceIndex dev, size_t* largestBlock) {
  // cuDNN's benchmark mode sizes workspaces from this: the largest request that would succeed
  // now. cuarena can back a request from device free memory and every cached granule at once.
  const std::size_t available = memory_available(dev);
  *largestBlock = std::max<std::size_t>(*largestBlock, available);
}

TorchAllocator::LiveAllocation TorchAllocator::live_allocation(const void* ptr,
                                                               const char* caller) {
  void* p = const_cast<void*>(ptr);
  const int dev = allocators_.device_of(p);
  TORCH_CHECK(dev >= 0, "cuarena: ", caller, "(", ptr, "): not cuarena memory");
  Device& d = device(c10::DeviceIndex(dev));
  const std::size_t pooled = d.pools->any_pool() ? d.pools->block_size(p) : 0;
  if (pooled != 0) return {&d, pooled, pooled, nullptr};
  const auto info = d.main->find(p);
  TORCH_CHECK(info.has_value(), "cuarena: ", caller, "(", ptr,
              "): not the start of a live allocation");
  return {&d, info->size, info->requested, as_stream(info->stream)};
}

void* TorchAllocator::getBaseAllocation(void* ptr, size_t* size) {
  // Every cuarena allocation is its own base: blocks are never carved out of a larger segment
  // that something else could address.
  const LiveAllocation a = live_allocation(ptr, "getBaseAllocation");
  if (size != nullptr) *size = a.size;
  return ptr;
}

void TorchAllocator::recordStream(const c10::DataPtr& data_ptr, c10::cuda::CUDAStream stream) {
  void* ptr = data_ptr.get();
  if (ptr == nullptr || data_ptr.get_deleter() != &raw_free) return;
  const int dev = allocators_.device_of(ptr);
  if (dev < 0) return;
  Device& d = device(c10::DeviceIndex(dev));
  // Pool memory is reused only inside its pool, once every stream is past it (see
  // PrivatePools); a capturing stream's uses happen at replay, which no event can guard.
  if (d.pools->any_pool() && d.pools->block_size(ptr) != 0) return;
  if (d.pools->any_context() && capturing(stream.stream())) return;
  d.main->record_stream(ptr, as_id(stream.stream()));
}

// --- Statistics --------------------------------------------------------------------------------

CDA::DeviceStats TorchAllocator::getDeviceStats(c10::DeviceIndex dev) {
  Device& d = device(dev);
  const Stats s = d.main->stats();
  std::lock_guard lock(d.stats_mu);
  CDA::DeviceStats out = to_device_stats(s, d.accumulated_base);
  fill_newer_stats(out, d.oom_rejections.load(std::memory_order_relaxed) - d.rejections_base,
                   d.pools->reserved_stats());
  return out;
}

void TorchAllocator::resetAccumulatedStats(c10::DeviceIndex dev) {
  Device& d = device(dev);
  const Stats s = d.main->stats();
  std::lock_guard lock(d.stats_mu);
  d.accumulated_base = s;
  d.rejections_base = d.oom_rejections.load(std::memory_order_relaxed);
  d.pools->reset_reserved_accumulated();
}

void TorchAllocator::resetPeakStats(c10::DeviceIndex dev) {
  Device& d = device(dev);
  d.main->reset_peak_stats();
  d.pools->reset_reserved_peaks();
}

std::pair<size_t, size_t> TorchAllocator::memory_info(c10::DeviceIndex dev) {
  c10::cuda::CUDAGuard guard(dev);
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return {free, total};
}

// --- History, observers ------------------------------------------------------------------------

void TorchAllocator::record_history(bool enabled, CDA::CreateContextFn context_recorder,
                                    size_t alloc_trace_max_entries, CDA::RecordContext when,
                                    bool clearHistory,
                                    const std::vector<std::string>& skip_actions) {
  history_.configure(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                     skip_actions);
}

bool TorchAllocator::isHistoryEnabled() { return history_.enabled(); }

void TorchAllocator::recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) {
  history_.annotate(md, c10::cuda::current_device());
}

void TorchAllocator::attachOutOfMemoryObserver(OutOfMemoryObserver observer) {
  std::lock_guard lock(observers_mu_);
  oom_observers_.push_back(std::move(observer));
}

void TorchAllocator::attachAllocatorTraceTracker(CDA::AllocatorTraceTracker tracker) {
  history_.attach_tracker(std::move(tracker));
}

void TorchAllocator::add_oom_rejection_observer(OomRejectionFn observer) {
  std::lock_guard lock(observers_mu_);
  rejection_observers_.push_back(std::move(observer));
}

std::shared_ptr<c10::GatheredContext> TorchAllocator::context_for(const void* ptr) {
  return history_.context_of(reinterpret_cast<std::size_t>(ptr));
}

void TorchAllocator::set_user_metadata(const std::string& metadata) {
  History::set_thread_metadata(metadata);
}

std::string TorchAllocator::user_metadata() { return History::thread_metadata(); }

void TorchAllocator::annotate_memory(const void* ptr, const std::string& metadata) {
  if (!history_.enabled() || ptr == nullptr) return;
  const LiveAllocation a = live_allocation(ptr, "annotateMemory");
  history_.annotate_allocation(a.device->index, reinterpret_cast<std::size_t>(ptr), a.requested,
                               a.stream, metadata);
}

// --- Private pools -----------------------------------------------------------------------------

void TorchAllocator::beginAllocateToPool(c10::DeviceIndex dev, c10::MempoolId_t mempool_id,
                                         std::function<bool(cudaStream_t)> filter) {
  device(dev).pools->begin(mempool_id, std::move(filter));
}

void TorchAllocator::endAllocateToPool(c10::DeviceIndex dev, c10::MempoolId_t mempool_id) {
  Device& d = device(dev);
  d.pools->end(mempool_id);
  if (!d.pools->any_context()) flush_deferred(d);
}

void TorchAllocator::releasePool(c10::DeviceIndex dev, c10::MempoolId_t mempool_id) {
  Device& d = device(dev);
  const bool sync = !any_context();
  if (sync) {
    c10::cuda::CUDAGuard guard(dev);
    C10_CUDA_CHECK(cudaDeviceSynchronize());  // a released graph may still be replaying
  }
  d.pools->release(mempool_id, sync);
}

int TorchAllocator::getPoolUseCount(c10::DeviceIndex dev, c10::MempoolId_t mempool_id) {
  return device(dev).pools->use_count(mempool_id);
}

void TorchAllocator::create_or_incref_pool(c10::DeviceIndex dev, c10::MempoolId_t mempool_id,
                                           const CUDAAllocator* allocator) {
  TORCH_CHECK(allocator == nullptr || allocator == this,
              "cuarena: a MemPool with its own allocator is not served by cuarena; create the "
              "MemPool without an allocator argument (cuarena backs it)");
  device(dev).pools->create_or_incref(mempool_id);
}

void TorchAllocator::set_use_on_oom(c10::DeviceIndex dev, c10::MempoolId_t mempool_id,
                                    bool use_on_oom) {
  device(dev).pools->set_use_on_oom(mempool_id, use_on_oom);
}

void TorchAllocator::set_no_split(c10::DeviceIndex dev, c10::MempoolId_t mempool_id) {
  device(dev).pools->set_no_split(mempool_id);
}

bool TorchAllocator::checkPoolLiveAllocations(
    c10::DeviceIndex dev, c10::MempoolId_t mempool_id,
    const std::unordered_set<void*>& expected_live_allocations) {
  return device(dev).pools->live_equals(mempool_id, expected_live_allocations);
}

namespace {
struct PoolState final : AllocatorState {
  c10::MempoolId_t id;
  std::vector<PrivatePool::LiveBlock> live;
};
}  // namespace

std::shared_ptr<AllocatorState> TorchAllocator::getCheckpointState(c10::DeviceIndex dev,
                                                                   c10::MempoolId_t id) {
  auto state = std::make_shared<PoolState>();
  state->id = id;
  state->live = device(dev).pools->live(id);
  return state;
}

CheckpointDelta TorchAllocator::setCheckpointPoolState(c10::DeviceIndex dev,
                                                       std::shared_ptr<AllocatorState> pps) {
  auto state = std::dynamic_pointer_cast<PoolState>(pps);
  TORCH_CHECK(state != nullptr, "cuarena: setCheckpointPoolState: not a cuarena checkpoint");
  Device& d = device(dev);
  std::vector<PrivatePool::LiveBlock> created;
  CheckpointDelta delta;
  delta.ptrs_freed = d.pools->restore(state->id, state->live, created);
  for (const auto& b : created) {
    void* p = reinterpret_cast<void*>(b.addr);
    delta.dataptrs_allocd.emplace_back(p, p, &raw_free, c10::Device(c10::DeviceType::CUDA, dev));
  }
  return delta;
}

// --- IPC, peers, copies ------------------------------------------------------------------------

void TorchAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  c10::cuda::CUDAGuard guard(dev);
  cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // clear it
  } else {
    C10_CUDA_CHECK(err);
  }
}

cudaError_t TorchAllocator::memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                                        size_t count, cudaStream_t stream, bool p2p_enabled) {
  // cuarena's memory is mapped with cuMemMap, which plain cudaMemcpyAsync cannot copy between
  // devices without peer access: use the peer copy then, as PyTorch does for its VMM memory.
  if (p2p_enabled || dstDevice == srcDevice) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
}

void TorchAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

std::string TorchAllocator::name() { return "cuarena"; }

// --- Free functions ----------------------------------------------------------------------------

std::shared_ptr<CUDAAllocator> make_allocator(Config config) {
  return std::make_shared<TorchAllocator>(std::move(config));
}

Stats TorchAllocator::main_stats(c10::DeviceIndex dev) { return device(dev).main->stats(); }

std::map<std::string, double> TorchAllocator::driver_us(c10::DeviceIndex dev) {
  device(dev);
  return allocators_.backend(dev).driver_us();
}

std::size_t TorchAllocator::memory_available(c10::DeviceIndex dev) {
  Device& d = device(dev);
  c10::cuda::CUDAGuard guard(dev);
  std::size_t device_free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&device_free, &total));
  // One rule with the monitor page's available_bytes.
  return std::size_t(monitor::available_bytes(std::int64_t(device_free), d.main->memory_breakdown(),
                                              d.main->stats().reserved_bytes[0].current,
                                              std::int64_t(d.main->memory_limit())));
}

}  // namespace cuarena::torch_adapter
