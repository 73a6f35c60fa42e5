#include "cuarena/cuda_backend.hpp"

#include "cuarena/errors.hpp"

namespace cuarena {

std::vector<CudaBackend::ExportPiece> CudaBackend::export_range(DevicePtr, std::size_t) {
  throw BackendError(
      "cuarena: this upstream's memory cannot be shared with another process "
      "(CUDA IPC needs upstream:vmm on a device that exports file descriptors)");
}

}  // namespace cuarena
