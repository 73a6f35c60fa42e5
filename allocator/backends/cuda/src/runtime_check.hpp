// The runtime-API error check of the segment upstreams (cudaMalloc, cudaMallocAsync).
#pragma once

#include <cuda_runtime_api.h>

namespace cuarena::cuda {

/// Throws BackendError naming `call` unless `err` is cudaSuccess.
void check_rt(cudaError_t err, const char* call);

}  // namespace cuarena::cuda
