// The rmm-pool and rmm-arena rows: RMM's pool_memory_resource and arena_memory_resource over
// cuda_memory_resource (cudaMalloc), from the librmm wheel (see CMakeLists.txt). Compiled only
// when CMake found RMM; rmm_missing.cpp stands in otherwise.
//
// Settings, and why:
//   rmm-pool   initial pool size 0, no maximum: the pool holds only what the trace makes it take
//              (an initial reservation would be reserved memory the trace never asked for), and
//              grows as RMM grows an uncapped pool: by the larger of the request and the current
//              pool size (doubling), halving the attempt down to the request when upstream fails.
//   rmm-arena  RMM's default arena size (half the device's free memory), taken from cudaMalloc
//              in one piece when the arena is built: its reserved bytes are that size whatever
//              the trace, so compare arenas by min_capacity_bytes (--min-capacity).
// Reserved bytes: counted by a limiting_resource_adaptor between RMM and cudaMalloc (the bytes
// RMM holds from cudaMalloc, each allocation rounded up to 256 B).
// --min-capacity: the adaptor's limit is the capacity, so the pool sees out-of-memory from
// upstream as on a device that small. It has no call that hands cached memory back (it reclaims
// free upstream blocks only when built with a maximum pool size, which would change its growth
// policy), so none is made. The arena's size is the capacity: its min_capacity_bytes is the
// smallest arena that replays the trace (with the default size, half the free memory, a device
// would need about twice that).
#include <cuda_runtime_api.h>

#include <cuda/stream_ref>
#include <limits>
#include <optional>
#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/limiting_resource_adaptor.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <stdexcept>
#include <string>
#include <variant>

#include "cuarena/errors.hpp"
#include "cuarena/replay/cuda_check.hpp"
#include "cuarena/replay/gpu_replay.hpp"

namespace cuarena::replay {

namespace {

// No limit without overflowing the adaptor's `allocated + size <= limit` test.
constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max() / 2;

class RmmGpu final : public GpuAllocator {
 public:
  RmmGpu(std::string name, std::uint64_t limit)
      : name_(std::move(name)),
        upstream_(rmm::mr::cuda_memory_resource{}, limit > 0 ? std::size_t(limit) : kUnlimited),
        resource_(make_resource(name_, upstream_, limit)) {}
  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes, void* stream) override {
    try {
      return std::visit(
          [&](auto& mr) {
            return mr.allocate(view(stream), bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
          },
          resource_);
    } catch (const rmm::out_of_memory&) {
      return nullptr;
    } catch (const std::exception& e) {  // rmm::bad_alloc and logic_error are not runtime_error
      throw std::runtime_error(name_ + ": allocate(" + std::to_string(bytes) + "): " + e.what());
    }
  }
  void deallocate(void* ptr, std::size_t bytes, void* stream) override {
    std::visit(
        [&](auto& mr) { mr.deallocate(view(stream), ptr, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); },
        resource_);
  }
  std::size_t reserved_bytes() override { return upstream_.get_allocated_bytes(); }

 private:
  using Resource = std::variant<rmm::mr::pool_memory_resource, rmm::mr::arena_memory_resource>;

  // RMM 26 takes CCCL's stream_ref (rmm::cuda_stream_view is deprecated).
  static cuda::stream_ref view(void* stream) {
    return cuda::stream_ref{static_cast<cudaStream_t>(stream)};
  }
  static Resource make_resource(const std::string& name,
                                rmm::mr::limiting_resource_adaptor& upstream, std::uint64_t limit) {
    if (name == "rmm-pool")
      return Resource{std::in_place_index<0>, upstream, /*initial_pool_size=*/std::size_t{0}};
    const std::optional<std::size_t> arena_size =
        limit > 0 ? std::optional<std::size_t>(std::size_t(limit)) : std::nullopt;
    return Resource{std::in_place_index<1>, upstream, arena_size};
  }

  std::string name_;
  rmm::mr::limiting_resource_adaptor upstream_;  // shares its state with the copy RMM holds
  Resource resource_;
};

}  // namespace

std::string rmm_unavailable_reason() { return ""; }

std::unique_ptr<GpuAllocator> make_rmm(const std::string& name, int device, std::uint64_t limit) {
  if (name != "rmm-pool" && name != "rmm-arena")
    throw ConfigError("GPU replay: unknown RMM allocator '" + name + "'");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");  // RMM serves the current device
  try {
    return std::make_unique<RmmGpu>(name, limit);
  } catch (const rmm::out_of_memory& e) {
    throw OutOfMemoryError(
        name + ": cannot reserve " + std::to_string(limit) + " bytes: " + e.what(),
        std::size_t(limit));
  } catch (const std::exception& e) {
    throw std::runtime_error(name + ": " + e.what());
  }
}

}  // namespace cuarena::replay
