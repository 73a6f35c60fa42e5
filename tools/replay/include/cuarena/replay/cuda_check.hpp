// The one check of a CUDA runtime call's status for the replayer, its GPU rows and the GPU
// benchmarks: a message naming the call, or an exception carrying it.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace cuarena::replay {

/// "<what>: <CUDA's message>" when `err` is an error; empty on success.
inline std::string cuda_error(cudaError_t err, const char* what) {
  return err == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(err);
}

/// Throws std::runtime_error "<who>: <what>: <CUDA's message>" unless `err` is success.
inline void check_cuda(cudaError_t err, const char* what, const char* who = "GPU replay") {
  if (err != cudaSuccess) throw std::runtime_error(std::string(who) + ": " + cuda_error(err, what));
}

}  // namespace cuarena::replay
