#include "cuda_check.hpp"
#include "gpu_replay.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "gpu_verify.cuh"

namespace cuarena::replay {

namespace {

using Clock = std::chrono::steady_clock;

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const std::size_t k = std::min(v.size() - 1, std::size_t(q * double(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}

struct LiveBlock {
  void* ptr;
  std::size_t size;
  void* stream;
  std::uint64_t tag;
};

}  // namespace

Result replay_gpu(const std::vector<Event>& events, GpuAllocator& allocator,
                  const GpuReplayOptions& options) {
  check_cuda(cudaSetDevice(options.device), "cudaSetDevice");
  std::unordered_map<std::uint64_t, cudaStream_t> streams;
  auto stream_of = [&](std::uint64_t handle) {
    auto it = streams.find(handle);
    if (it != streams.end()) return it->second;
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    streams.emplace(handle, s);
    return s;
  };
  for (const Event& e : events) {
    if (e.action == Action::kAlloc) stream_of(e.stream);  // create streams outside the timing
  }
  std::uint64_t* error_flag = nullptr;
  if (options.verify) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&error_flag), sizeof *error_flag), "cudaMalloc(error flag)");
    check_cuda(cudaMemset(error_flag, 0, sizeof *error_flag), "cudaMemset");
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::size_t free0 = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free0, &total), "cudaMemGetInfo");

  Result r;
  r.allocator = allocator.name();
  r.backend = "cuda";
  r.device = options.device;
  std::vector<double> alloc_us, free_us;
  alloc_us.reserve(events.size() / 2);
  free_us.reserve(events.size() / 2);
  std::unordered_map<std::uint64_t, LiveBlock> live;
  std::uint64_t next_tag = 1;
  std::size_t peak_reserved = 0, peak_device_used = 0;
  std::optional<SeriesRecorder> series;
  if (options.series) series.emplace(events.size());
  const auto start = Clock::now();
  for (const Event& e : events) {
    std::optional<std::size_t> reserved_now;  // read after an allocation
    if (e.action == Action::kAlloc) {
      ++r.allocs;
      auto old = live.find(e.addr);
      if (old != live.end()) {  // the trace lost this address's free
        allocator.deallocate(old->second.ptr, old->second.size, old->second.stream);
        live.erase(old);
        ++r.skipped_events;
      }
      void* stream = stream_of(e.stream);
      const auto t0 = Clock::now();
      void* p = allocator.allocate(e.size, stream);
      const auto t1 = Clock::now();
      alloc_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (p == nullptr) {
        if (r.ooms++ == 0) {  // where; what was free then, each allocator keeps to itself
          r.first_oom.emplace();
          r.first_oom->event = std::uint64_t(&e - events.data());
          r.first_oom->request = e.size;
        }
        if (options.stop_at_oom) break;
      } else {
        const std::uint64_t tag = next_tag++;
        if (options.verify) launch_tag(p, e.size, tag, stream);
        live.emplace(e.addr, LiveBlock{p, e.size, stream, tag});
        const std::size_t reserved = allocator.reserved_bytes();
        reserved_now = reserved;
        if (reserved > peak_reserved) {
          peak_reserved = reserved;
          std::size_t free_now = 0;
          check_cuda(cudaMemGetInfo(&free_now, &total), "cudaMemGetInfo");
          peak_device_used = std::max(peak_device_used, free0 > free_now ? free0 - free_now : 0);
        }
      }
    } else if (e.action == Action::kFreeCompleted) {
      auto it = live.find(e.addr);
      if (it == live.end()) {
        ++r.skipped_events;
      } else {
        ++r.frees;
        const LiveBlock b = it->second;
        live.erase(it);
        if (options.verify) launch_check(b.ptr, b.size, b.tag, error_flag, b.stream);
        const auto t0 = Clock::now();
        allocator.deallocate(b.ptr, b.size, b.stream);
        const auto t1 = Clock::now();
        free_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    } else if (e.action == Action::kOther) {
      ++r.skipped_events;
    }
    if (series) series->add(reserved_now ? *reserved_now : allocator.reserved_bytes());
  }
  for (auto& [addr, b] : live) {
    if (options.verify) launch_check(b.ptr, b.size, b.tag, error_flag, b.stream);
    allocator.deallocate(b.ptr, b.size, b.stream);
  }
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

  r.peak_reserved_bytes = peak_reserved;
  if (series) r.series = series->finish(events);
  r.peak_requested_bytes = peak_requested(events);
  r.reserved_ratio =
      r.peak_requested_bytes ? double(r.peak_reserved_bytes) / double(r.peak_requested_bytes) : 0;
  r.counters["device_used_peak_bytes"] = std::int64_t(peak_device_used);
  r.latency_us = Result::Latency{percentile(alloc_us, 0.50), percentile(alloc_us, 0.99),
                                 percentile(alloc_us, 1.0),  percentile(free_us, 0.50),
                                 percentile(free_us, 0.99),  percentile(free_us, 1.0)};
  for (const auto& [k, v] : allocator.counters()) r.counters[k] = v;
  return r;
}

}  // namespace cuarena::replay
