// DeviceState: what the shim keeps for one CUDA context: a cuarena Allocator over the driver-only
// VMM backend, the streams a synchronous free must wait for, the frees waiting for them, and the
// per-allocation answers the driver would give (buffer ids, IPC exports).
//
// Stream semantics: an allocation on stream S (0: the legacy default stream; synchronous
// allocations use it too) is reusable on S at once after an asynchronous free on S, and after
// the events cuarena records otherwise. A synchronous free is held (held_frees.hpp) until a
// fence (stream_registry.hpp) orders every later command after every earlier one; then it goes
// back to cuarena. The fence is recorded when an allocation cannot be served from what cuarena
// holds, or when ShimConfig::pending_free_bytes are held: a few times per training step instead
// of once per free, and never with the host waiting for the device.
//
// Thread semantics: every member is safe to call concurrently. Errors: allocate() throws
// OutOfMemoryError (after fencing every held free and cuarena's own reclaim); the
// constructor throws BackendError when the device cannot be served (no VMM support, no driver).
#pragma once

#include <cuda.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuarena/allocator.hpp"
#include "cuarena/cuda_vmm_backend.hpp"
#include "cuarena/monitor_publisher.hpp"
#include "held_frees.hpp"
#include "shim_config.hpp"
#include "stream_registry.hpp"
#include "trace_recorder.hpp"

namespace cuarena::shim {

class DeviceState {
 public:
  DeviceState(CUcontext context, int device, const ShimConfig& config, TraceRecorder* trace);
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  CUcontext context() const { return context_; }
  int device() const { return device_; }
  Allocator& allocator() { return alloc_; }
  /// Whether cuarena's physical memory here is GPUDirect RDMA capable (CudaVmmBackend): what a
  /// served cuMemCreate may ask for.
  bool rdma_capable() const { return backend_.rdma_capable(); }

  /// `bytes` usable in stream order on `stream` (already normalised: 0 is the legacy stream),
  /// at a multiple of `alignment` (a power of two; Allocator::allocate_aligned()).
  void* allocate(std::size_t bytes, StreamId stream, std::size_t alignment = kMinBlockSize);

  /// The live allocation starting at `ptr` that the program has not freed, or nullopt.
  std::optional<Allocator::BlockInfo> find(DevicePtr ptr) const;

  /// cudaFree / cuMemFree of a live allocation: held until a fence orders its reuse after all
  /// device work issued so far. False for a pointer already freed (held).
  bool free_sync(DevicePtr ptr, const Allocator::BlockInfo& block);
  /// cuMemFreeAsync on `stream` (normalised): stream-ordered.
  void free_async(DevicePtr ptr, const Allocator::BlockInfo& block, StreamId stream);

  /// A stream the program created (`used` false) or cuarena allocates or frees on (true).
  void add_stream(CUstream stream, bool used);
  /// The program destroys `stream`: true when the caller should destroy it for real (see
  /// stream_registry.hpp: streams cuarena used are parked instead).
  bool retire_stream(CUstream stream);
  /// A parked stream to hand back for a create with `flags` and `priority`, or nullptr.
  CUstream reuse_stream(unsigned flags, int priority);

  /// cuMemGetInfo as the program should see it: cuarena's cached-but-unused bytes and the frees
  /// waiting for their fence count as free; with a limit below the device, the limit is the total.
  void mem_info(std::size_t& free_bytes, std::size_t& total_bytes);

  /// The allocation holding `ptr` as the driver would report its own: [base, base + requested).
  enum class Lookup { kNotOurs, kFound, kNotLive };
  Lookup range(DevicePtr ptr, DevicePtr& base, std::size_t& size) const;
  /// A process-unique id for the live allocation starting at `base`
  /// (CU_POINTER_ATTRIBUTE_BUFFER_ID), a new one for every allocation; tagged with the top bit so
  /// it never equals a driver's id.
  std::uint64_t buffer_id(DevicePtr base);

  /// The bytes of a translated IPC record for the allocation at `base` (ipc_ticket.hpp), kept
  /// until the allocation is freed; `offset` receives base's offset into the exported range.
  /// Throws BackendError when the memory cannot be exported.
  const std::string& ipc_record(DevicePtr base, const Allocator::BlockInfo& block,
                                std::size_t& offset);

  /// True while a stream of this context captures a graph (see StreamRegistry::any_capturing):
  /// synchronous allocations and frees are then the driver's (it refuses them, as without the
  /// shim, instead of cuarena handing out memory the graph would keep using).
  bool any_capturing() const;
  /// The program begins / ends a graph capture on `stream` (StreamRegistry::capture_begins).
  void capture_begins(CUstream stream);
  void capture_ends(CUstream stream);

  /// Fences the held frees and gives them back to cuarena (before an out-of-memory error, and
  /// at the program's request to release memory). Nothing while a graph is being captured.
  void release_held();

  /// What the fences cost the host (cumulative; read at exit for the summary line).
  struct FenceCounters {
    std::uint64_t fences = 0;       ///< fences recorded
    std::uint64_t reused = 0;       ///< held frees given back to cuarena by them
    std::uint64_t served_held = 0;  ///< allocations served while frees were held
    std::uint64_t streams = 0;      ///< live non-blocking streams at the last fence
  };
  FenceCounters fence_counters() const;

 private:
  /// A block cuarena has mapped for `bytes` while frees are held, or nullptr: fence them.
  void* allocate_cached(std::size_t bytes, StreamId stream, std::size_t alignment);
  void start_monitor();
  void fence_and_release();  // requires mu_: release_held()

  void forget(DevicePtr ptr);           // requires mu_
  std::uint64_t id_of(DevicePtr base);  // requires mu_: buffer_id()'s answer

  CUcontext context_;
  int device_;
  std::size_t hold_limit_;  // ShimConfig::pending_free_bytes
  // While frees are held, a cached block more than this many times the request is split for it
  // only if no held block would fit within that; 0: no bound (ShimConfig::snug_factor,
  // bench/shim/held_frees_sim.cpp).
  std::size_t snug_factor_;
  TraceRecorder* trace_;
  CudaVmmBackend backend_;
  Allocator alloc_;

  mutable std::mutex mu_;  // guards what follows
  StreamRegistry streams_;
  HeldFrees held_;
  std::atomic<std::size_t> held_bytes_{0};  // held_.bytes(), read without mu_
  std::unordered_map<DevicePtr, std::uint64_t> ids_;
  std::unordered_map<DevicePtr, std::unique_ptr<std::string>> exports_;
  std::atomic<bool> has_records_{false};  // ids_ or exports_ non-empty
  std::uint64_t next_id_ = 1;
  FenceCounters counters_;  // guarded by mu_, but served_held: served_held_
  std::atomic<std::uint64_t> served_held_{0};
  // The page `cuarena top` reads (null with CUARENA_MONITOR=0). Last: it stops reading alloc_
  // before alloc_ goes.
  std::unique_ptr<monitor::MonitorPublisher> monitor_;
};

}  // namespace cuarena::shim
