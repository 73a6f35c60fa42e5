#include "cuarena/cuda_backend.hpp"

#include "cuarena/cuda_segment_backends.hpp"
#include "cuarena/cuda_vmm_backend.hpp"
#include "cuarena/errors.hpp"

namespace cuarena {

std::vector<CudaBackend::ExportPiece> CudaBackend::export_range(DevicePtr, std::size_t) {
  throw BackendError("cuarena: this upstream's memory cannot be shared with another process "
                     "(CUDA IPC needs upstream:vmm on a device that exports file descriptors)");
}

std::unique_ptr<CudaBackend> make_cuda_backend(Upstream upstream, int device, std::size_t capacity) {
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
