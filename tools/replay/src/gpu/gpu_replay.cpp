#include "cuarena/replay/gpu_replay.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuarena/replay/cuda_check.hpp"
#include "cuarena/replay/replay_loop.hpp"
#include "gpu/gpu_lag.cuh"
#include "gpu/gpu_verify.cuh"

namespace cuarena::replay {

namespace {

using Clock = std::chrono::steady_clock;

struct LiveBlock {
  void* ptr = nullptr;  ///< nullptr: the allocation failed (not kept live)
  std::size_t size = 0;
  void* stream = nullptr;
  std::uint64_t tag = 0;
};

// --gpu-lag's events, one per event of lag, created as first needed; destroyed with the replay
// (also when it throws).
struct LagEvents {
  std::vector<cudaEvent_t> ring;
  LagEvents() = default;
  LagEvents(const LagEvents&) = delete;
  LagEvents& operator=(const LagEvents&) = delete;
  ~LagEvents() {
    for (cudaEvent_t e : ring) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
};

// The GPU row's work at each event of the replayer's loop (replay_loop.hpp). A failed
// allocation stays live as an empty block, as on the simulator: the job had the block, so its
// free is a free and a later alloc of its address a lost free. Every block is freed at its
// free_completed, a deferred free too (the loop's default rules).
struct GpuHooks : TraceHooks<LiveBlock> {
  GpuAllocator& allocator;
  const GpuReplayOptions& options;
  const std::unordered_map<std::uint64_t, cudaStream_t>& streams;  // every alloc's stream
  Result& r;
  std::uint64_t* error_flag;
  std::size_t free0;  // device memory free before the replay
  SeriesRecorder* series;
  // --gpu-lag (empty: off): lag_events[i % size] was recorded after event i - size (null: never).
  std::vector<cudaEvent_t>& lag_events;
  std::vector<double> alloc_us{}, free_us{};
  std::uint64_t next_tag = 1;
  std::size_t peak_reserved = 0, peak_device_used = 0;
  std::optional<std::size_t> reserved_now{};  // read after an allocation
  bool stop = false;                          // stop_at_oom and it ran out

