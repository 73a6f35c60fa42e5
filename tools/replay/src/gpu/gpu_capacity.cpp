#include "cuarena/replay/gpu_capacity.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "cuarena/replay/cuda_check.hpp"
#include "cuarena/replay/replay.hpp"

namespace cuarena::replay {

namespace {

class ReservedLimit final : public GpuAllocator {
 public:
  ReservedLimit(std::unique_ptr<GpuAllocator> owned, GpuAllocator& inner, std::uint64_t limit)
      : owned_(std::move(owned)), inner_(inner), limit_(limit) {}
  std::string name() const override { return inner_.name(); }
  void* allocate(std::size_t bytes, void* stream) override {
    for (int attempt = 0; attempt < 2; ++attempt) {
      void* p = inner_.allocate(bytes, stream);
      if (p == nullptr || inner_.reserved_bytes() <= limit_) return p;
      inner_.deallocate(p, bytes, stream);  // over the limit: undo, drop the cache, try again
      inner_.release_cache();
    }
    return nullptr;
  }
  void deallocate(void* ptr, std::size_t bytes, void* stream) override {
    inner_.deallocate(ptr, bytes, stream);
  }
  std::size_t reserved_bytes() override { return inner_.reserved_bytes(); }
  std::map<std::string, std::int64_t> counters() override { return inner_.counters(); }
  void release_cache() override { inner_.release_cache(); }

 private:
  std::unique_ptr<GpuAllocator> owned_;  // null when not owned
  GpuAllocator& inner_;
  std::uint64_t limit_;
};

}  // namespace

std::unique_ptr<GpuAllocator> limit_reserved(std::unique_ptr<GpuAllocator> inner,
                                             std::uint64_t limit) {
  GpuAllocator& ref = *inner;
  return std::make_unique<ReservedLimit>(std::move(inner), ref, limit);
}

std::unique_ptr<GpuAllocator> limit_reserved(GpuAllocator& inner, std::uint64_t limit) {
  return std::make_unique<ReservedLimit>(nullptr, inner, limit);
}

bool replays_within(const std::vector<Event>& events, GpuAllocator& allocator, int device,
                    std::uint64_t gpu_lag) {
  GpuReplayOptions options;
  options.device = device;
  options.gpu_lag = gpu_lag;
  options.stop_at_oom = true;
  return replay_gpu(events, allocator, options).ooms == 0;
}

std::optional<std::uint64_t> gpu_min_capacity(const std::vector<Event>& events, int device,
                                              std::uint64_t known_good,
                                              const std::function<bool(std::uint64_t)>& fits) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  std::size_t free_bytes = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return search_min_capacity(kCapacityStep, peak_requested(events), known_good, total, fits);
}

}  // namespace cuarena::replay
