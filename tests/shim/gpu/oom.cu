// shim_oom: running out of memory is an error code, never an exit, and allocation works again
// after frees.
//
// With --limit SIZE (or --limit-fraction F, F times the device's memory), the program expects a
// cap of that size, which the runner sets for the shim (CUARENA_CONF=memory_limit:256MiB, or
// per_process_memory_fraction:0.1). Without either it expects only the device's own capacity:
// the same cases then fill the whole GPU (natively, or through the shim's device limit), and the
// checks that need a cap are left out. Blocks are 64 MiB, each filled and verified.
//   runtime_fill_until_oom  cudaMalloc until it fails: the error is cudaErrorMemoryAllocation;
//                           under a cap at least 3 blocks fit and at most the cap's worth; after
//                           it cudaGetLastError holds no sticky error and kernels still run; the
//                           blocks' contents are intact
//   runtime_refill          after freeing everything, as many blocks fit again (under a cap,
//                           exactly as many; else at least one fewer)
//   oversize_request        one request larger than the cap (else twice the device) fails with
//                           cudaErrorMemoryAllocation (cudaMalloc and cudaMallocAsync), and a
//                           small one succeeds right after
//   driver_fill_until_oom   cuMemAlloc_v2 until CUDA_ERROR_OUT_OF_MEMORY, same bounds; after
//                           cuMemFree_v2 of all, cuMemAlloc_v2 succeeds again
//   async_fill_until_oom    cudaMallocAsync on a stream until cudaErrorMemoryAllocation, same
//                           bounds; after cudaFreeAsync of all, cudaMallocAsync succeeds again
//   reclaim_cached          (cap only) fill the cap with 256 KiB blocks, free them (the shim
//                           caches them), then 64 MiB blocks still fit as in the first case:
//                           cached memory is reclaimed before an out-of-memory answer
#include <cmath>
#include <vector>

#include "shim_test.cuh"

using namespace shimtest;

namespace {

constexpr std::size_t kBlock = 64 * MiB;

struct Limits {
  std::size_t cap = 0;     // the expected cap in bytes; 0: none but the device's memory
  std::size_t device = 0;  // the device's memory
};
Limits g;
DeviceCounter* g_errors = nullptr;

enum class Api { Runtime, Driver, Async };
cudaStream_t g_stream;

// Allocates one block; returns the error as the API's own code (0 on success).
int try_alloc(Api api, std::size_t size, void** p) {
  CUdeviceptr dp = 0;
  switch (api) {
    case Api::Runtime:
      return cudaMalloc(p, size);
    case Api::Async:
      return cudaMallocAsync(p, size, g_stream);
    case Api::Driver: {
      const CUresult r = Driver::get().mem_alloc(&dp, size);
      *p = reinterpret_cast<void*>(dp);
      return r;
    }
  }
  return -1;
}

void release(Api api, void* p) {
  switch (api) {
    case Api::Runtime:
      CHECK(cudaFree(p));
      break;
    case Api::Async:
      CHECK(cudaFreeAsync(p, g_stream));
      break;
    case Api::Driver:
      CHECK_DRV(Driver::get().mem_free(reinterpret_cast<CUdeviceptr>(p)));
      break;
  }
}

void release_all(Api api, std::vector<void*>& blocks) {
  for (void* p : blocks) release(api, p);
  blocks.clear();
  CHECK(cudaDeviceSynchronize());
  if (api == Api::Async) {  // natively the default pool keeps freed memory until trimmed
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cudaMemPoolTrimTo(pool, 0));
  }
}

bool is_oom(Api api, int e) {
  return api == Api::Driver ? e == CUDA_ERROR_OUT_OF_MEMORY : e == cudaErrorMemoryAllocation;
}

const char* error_name(Api api, int e) {
  return api == Api::Driver ? driver_error_name(CUresult(e)) : cudaGetErrorName(cudaError_t(e));
}

// Allocates `size` blocks until the first failure, filling each; checks the failure and the
// bounds, verifies the contents. Returns how many fitted (the blocks stay allocated).
std::size_t fill_until_oom(Api api, std::size_t size, std::vector<void*>& blocks) {
  const std::size_t cap_blocks = g.cap ? g.cap / size + 4 : g.device / size + 64;
  int err = 0;
  while (blocks.size() < cap_blocks) {
    void* p = nullptr;
    err = try_alloc(api, size, &p);
    if (err != 0) break;
    blocks.push_back(p);
    fill_words_kernel<<<grid_for(size / 4), 256, 0, api == Api::Async ? g_stream : nullptr>>>(
        static_cast<std::uint32_t*>(p), size / 4, std::uint32_t(blocks.size()));
    CHECK_LAUNCH();
  }
  const std::size_t n = blocks.size();
  note("%zu blocks of %s (%s) fitted; then %s", n, human(size).c_str(), human(n * size).c_str(),
       err ? error_name(api, err) : "no failure");
  expect(err != 0, "no out-of-memory error after %zu blocks (%s)", n, human(n * size).c_str());
  if (err != 0)
    expect(is_oom(api, err), "the failure is %s (%d), not %s", error_name(api, err), err,
           api == Api::Driver ? "CUDA_ERROR_OUT_OF_MEMORY" : "cudaErrorMemoryAllocation");
  if (g.cap) {
    expect(n * size <= g.cap, "%zu blocks (%s) fitted under a cap of %s", n,
           human(n * size).c_str(), human(g.cap).c_str());
    if (size == kBlock)
      expect(n >= 3, "only %zu 64 MiB blocks fitted under %s", n, human(g.cap).c_str());
  }
  if (api != Api::Driver) {
    // What the runtime remembers of the failure: natively the error, once (not sticky). A shim
    // that answers cudaMalloc itself may leave it unset; either is accepted, printed.
    const cudaError_t first = cudaGetLastError();
    const cudaError_t second = cudaGetLastError();
    note("cudaGetLastError after the failure: %s, then %s", cudaGetErrorName(first),
         cudaGetErrorName(second));
    expect(first == cudaSuccess || first == cudaErrorMemoryAllocation,
           "cudaGetLastError after an out-of-memory failure: %s", cudaGetErrorName(first));
    expect(second == cudaSuccess, "the error is sticky: cudaGetLastError again gives %s",
           cudaGetErrorName(second));
  }
  CHECK(cudaDeviceSynchronize());  // the context is still usable: the fills ran
  g_errors->reset();
  for (std::size_t i = 0; i < n; ++i)
    verify_words_kernel<<<grid_for(size / 4), 256>>>(static_cast<std::uint32_t*>(blocks[i]),
                                                     size / 4, std::uint32_t(i + 1), g_errors->p);
  CHECK_LAUNCH();
  const unsigned long long bad = g_errors->read();
  expect(bad == 0, "%llu words of the %zu blocks are not what was written", bad, n);
  return n;
}