  void on_event(std::size_t i, const Event&) {
    reserved_now.reset();
    if (!lag_events.empty()) {  // the device is done with the work of gpu_lag events back
      cudaEvent_t done = lag_events[i % lag_events.size()];
      if (done != nullptr)
        check_cuda(cudaEventSynchronize(done), "cudaEventSynchronize (--gpu-lag)");
    }
  }
  /// --gpu-lag: the event's stream gets a busy kernel, then the event that on_event waits for.
  void fall_behind(std::size_t i, const Event& e) {
    const auto s = streams.find(e.stream);
    if (s == streams.end()) return;  // a stream with no allocation: no work of the job there
    cudaEvent_t& slot = lag_events[i % lag_events.size()];
    if (slot == nullptr)
      check_cuda(cudaEventCreateWithFlags(&slot, cudaEventDisableTiming), "cudaEventCreate");
    launch_busy(kLagKernelNs, s->second);
    check_cuda(cudaEventRecord(slot, s->second), "cudaEventRecord (--gpu-lag)");
  }
  LiveBlock on_alloc(std::size_t i, const Event& e) {
    void* stream = streams.at(e.stream);
    const auto t0 = Clock::now();
    void* p = allocator.allocate(e.size, stream);
    const auto t1 = Clock::now();
    alloc_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (p == nullptr) {
      if (r.ooms++ == 0) {  // where; what was free then, each allocator keeps to itself
        r.first_oom.emplace();
        r.first_oom->event = std::uint64_t(i);
        r.first_oom->request = e.size;
      }
      stop = options.stop_at_oom;
      return {};
    }
    const std::uint64_t tag = next_tag++;
    if (options.verify) launch_tag(p, e.size, tag, stream);
    const std::size_t reserved = allocator.reserved_bytes();
    reserved_now = reserved;
    if (reserved > peak_reserved) {
      peak_reserved = reserved;
      std::size_t free_now = 0, total = 0;
      check_cuda(cudaMemGetInfo(&free_now, &total), "cudaMemGetInfo");
      peak_device_used = std::max(peak_device_used, free0 > free_now ? free0 - free_now : 0);
    }
    return LiveBlock{p, e.size, stream, tag};
  }
  void on_free(std::size_t, const Event& e, LiveBlock& b) {
    if (b.ptr == nullptr) return;      // the allocation failed: nothing to free
    if (e.action == Action::kAlloc) {  // the trace lost this address's free: untimed, unchecked
      allocator.deallocate(b.ptr, b.size, b.stream);
      return;
    }
    if (options.verify) launch_check(b.ptr, b.size, b.tag, error_flag, b.stream);
    const auto t0 = Clock::now();
    allocator.deallocate(b.ptr, b.size, b.stream);
    const auto t1 = Clock::now();
    free_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  bool after(std::size_t i, const Event& e) {
    if (!lag_events.empty()) fall_behind(i, e);
    if (stop) return false;
    if (series) series->add(reserved_now ? *reserved_now : allocator.reserved_bytes());
    return true;
  }
  void on_end(std::unordered_map<std::uint64_t, LiveBlock>& live) {
    for (auto& [addr, b] : live) {
      if (b.ptr == nullptr) continue;  // a failed allocation
      if (options.verify) launch_check(b.ptr, b.size, b.tag, error_flag, b.stream);
      allocator.deallocate(b.ptr, b.size, b.stream);
    }
  }
};

}  // namespace

Result replay_gpu(const std::vector<Event>& events, GpuAllocator& allocator,
                  const GpuReplayOptions& options) {
  check_cuda(cudaSetDevice(options.device), "cudaSetDevice");
  std::unordered_map<std::uint64_t, cudaStream_t> streams;
  for (const Event& e : events) {  // create streams outside the timing
    if (e.action != Action::kAlloc || streams.count(e.stream)) continue;
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    streams.emplace(e.stream, s);
  }
  std::uint64_t* error_flag = nullptr;
  if (options.verify) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&error_flag), sizeof *error_flag),
               "cudaMalloc(error flag)");
    check_cuda(cudaMemset(error_flag, 0, sizeof *error_flag), "cudaMemset");
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::size_t free0 = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free0, &total), "cudaMemGetInfo");

  Result r;
  r.allocator = allocator.name();
  r.backend = "cuda";
  r.device = options.device;
  std::optional<SeriesRecorder> series;
  if (options.series) series.emplace(events.size());
  SeriesRecorder* rec = series ? &*series : nullptr;
  LagEvents lag;
  if (options.gpu_lag > kMaxGpuLag)
    throw std::invalid_argument("gpu_lag " + std::to_string(options.gpu_lag) + " is above " +
                                std::to_string(kMaxGpuLag));
  if (options.gpu_lag > 1) lag.ring.assign(options.gpu_lag, nullptr);
  GpuHooks hooks{{}, allocator, options, streams, r, error_flag, free0, rec, lag.ring};
  hooks.alloc_us.reserve(events.size() / 2);
  hooks.free_us.reserve(events.size() / 2);
  const auto start = Clock::now();
  const TraceCounts counts = run_trace<LiveBlock>(events, hooks);
  r.allocs = counts.allocs;
  r.frees = counts.frees;
  r.skipped_events = counts.skipped;
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (a kernel or an allocator failed)");
  r.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (options.verify) {
    std::uint64_t bad = 0;
    check_cuda(cudaMemcpy(&bad, error_flag, sizeof bad, cudaMemcpyDeviceToHost), "cudaMemcpy");
    r.counters["verify_failures"] = bad != 0;
    r.counters["verify_first_bad_tag"] = std::int64_t(bad);
    cudaFree(error_flag);
  }
  for (auto& [h, s] : streams) cudaStreamDestroy(s);

  r.peak_reserved_bytes = hooks.peak_reserved;
  if (series) r.series = series->finish(events);
  r.peak_requested_bytes = peak_requested(events);
  r.reserved_ratio =
      r.peak_requested_bytes ? double(r.peak_reserved_bytes) / double(r.peak_requested_bytes) : 0;
  r.counters["device_used_peak_bytes"] = std::int64_t(hooks.peak_device_used);
  std::vector<double>& alloc_us = hooks.alloc_us;
  std::vector<double>& free_us = hooks.free_us;
  r.latency_us = Result::Latency{percentile(alloc_us, 0.50), percentile(alloc_us, 0.99),
                                 percentile(alloc_us, 1.0),  percentile(free_us, 0.50),
                                 percentile(free_us, 0.99),  percentile(free_us, 1.0)};
  for (const auto& [k, v] : allocator.counters()) r.counters[k] = v;
  return r;
}

}  // namespace cuarena::replay
