#include <cuda_runtime.h>

#include "gpu/gpu_lag.cuh"

namespace cuarena::replay {

namespace {

__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void busy_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) {
  }
}

}  // namespace

void launch_busy(std::uint64_t ns, void* stream) {
  busy_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ns);
}

}  // namespace cuarena::replay
