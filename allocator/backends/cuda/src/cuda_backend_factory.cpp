#include "cuarena/cuda_backend.hpp"
#include "cuarena/cuda_segment_backends.hpp"
#include "cuarena/cuda_vmm_backend.hpp"

namespace cuarena {

std::unique_ptr<CudaBackend> make_cuda_backend(Upstream upstream, int device,
                                               std::size_t capacity) {
  switch (upstream) {
    case Upstream::kAsync:
      return std::make_unique<CudaAsyncBackend>(device, capacity);
    case Upstream::kMalloc:
      return std::make_unique<CudaMallocBackend>(device, capacity);
    case Upstream::kVmm:
      break;
  }
  return std::make_unique<CudaVmmBackend>(device, capacity);
}

}  // namespace cuarena
