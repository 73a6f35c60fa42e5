// The GPU rows in a build without CUDA (gpu_rows.cpp stands in where the toolkit was found).
#include "cuarena/errors.hpp"
#include "cuarena/replay/allocator_registry.hpp"

namespace cuarena::replay {

namespace {
constexpr const char* kNoCuda =
    "this build has no CUDA support (no CUDA toolkit at configure time)";
}  // namespace

std::optional<Result> gpu_row(const std::string&, const RowContext&) {
  throw ConfigError(std::string("--backend cuda: ") + kNoCuda);
}

std::string cuda_unavailable_reason(int) { return kNoCuda; }

std::string rmm_rows_unavailable() { return kNoCuda; }

}  // namespace cuarena::replay
