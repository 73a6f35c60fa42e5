// The allocators `cuarena replay --backend cuda` compares, other than PyTorch's (which run in
// their own process: torch_replay.cpp) and RMM's (rmm_allocators.cpp).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "cuarena/allocator.hpp"
#include "cuarena/cuda_backend.hpp"
#include "cuarena/replay/cub_caching.hpp"
#include "cuarena/replay/cuda_check.hpp"
#include "cuarena/replay/gpu_capacity.hpp"
#include "cuarena/replay/gpu_replay.hpp"
#include "cuarena/replay/replay.hpp"

namespace cuarena::replay {

namespace {

class CuarenaGpu final : public GpuAllocator {
 public:
  CuarenaGpu(std::string name, int device, const Config& config, std::size_t capacity)
      : name_(std::move(name)),
        backend_(make_cuda_backend(config.upstream, device, capacity)),
        alloc_(*backend_, config) {}
  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes, void* stream) override {
    try {
      return alloc_.allocate(bytes, reinterpret_cast<StreamId>(stream));
    } catch (const OutOfMemoryError&) {
      return nullptr;
    }
  }
  void deallocate(void* ptr, std::size_t, void*) override { alloc_.deallocate(ptr); }
  std::size_t reserved_bytes() override {
    return std::size_t(alloc_.stats().reserved_bytes[int(Pool::kAll)].current);
  }
  std::map<std::string, std::int64_t> counters() override {
    // The simulator rows' counters (every Stats::to_map() key), plus the driver's.
    std::map<std::string, std::int64_t> out = stats_counters(alloc_.stats());
    out["driver_calls"] = std::int64_t(backend_->driver_calls());
    // Host time in each driver call, in microseconds: where the replay time goes.
    for (const auto& [call, us] : backend_->driver_us())
      out["driver_us." + call] = std::int64_t(us);
    return out;
  }
  void release_cache() override { alloc_.release_cached(); }

 private:
  std::string name_;
  std::unique_ptr<CudaBackend> backend_;  // before alloc_: outlives it
  Allocator alloc_;
};

class CudaMalloc final : public GpuAllocator {
 public:
  explicit CudaMalloc(int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }
  ~CudaMalloc() override {
    for (auto& [p, bytes] : live_) cudaFree(p);
  }
  std::string name() const override { return "cuda-malloc"; }
  void* allocate(std::size_t bytes, void*) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the out-of-memory error
      return nullptr;
    }
    const std::size_t held = (bytes + kGranule - 1) / kGranule * kGranule;  // driver granularity
    live_[p] = held;
    reserved_ += held;
    return p;
  }
  void deallocate(void* ptr, std::size_t, void*) override {
    check_cuda(cudaFree(ptr), "cudaFree");
    reserved_ -= live_.at(ptr);
    live_.erase(ptr);
  }
  std::size_t reserved_bytes() override { return reserved_; }

 private:
  static constexpr std::size_t kGranule = 2u << 20;
  std::unordered_map<void*, std::size_t> live_;
  std::size_t reserved_ = 0;
};

class CudaAsync final : public GpuAllocator {
 public:
  explicit CudaAsync(int device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check_cuda(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    std::uint64_t threshold = UINT64_MAX;  // keep memory across synchronisations
    check_cuda(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  ~CudaAsync() override {
    cudaDeviceSynchronize();
    cudaMemPoolDestroy(pool_);
  }
  std::string name() const override { return "cuda-async"; }
  void* allocate(std::size_t bytes, void* stream) override {
    void* p = nullptr;
    if (cudaMallocFromPoolAsync(&p, bytes, pool_, static_cast<cudaStream_t>(stream)) !=
        cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return p;
  }
  void deallocate(void* ptr, std::size_t, void* stream) override {
    check_cuda(cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)), "cudaFreeAsync");
  }
  std::size_t reserved_bytes() override {
    std::uint64_t v = 0;
    check_cuda(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v),
               "cudaMemPoolGetAttribute(ReservedMemCurrent)");
    return std::size_t(v);
  }
  // The frees just enqueued must have completed before the pool can hand their memory back.
  void release_cache() override {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check_cuda(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
  }

 private:
  cudaMemPool_t pool_ = nullptr;
};

class CubGpu final : public GpuAllocator {
 public:
  CubGpu(int device, std::size_t max_cached_bytes) : device_(device), cub_(max_cached_bytes) {}
  std::string name() const override { return "cub"; }
  void* allocate(std::size_t bytes, void* stream) override {
    void* p = nullptr;
    const cudaError_t err = cub_.allocate(&p, bytes, static_cast<cudaStream_t>(stream));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the out-of-memory error
      return nullptr;
    }
    check_cuda(err, "cub::CachingDeviceAllocator::DeviceAllocate");
    return p;
  }
  void deallocate(void* ptr, std::size_t, void*) override {
    check_cuda(cub_.deallocate(ptr), "cub::CachingDeviceAllocator::DeviceFree");
  }
  std::size_t reserved_bytes() override { return cub_.reserved_bytes(device_); }
  void release_cache() override {
    check_cuda(cub_.release_cached(), "cub::CachingDeviceAllocator::FreeAllCached");
  }

 private:
  int device_;
  CubCachingAllocator cub_;
};

}  // namespace

std::string gpu_unavailable_reason(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) return "no CUDA device found";
  if (err == cudaErrorInsufficientDriver)
    return "no usable NVIDIA driver found (is this a machine with a GPU?)";
  if (err != cudaSuccess) return std::string("cannot use CUDA: ") + cudaGetErrorString(err);
  if (device < 0 || device >= count)
    return "--device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
           " CUDA device(s) found)";
  return "";
}

std::unique_ptr<GpuAllocator> make_cuarena_gpu(int device, const Config& config,
                                               std::size_t capacity, const std::string& name) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return std::make_unique<CuarenaGpu>(name, device, config, capacity);
}
std::unique_ptr<GpuAllocator> make_cuda_malloc(int device) {
  return std::make_unique<CudaMalloc>(device);
}
std::unique_ptr<GpuAllocator> make_cuda_async(int device) {
  return std::make_unique<CudaAsync>(device);
}
std::unique_ptr<GpuAllocator> make_cub(int device, std::size_t max_cached_bytes) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return std::make_unique<CubGpu>(device, max_cached_bytes);
}

std::unique_ptr<GpuAllocator> make_gpu_allocator(const std::string& name, int device,
                                                 const Config& config, std::uint64_t limit) {
  if (name == "cuarena" || name == "cuarena-async" || name == "cuarena-malloc") {
    Config c = config;
    if (name == "cuarena-async") c.upstream = Upstream::kAsync;
    if (name == "cuarena-malloc") c.upstream = Upstream::kMalloc;
    return make_cuarena_gpu(device, c, std::size_t(limit), name);
  }
  if (name == "rmm-pool" || name == "rmm-arena") return make_rmm(name, device, limit);
  std::unique_ptr<GpuAllocator> raw;
  if (name == "cuda-malloc")
    raw = make_cuda_malloc(device);
  else if (name == "cuda-async")
    raw = make_cuda_async(device);
  // No cache limit: CUB's default (6 MiB) would cudaFree most freed blocks at once, measuring
  // cudaMalloc rather than a cache. Blocks above 2 MiB (the largest bin) are never cached.
  else if (name == "cub")
    raw = make_cub(device, SIZE_MAX);
  else
    throw ConfigError("GPU replay: unknown allocator '" + name + "'");
  return limit > 0 ? limit_reserved(std::move(raw), limit) : std::move(raw);
}

}  // namespace cuarena::replay
