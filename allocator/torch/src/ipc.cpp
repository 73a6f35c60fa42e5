// CUDA IPC (torch.multiprocessing sharing a CUDA tensor).
//
// cuarena's memory is created with cuMemCreate for mapping, which the legacy
// cudaIpcGetMemHandle cannot export. Exporting it needs physical memory created with a
// shareable handle type and a file-descriptor hand-over (as PyTorch's expandable segments do);
// that is not built yet, so sharing fails with an error that says what to do instead.
#include <c10/util/Exception.h>

#include "torch_allocator_impl.hpp"

namespace cuarena::torch_adapter {

ShareableHandle TorchAllocator::shareIpcHandle(void* ptr) {
  TORCH_CHECK(false, "cuarena: cannot share CUDA memory ", ptr,
              " with another process yet (cuarena maps memory with cuMemCreate, which the "
              "legacy CUDA IPC handle cannot export). Share the tensor from the CPU, or run the "
              "producer without cuarena.");
}

std::shared_ptr<void> TorchAllocator::getIpcDevPtr(std::string) {
  TORCH_CHECK(false, "cuarena: cannot open a CUDA IPC handle yet (see shareIpcHandle)");
}

}  // namespace cuarena::torch_adapter
