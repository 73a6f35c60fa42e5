// The contract suites on a real device: each CUDA backend (VMM, cudaMalloc, cudaMallocAsync) and
// the Allocator over each. They skip, saying why, where no CUDA device is present (CI);
// tools/gpu-test.sh runs them on the H200. A stream kept busy runs a kernel that spins for
// kBusyNs, so a reuse that comes before the free completed shows; the memory behind a block is
// seen by its addresses only (physical aliases are checked with data in gpu_test.cpp's stress).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "allocator_contract.hpp"
#include "cuarena/cuda_backend.hpp"
#include "device_backend_contract.hpp"
#include "gpu/gpu_lag.cuh"

namespace cuarena::conformance {
namespace {

constexpr std::uint64_t kBusyNs = 200'000'000;
constexpr int kOrderProbeMs = 20;  // well inside kBusyNs

std::string gpu_skip_reason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return "";
  return "no CUDA device here: GPU tests run on the H200 (tools/gpu-test.sh)";
}

// Three non-blocking streams on device 0, destroyed last.
struct Streams {
  Streams() {
    for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~Streams() {
    cudaDeviceSynchronize();
    for (auto& s : streams) cudaStreamDestroy(s);
  }
  StreamId operator()(int i) const { return reinterpret_cast<StreamId>(streams.at(i - 1)); }
  std::array<cudaStream_t, 3> streams{};
};

template <Upstream U>
struct CudaBackendHarness {
  static constexpr const char* kName = to_string(U);
  static constexpr bool kMapping = U == Upstream::kVmm;
  static constexpr bool kEnforcesCapacity = U == Upstream::kVmm;  // else the core's limit
  static std::string skip_reason() { return gpu_skip_reason(); }
  explicit CudaBackendHarness(std::size_t capacity) : b(make_cuda_backend(U, 0, capacity)) {}
  DeviceBackend& backend() { return *b; }
  StreamId stream(int i) { return streams(i); }
  void keep_busy(StreamId s) { replay::launch_busy(kBusyNs, reinterpret_cast<void*>(s)); }
  Streams streams;
  std::unique_ptr<CudaBackend> b;
};

using CudaBackends =
    ::testing::Types<CudaBackendHarness<Upstream::kVmm>, CudaBackendHarness<Upstream::kAsync>,
                     CudaBackendHarness<Upstream::kMalloc>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, DeviceBackendContract, CudaBackends, HarnessName);

template <Upstream U>
struct CudaAllocatorHarness : AllocatorHarness {
  static constexpr const char* kName = to_string(U);
  static std::string skip_reason() { return gpu_skip_reason(); }
  explicit CudaAllocatorHarness(std::size_t capacity)
      : b(make_cuda_backend(U, 0, capacity)),
        alloc(*b, Config::parse(std::string("upstream:") + to_string(U))) {
    a = &alloc;
  }
  StreamId stream(int i) { return streams(i); }
  void keep_busy(StreamId s) { replay::launch_busy(kBusyNs, reinterpret_cast<void*>(s)); }
  // Seen on the device: while s still runs its busy kernel, an event recorded on t now stays
  // incomplete for kOrderProbeMs only if t waits for s.
  bool ordered_after(StreamId t, StreamId s) {
    cudaEvent_t on_t = nullptr, on_s = nullptr;
    cudaEventCreateWithFlags(&on_t, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&on_s, cudaEventDisableTiming);
    cudaEventRecord(on_s, reinterpret_cast<cudaStream_t>(s));
    cudaEventRecord(on_t, reinterpret_cast<cudaStream_t>(t));
    std::this_thread::sleep_for(std::chrono::milliseconds(kOrderProbeMs));
    const bool t_done = cudaEventQuery(on_t) == cudaSuccess;
    const bool s_done = cudaEventQuery(on_s) == cudaSuccess;
    (void)cudaGetLastError();  // cudaErrorNotReady is an answer, not the program's error
    cudaEventSynchronize(on_t);
    cudaEventDestroy(on_t);
    cudaEventDestroy(on_s);
    EXPECT_FALSE(s_done) << "stream 1's busy kernel ended before the probe: raise kBusyNs";
    return !t_done;
  }
  void finish_work() {
    for (int i = 0; i < 2; ++i) {
      cudaDeviceSynchronize();
      alloc.process_events();  // the second round sees the events the first recorded complete
    }
  }
  std::optional<std::size_t> device_bytes() const { return std::nullopt; }
  Extents physical(const void* p, std::size_t bytes) const { return virtual_extents(p, bytes); }

  Streams streams;
  std::unique_ptr<CudaBackend> b;
  Allocator alloc;
};

using CudaAllocators =
    ::testing::Types<CudaAllocatorHarness<Upstream::kVmm>, CudaAllocatorHarness<Upstream::kAsync>,
                     CudaAllocatorHarness<Upstream::kMalloc>>;
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, AllocatorContract, CudaAllocators, HarnessName);

}  // namespace
}  // namespace cuarena::conformance
