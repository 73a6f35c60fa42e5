// CUDA IPC (torch.multiprocessing sharing a CUDA tensor): cuarena's memory is mapped with
// cuMemCreate, which the legacy cudaIpcGetMemHandle cannot export, so the handle describes the
// granules under the block as exported file descriptors (cuda_ipc.hpp). The receiving process
// must run cuarena too (a spawned child inherits CUARENA=1 / PYTORCH_CUDA_ALLOC_CONF).
#include <c10/util/Exception.h>

#include <map>
#include <mutex>

#include "cuarena/cuda_ipc.hpp"
#include "torch_allocator_impl.hpp"

namespace cuarena::torch_adapter {

ShareableHandle TorchAllocator::shareIpcHandle(void* ptr) {
  const int dev = allocators_.device_of(ptr);
  TORCH_CHECK(dev >= 0, "cuarena: shareIpcHandle(", ptr, "): not cuarena memory");
  std::size_t size = 0;
  getBaseAllocation(ptr, &size);  // checks that ptr starts a live allocation
  CudaBackend& backend = allocators_.backend(dev);
  const std::size_t g = backend.granularity();
  const auto addr = reinterpret_cast<DevicePtr>(ptr);
  const DevicePtr start = addr / g * g;
  const std::size_t span = round_up(addr + size, g) - start;
  std::vector<CudaBackend::ExportPiece> pieces;
  try {
    // Under the device lock: the backend serves one caller at a time.
    device(c10::DeviceIndex(dev)).main->with_device_lock([&] {
      pieces = backend.export_range(start, span);
    });
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
  return {std::ptrdiff_t(addr - start), cuda_ipc::encode(dev, span, pieces)};
}

std::shared_ptr<void> TorchAllocator::getIpcDevPtr(std::string handle) {
  TORCH_CHECK(cuda_ipc::is_cuarena_handle(handle),
              "cuarena: this CUDA IPC handle was not made by cuarena: the process that shared "
              "the tensor must run cuarena too (or neither may)");
  std::lock_guard lock(ipc_mu_);
  if (auto it = opened_.find(handle); it != opened_.end()) {
    if (auto live = it->second.lock()) return live;
  }
  std::shared_ptr<void> base;
  try {
    base = cuda_ipc::open(handle);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cuarena: opening a CUDA IPC handle failed: ", e.what());
  }
  opened_[handle] = base;
  return base;
}

}  // namespace cuarena::torch_adapter
