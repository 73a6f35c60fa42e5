// CUDA IPC for cuarena's mapped memory: the handle one process gives another so that both map
// the same physical memory (torch.multiprocessing sharing a CUDA tensor).
//
// Legacy cudaIpcGetMemHandle cannot export memory made with cuMemCreate. So the exporting
// process describes the range as pieces of physical allocations exported as POSIX file
// descriptors (CudaBackend::export_range); the importing process copies those descriptors out
// of the exporter with pidfd_getfd (Linux >= 5.6, and the permission to ptrace it: the same
// user, as PyTorch's expandable segments need), imports each with
// cuMemImportFromShareableHandle, and maps them in the same layout in a fresh virtual range.
//
// Errors: std::invalid_argument for a malformed handle; BackendError for a failed system or
// driver call (naming it).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cuarena/cuda_backend.hpp"

namespace cuarena::cuda_ipc {

/// The handle for `span` bytes (a granule multiple) of device `device` in this process, mapped as
/// `pieces` describe.
std::string encode(int device, std::size_t span,
                   const std::vector<CudaBackend::ExportPiece>& pieces);

/// True when `handle` came from encode() (of any process).
bool is_cuarena_handle(const std::string& handle);

/// Maps the memory `handle` describes into this process. The returned pointer is the start of
/// the range; releasing the last reference unmaps it and frees the virtual range. The exporting
/// process must still hold the memory (torch.multiprocessing's reference counts see to it).
std::shared_ptr<void> open(const std::string& handle);

}  // namespace cuarena::cuda_ipc
