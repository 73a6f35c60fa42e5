// Translated CUDA IPC handles for the shim's memory.
//
// cuIpcGetMemHandle cannot export cuMemCreate memory. The shim hands out a CUipcMemHandle of its
// own instead, a "ticket" (64 bytes, like the driver's): the exporter's pid, the device, and
// where in the exporter's memory a record lies: the allocation's buffer id, then the piece list
// cuda_ipc::encode writes (physical allocations exported as file descriptors). The importer reads
// the record with process_vm_readv, checks the id, and maps the pieces with cuda_ipc::open
// (pidfd_getfd: same user, Linux >= 5.6). The record lives until the exporter frees the
// allocation, so a ticket of freed memory is refused. Both processes must run under the shim.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>

namespace cuarena::shim {

/// A ticket for `record` (DeviceState::ipc_record), the exported allocation lying `offset` bytes
/// into the exported range.
CUipcMemHandle make_ticket(int device, const std::string& record, std::size_t offset);

/// True when `handle` is a ticket (of any process), false for a driver's handle.
bool is_ticket(const CUipcMemHandle& handle);

/// Maps the memory a ticket names into this process; `ptr` receives the allocation's address
/// here. The returned reference keeps the mapping until released. Throws BackendError (naming
/// what failed) when the exporter is gone, freed the memory, or cannot be read.
std::shared_ptr<void> open_ticket(const CUipcMemHandle& handle, CUdeviceptr& ptr);

}  // namespace cuarena::shim