std::size_t g_first_count = 0;

void runtime_fill_until_oom() {
  std::vector<void*> blocks;
  g_first_count = fill_until_oom(Api::Runtime, kBlock, blocks);
  release_all(Api::Runtime, blocks);
}

void runtime_refill() {
  std::vector<void*> blocks;
  const std::size_t n = fill_until_oom(Api::Runtime, kBlock, blocks);
  if (g.cap)
    expect(n == g_first_count, "after freeing all, %zu blocks fitted again, first %zu", n,
           g_first_count);
  else
    expect(n + 1 >= g_first_count, "after freeing all, %zu blocks fitted again, first %zu", n,
           g_first_count);
  release_all(Api::Runtime, blocks);
}

void oversize_request() {
  const std::size_t huge = g.cap ? g.cap + kBlock : 2 * g.device;
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, huge);
  expect(e == cudaErrorMemoryAllocation, "cudaMalloc(%s): %s, not cudaErrorMemoryAllocation",
         human(huge).c_str(), cudaGetErrorName(e));
  if (e == cudaSuccess) CHECK(cudaFree(p));
  cudaGetLastError();
  e = cudaMallocAsync(&p, huge, g_stream);
  expect(e == cudaErrorMemoryAllocation, "cudaMallocAsync(%s): %s, not cudaErrorMemoryAllocation",
         human(huge).c_str(), cudaGetErrorName(e));
  if (e == cudaSuccess) CHECK(cudaFreeAsync(p, g_stream));
  cudaGetLastError();
  CHECK(cudaMalloc(&p, MiB));
  fill_bytes(p, MiB, 5);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(p));
}

void api_fill_and_recover(Api api) {
  std::vector<void*> blocks;
  fill_until_oom(api, kBlock, blocks);
  release_all(api, blocks);
  void* p = nullptr;
  const int e = try_alloc(api, kBlock, &p);
  expect(e == 0, "after freeing all, a 64 MiB allocation fails: %s", error_name(api, e));
  if (e == 0) {
    blocks.push_back(p);
    release_all(api, blocks);
  }
}

void reclaim_cached() {
  std::vector<void*> small;
  const std::size_t n_small = fill_until_oom(Api::Runtime, 256 * KiB, small);
  release_all(Api::Runtime, small);
  std::vector<void*> big;
  const std::size_t n_big = fill_until_oom(Api::Runtime, kBlock, big);
  note("%zu blocks of 256 KiB, freed; then %zu of 64 MiB (a fresh start fitted %zu)", n_small,
       n_big, g_first_count);
  expect(n_big >= g_first_count,
         "after 256 KiB blocks were freed only %zu 64 MiB blocks fitted, "
         "%zu at first: cached memory was not reclaimed",
         n_big, g_first_count);
  release_all(Api::Runtime, big);
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc, argv, "shim_oom");
  start(program, argc, argv);
  Driver::get();
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  g.device = prop.totalGlobalMem;
  if (const char* v = flag_value(argc, argv, "--limit")) g.cap = parse_size("--limit", v);
  if (const char* v = flag_value(argc, argv, "--limit-fraction"))
    g.cap = std::size_t(std::strtod(v, nullptr) * double(g.device));
  std::printf("%s: expecting %s\n", program,
              g.cap ? ("a cap of " + human(g.cap)).c_str() : "no cap but the device's memory");
  CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  DeviceCounter errors;
  g_errors = &errors;

  run_case("runtime_fill_until_oom", runtime_fill_until_oom);
  run_case("runtime_refill", runtime_refill);
  run_case("oversize_request", oversize_request);
  run_case("driver_fill_until_oom", [] { api_fill_and_recover(Api::Driver); });
  run_case("async_fill_until_oom", [] { api_fill_and_recover(Api::Async); });
  if (g.cap)
    run_case("reclaim_cached", reclaim_cached);
  else
    skip_case("reclaim_cached", "needs --limit: without a cap nothing is cached to reclaim");
  std::size_t free_b = 0, total = 0;
  CHECK(cudaMemGetInfo(&free_b, &total));
  std::printf("%s: at the end cudaMemGetInfo says free %s of %s\n", program, human(free_b).c_str(),
              human(total).c_str());
  g_errors = nullptr;
  CHECK(cudaStreamDestroy(g_stream));
  return finish(program);
}
