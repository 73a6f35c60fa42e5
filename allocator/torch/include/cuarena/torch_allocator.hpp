// cuarena::torch_adapter::TorchAllocator: cuarena as PyTorch's CUDA caching allocator.
//
// A complete c10::cuda::CUDACachingAllocator::CUDAAllocator over the policy core: one
// cuarena::Allocator per device (CudaAllocators, so a free returns to the owning device whatever
// device is current), PyTorch's statistics, snapshots and history, private pools for CUDA graphs,
// torch.cuda.MemPool and torch.compile's CUDA-graph trees (cuarena::PrivatePool over the device's
// allocator), and PyTorch's out-of-memory error. The behaviour matched is that of PyTorch's
// CUDACachingAllocator.cpp, torch 2.8 to 2.15 (src/torch_compat.hpp holds what differs between
// them); see allocator/torch/README.md for what differs from PyTorch.
//
// Streams: an allocation is stream-ordered on the current CUDA stream of its device; recordStream
// marks extra streams, as in PyTorch. While a private-pool context is open on a device (CUDA graph
// capture, use_mem_pool), allocations whose stream the context's filter accepts come from that
// pool; frees of other memory made by a capturing stream are deferred until the last context
// closes, because cuarena's events cannot be recorded into a capture.
//
// Threads: every member is safe to call concurrently. Errors: c10::OutOfMemoryError
// (torch.OutOfMemoryError) when a request cannot be met after cuarena's reclaim path;
// c10::Error for misuse (unknown pointer, unknown pool).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "cuarena/config.hpp"
#include "cuarena/stats.hpp"

namespace cuarena::torch_adapter {

/// Creates the allocator (not yet installed). Throws cuarena::ConfigError for a bad config.
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> make_allocator(Config config);

/// The cuarena allocator installed in this process, or nullptr.
c10::cuda::CUDACachingAllocator::CUDAAllocator* installed();

/// Bytes a new allocation on `device` could get now (see torch_c_api.h). Throws c10::Error.
std::size_t memory_available(int device);
/// The statistics of `device`'s main cuarena allocator (the one PyTorch's ordinary allocations
/// use; CUDA-graph pools have their own). Throws c10::Error when cuarena is not installed.
Stats stats(int device);
/// Host microseconds spent in each driver call of `device`'s backend (cuMemMap, cuMemUnmap,
/// cuMemSetAccess, cuEventRecord, ...) since it was created: where cuarena's own time goes.
/// Thread-safe. Throws c10::Error when cuarena is not installed.
std::map<std::string, double> driver_us(int device);

}  // namespace cuarena::torch_adapter

namespace cuarena::pluggable {
/// CUDAPluggableAllocator::set_begin_allocate_to_pool hook.
void begin_allocate_to_pool(int device, c10::cuda::MempoolId_t pool,
                            std::function<bool(cudaStream_t)> filter);
}  // namespace cuarena::pluggable
