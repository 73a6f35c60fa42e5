#include <cuda_runtime.h>

#include "gpu/gpu_verify.cuh"

namespace cuarena::replay {

namespace {

// A block of 64 threads spins briefly so that a premature reuse on another stream overlaps it.
constexpr int kThreads = 64;

__global__ void tag_kernel(std::uint64_t* first, std::uint64_t* last, std::uint64_t tag) {
  if (threadIdx.x == 0) *first = tag;
  if (threadIdx.x == 1) *last = ~tag;
}

__global__ void check_kernel(const std::uint64_t* first, const std::uint64_t* last,
                             std::uint64_t tag, unsigned long long* error) {
  if (threadIdx.x == 0 && (*first != tag || *last != ~tag)) atomicExch(error, tag);
}

std::uint64_t* word(void* ptr, std::size_t offset) {
  return reinterpret_cast<std::uint64_t*>(static_cast<char*>(ptr) + offset);
}

}  // namespace

void launch_tag(void* ptr, std::size_t bytes, std::uint64_t tag, void* stream) {
  if (bytes < 16) return;
  const std::size_t last = (bytes - 8) / 8 * 8;
  tag_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(word(ptr, 0), word(ptr, last),
                                                                    tag);
}

void launch_check(void* ptr, std::size_t bytes, std::uint64_t tag, std::uint64_t* error,
                  void* stream) {
  if (bytes < 16) return;
  const std::size_t last = (bytes - 8) / 8 * 8;
  check_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      word(ptr, 0), word(ptr, last), tag, reinterpret_cast<unsigned long long*>(error));
}

}  // namespace cuarena::replay
