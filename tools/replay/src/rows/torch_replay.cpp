// `cuarena_torch_replay TRACE NAME JSON [--verify] [--device N] [--min-capacity]`: replays a
// trace through PyTorch's own CUDA caching allocator (libc10_cuda from the installed torch), in a
// process of its own so that PYTORCH_CUDA_ALLOC_CONF (read once, at load) selects the mode:
// `cuarena replay --backend cuda` runs it as torch-native (""), torch-expandable
// ("expandable_segments:True") and torch-async ("backend:cudaMallocAsync"). Writes one result to
// JSON; exit 2 on bad input. --min-capacity then also searches the smallest limit that replays
// without out-of-memory (min_capacity() below says how each mode is held to a limit).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "cuarena/replay/cuda_check.hpp"
#include "cuarena/replay/gpu_capacity.hpp"
#include "cuarena/replay/gpu_replay.hpp"
#include "cuarena/replay/report.hpp"

using namespace cuarena::replay;
namespace cca = c10::cuda::CUDACachingAllocator;

namespace {

class TorchGpu final : public GpuAllocator {
 public:
  TorchGpu(std::string name, int device) : name_(std::move(name)), device_(device) {
    int count = 0;
    check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (count == 0) throw std::runtime_error("no CUDA device");
    cca::init(count);
  }
  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes, void* stream) override {
    try {
      return cca::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream));
    } catch (const c10::OutOfMemoryError&) {
      return nullptr;
    }
  }
  void deallocate(void* ptr, std::size_t, void*) override { cca::raw_delete(ptr); }
  std::size_t reserved_bytes() override {
    return std::size_t(cca::getDeviceStats(c10::DeviceIndex(device_)).reserved_bytes[0].current);
  }
  std::map<std::string, std::int64_t> counters() override {
    const auto s = cca::getDeviceStats(c10::DeviceIndex(device_));
    return {{"num_device_alloc", s.num_device_alloc},
            {"num_device_free", s.num_device_free},
            {"num_alloc_retries", s.num_alloc_retries},
            {"torch_reserved_peak", s.reserved_bytes[0].peak}};
  }
  void release_cache() override {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cca::emptyCache();
  }

 private:
  std::string name_;
  int device_;
};

// torch-native and torch-expandable: PyTorch's own limit, setMemoryFraction(limit / total), which
// caps reserved bytes (segments; for expandable segments the whole block size is checked, so it
// may over-estimate). torch-async: its fraction caps allocated bytes, not reserved, so
// limit_reserved() holds it instead (emptyCache syncs and trims the pool).
std::optional<std::uint64_t> min_capacity(const std::vector<cuarena::replay::Event>& events,
                                          TorchGpu& allocator, const Result& r, int device,
                                          std::uint64_t gpu_lag) {
  if (r.ooms > 0) return std::nullopt;
  std::size_t free_bytes = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  const auto dev = c10::DeviceIndex(device);
  allocator.release_cache();  // what the unlimited replay cached must not count against a probe
  auto fits = [&](std::uint64_t limit) {
    bool ok = false;
    if (allocator.name() == "torch-async") {
      auto held = limit_reserved(allocator, limit);
      ok = replays_within(events, *held, device, gpu_lag);
    } else {
      // +4 KiB: PyTorch truncates fraction * total, and segments are 2 MiB multiples.
      cca::setMemoryFraction(std::min(1.0, (double(limit) + 4096.0) / double(total)), dev);
      ok = replays_within(events, allocator, device, gpu_lag);
    }
    allocator.release_cache();
    return ok;
  };
  auto found = gpu_min_capacity(events, device, r.peak_reserved_bytes, fits);
  cca::setMemoryFraction(1.0, dev);
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: cuarena_torch_replay TRACE NAME JSON [--verify] [--device N] "
                 "[--min-capacity] [--series] [--gpu-lag N]\n";
    return 2;
  }
  GpuReplayOptions options;
  bool search = false;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--verify") == 0)
      options.verify = true;
    else if (std::strcmp(argv[i], "--min-capacity") == 0)
      search = true;
    else if (std::strcmp(argv[i], "--series") == 0)
      options.series = true;
    else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      options.device = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--gpu-lag") == 0 && i + 1 < argc)
      options.gpu_lag = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::cerr << "cuarena_torch_replay: error: unknown argument " << argv[i] << '\n';
      return 2;
    }
  }
  try {
    const auto events = device_events(load_trace(argv[1]), options.device);
    TorchGpu allocator(argv[2], options.device);
    Result r = replay_gpu(events, allocator, options);
    if (search)
      r.min_capacity_bytes = min_capacity(events, allocator, r, options.device, options.gpu_lag);
    r.trace = trace_name(argv[1]);
    write_json(argv[3], {r}, options.series);
  } catch (const TraceError& e) {
    std::cerr << "cuarena_torch_replay: error: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cuarena_torch_replay: error: " << e.what() << '\n';
    return 3;
  }
  return 0;
}
