#include "runtime_check.hpp"

#include <string>

#include "cuarena/errors.hpp"

namespace cuarena::cuda {

void check_rt(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    throw BackendError(std::string("cuarena: ") + call + " failed: " + cudaGetErrorName(err) +
                       " (" + cudaGetErrorString(err) + ")");
  }
}

}  // namespace cuarena::cuda
