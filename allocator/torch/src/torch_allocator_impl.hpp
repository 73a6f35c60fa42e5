// The TorchAllocator class (see cuarena/torch_allocator.hpp for its contract).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuarena/cuda_allocators.hpp"
#include "cuarena/monitor_publisher.hpp"
#include "cuarena/torch_allocator.hpp"
#include "history.hpp"
#include "private_pools.hpp"
#include "torch_compat.hpp"

namespace cuarena::torch_adapter {

using namespace c10::cuda::CUDACachingAllocator;

/// cuarena's statistics under PyTorch's names, less the accumulated counts at the last
/// resetAccumulatedStats (`base`).
CDA::DeviceStats to_device_stats(const Stats& s, const Stats& base);

class TorchAllocator final : public VersionedAllocator {
 public:
  explicit TorchAllocator(Config config);

  // c10::Allocator
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // c10::DeviceAllocator (2.9 and later; CUDAAllocator's own before)
  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  CDA::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;

  // CUDAAllocator, alike in every supported minor
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  using CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(
      c10::DeviceIndex device, c10::MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override;
  ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override;
  void attachOutOfMemoryObserver(OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(CDA::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                     c10::MempoolId_t id) override;
  CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                         std::shared_ptr<AllocatorState> pps) override;
  std::string name() override;

  // VersionedAllocator: the virtuals whose signatures differ between minors
  SnapshotInfo take_snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
  void create_or_incref_pool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                             const CUDAAllocator* allocator) override;
  void set_use_on_oom(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                      bool use_on_oom) override;
  void set_no_split(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void record_history(bool enabled, CDA::CreateContextFn context_recorder,
                      size_t alloc_trace_max_entries, CDA::RecordContext when, bool clearHistory,
                      const std::vector<std::string>& skip_actions) override;
  void add_oom_rejection_observer(OomRejectionFn observer) override;
  std::shared_ptr<c10::GatheredContext> context_for(const void* ptr) override;
  void set_user_metadata(const std::string& metadata) override;
  std::string user_metadata() override;
  void annotate_memory(const void* ptr, const std::string& metadata) override;
  std::pair<size_t, size_t> memory_info(c10::DeviceIndex device) override;

  // cuarena's own
  /// `malloc` under PyTorch's semantics: throws c10::OutOfMemoryError.
  void* malloc(c10::DeviceIndex device, std::size_t bytes, cudaStream_t stream);
  void free(void* ptr);
  std::size_t memory_available(c10::DeviceIndex device);
  /// cuarena's statistics of the device's main allocator (its own counters included).
  Stats main_stats(c10::DeviceIndex device);
  /// Host time spent in each driver call of the device's backend since it was created, in
  /// microseconds, by call name (cuMemMap, cuMemUnmap, cuEventRecord, ...). Thread-safe.
  std::map<std::string, double> driver_us(c10::DeviceIndex device);
  const Config& config() const { return config_; }

 private:
  /// One device: its main allocator, its private pools, frees deferred past a capture.
  struct Device {
    c10::DeviceIndex index = 0;
    cuarena::Allocator* main = nullptr;     // owned by allocators_
    cudaStream_t segment_stream = nullptr;  // the pools' segments are allocated on it
    std::unique_ptr<PrivatePools> pools;
    std::mutex deferred_mu;
    std::vector<void*> deferred;  // frees made on a capturing stream
    std::mutex stats_mu;
    Stats accumulated_base;  // at the last resetAccumulatedStats
    // PyTorch's throw_on_cudamalloc_oom: a request beyond free device memory plus cuarena's
    // reusable cache is refused before the reclaim path (no waits, no retries).
    bool reject_unbackable = false;
    std::atomic<int64_t> oom_rejections{0};  // requests refused by throw_on_cudamalloc_oom
    int64_t rejections_base = 0;             // oom_rejections at the last resetAccumulatedStats
    // The page `cuarena top` reads (null with CUARENA_MONITOR=0). Last: it stops reading `main`
    // before anything else of the device goes (Devices go before allocators_).
    std::unique_ptr<monitor::MonitorPublisher> monitor;
  };
  Device& device(c10::DeviceIndex index);  // created on first use
  Device* existing(c10::DeviceIndex index) const;
  bool any_context() const;
  void* main_allocate(Device& d, std::size_t bytes, cudaStream_t stream, c10::MempoolId_t& pool);
  void flush_deferred(Device& d);
  /// A live allocation at `ptr` (the start of a main-allocator or pool block): its device,
  /// block size, requested bytes (a pool block's size for pool blocks) and stream (nullptr for
  /// pool blocks). Throws c10::Error naming `caller` for any other pointer.
  struct LiveAllocation {
    Device* device;
    std::size_t size;
    std::size_t requested;
    cudaStream_t stream;
  };
  LiveAllocation live_allocation(const void* ptr, const char* caller);
  /// Whether free device memory plus cuarena's reusable cache covers `bytes`, within the
  /// limit, as memory_available() counts them (which it calls only when the cache is short).
  bool can_back(Device& d, std::size_t bytes);
  /// throw_on_cudamalloc_oom: refuses `bytes` up front (counted, observers told).
  [[noreturn]] void reject(Device& d, std::size_t bytes);
  [[noreturn]] void out_of_memory(Device& d, std::size_t bytes, const std::string& core_message);

  const Config config_;
  CudaAllocators allocators_;
  std::mutex create_mu_;
  std::array<std::atomic<Device*>, CudaAllocators::kMaxDevices> devices_{};
  std::vector<std::unique_ptr<Device>> owned_devices_;  // under create_mu_
  History history_;
  std::mutex observers_mu_;
  std::vector<OutOfMemoryObserver> oom_observers_;
  std::vector<OomRejectionFn> rejection_observers_;
  std::mutex ipc_mu_;
  std::map<std::string, std::weak_ptr<void>> opened_;  // IPC handles mapped here
  std::atomic<int> device_count_{0};
  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};
};

}  // namespace cuarena::torch_adapter
