// Turning a CUDA runtime error into an exception, for the GPU replay tools.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace cuarena::replay {

/// Throws std::runtime_error "GPU replay: <what>: <CUDA's message>" unless `err` is success.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("GPU replay: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace cuarena::replay
