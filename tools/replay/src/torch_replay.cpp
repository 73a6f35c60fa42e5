// `cuarena_torch_replay TRACE NAME JSON [--verify] [--device N]`: replays a trace through
// PyTorch's own CUDA caching allocator (libc10_cuda from the installed torch), in a process of
// its own so that PYTORCH_CUDA_ALLOC_CONF (read once, at load) selects the mode: `cuarena replay
// --backend cuda` runs it as torch-native (""), torch-expandable ("expandable_segments:True")
// and torch-async ("backend:cudaMallocAsync"). Writes one result to JSON; exit 2 on bad input.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <iostream>
#include <string>

#include "gpu_replay.hpp"
#include "report.hpp"

using namespace cuarena::replay;
namespace cca = c10::cuda::CUDACachingAllocator;

namespace {

class TorchGpu final : public GpuAllocator {
 public:
  TorchGpu(std::string name, int device) : name_(std::move(name)), device_(device) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      throw std::runtime_error("no CUDA device");
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

 private:
  std::string name_;
  int device_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: cuarena_torch_replay TRACE NAME JSON [--verify] [--device N]\n";
    return 2;
  }
  GpuReplayOptions options;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--verify") == 0) options.verify = true;
    else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) options.device = std::atoi(argv[++i]);
    else {
      std::cerr << "cuarena_torch_replay: error: unknown argument " << argv[i] << '\n';
      return 2;
    }
  }
  try {
    const auto events = device_events(load_trace(argv[1]), options.device);
    TorchGpu allocator(argv[2], options.device);
    Result r = replay_gpu(events, allocator, options);
    r.trace = trace_name(argv[1]);
    write_json(argv[3], {r});
  } catch (const TraceError& e) {
    std::cerr << "cuarena_torch_replay: error: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cuarena_torch_replay: error: " << e.what() << '\n';
    return 3;
  }
  return 0;
}
