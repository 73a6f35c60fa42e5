// Stands in for rmm_allocators.cpp in a build without RMM: the rmm-* rows are then skipped.
#include <stdexcept>

#include "cuarena/replay/gpu_replay.hpp"

namespace cuarena::replay {

std::string rmm_unavailable_reason() {
  return "RMM not found at build time (see tools/replay/README.md)";
}

std::unique_ptr<GpuAllocator> make_rmm(const std::string& name, int, std::uint64_t) {
  throw std::runtime_error(name + ": " + rmm_unavailable_reason());
}

}  // namespace cuarena::replay
