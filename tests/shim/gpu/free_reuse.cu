// shim_free_reuse: a block freed while a kernel still uses it must not be handed to other work
// before that kernel has finished, although (under the shim) the free no longer waits for it.
//
// The kernel on stream A (non-blocking) spins ~200 ms, writes pattern P1 into block X, spins
// another ~50 ms, then copies X into a result buffer R that stays allocated. The host frees X
// right after the launch, allocates a block Y of the same size, and a kernel on stream B
// (non-blocking, no dependency on A) writes P2 into Y. If Y were X before A finished:
//   - B's write lands while A spins before its own write: A then overwrites Y, so Y != P2;
//   - B's write lands while A spins between its write and its copy: R gets P2, so R != P1.
// Either way a check below fails. Y may be X (reuse once A is done, or an allocator that makes
// B wait for A); the program prints whether it was.
//
// Cases, each with a small (4 KiB, a size class) and a large (8 MiB, mapped pages) block:
//   free_then_alloc_<api>   cudaFree / cuMemFree_v2 (driver entry point) of X, then a new block
//                           from cudaMalloc, cuMemAlloc_v2, or cudaMallocAsync on B. Under
//                           --expect-shim the free must also return while A still runs (the
//                           shim's free does not synchronise the device).
//   blocking_<how>          the same with blocking streams, where the fence relies on CUDA's
//                           implicit synchronisation with the legacy stream: A and B both
//                           blocking streams; A the legacy stream and B blocking; and B a
//                           non-blocking stream created only after Y was handed out (the shim
//                           must make it wait for the fence).
// --expect-reuse (run under CUARENA_CONF=pending_free_bytes:1, where every free is fenced at
// once): Y must be X wherever Y comes from a synchronous allocation, so that every case tests the
// fence's order rather than an allocator that happened to pick another block.
//   async_<api>             X from the stream-ordered allocator on A, freed on A; Y allocated on
//                           B must not be memory A still uses; Z allocated on A again may be X
//                           (stream order) and is written on A after the kernel: checked too.
//                           Runtime (cudaMallocAsync), driver (cuMemAllocAsync) and the driver's
//                           per-thread-default-stream variants (cuMemAllocAsync_ptsz, with A the
//                           per-thread default stream).
#include <chrono>

#include "shim_test.cuh"

using namespace shimtest;

namespace {

constexpr std::uint64_t kSpinBeforeWriteNs = 200'000'000;
constexpr std::uint64_t kSpinBeforeCopyNs = 50'000'000;
constexpr std::uint32_t kP1 = 0x1111, kP2 = 0x2222, kP3 = 0x3333;
constexpr unsigned kBlocks = 8, kThreads = 256;  // few SMs: B's kernel runs beside it

// Spins, writes tag's pattern into x, spins, copies x into r. Each thread copies the words it
// wrote, read back through volatile so the store is not just forwarded.
__global__ void spin_write_copy_kernel(std::uint32_t* x, std::uint32_t* r, std::size_t n,
                                       std::uint32_t tag) {
  spin_for(kSpinBeforeWriteNs);
  const std::size_t first = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  const std::size_t step = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = first; i < n; i += step) x[i] = pattern_word(tag, i);
  __threadfence();
  spin_for(kSpinBeforeCopyNs);
  const volatile std::uint32_t* vx = x;
  for (std::size_t i = first; i < n; i += step) r[i] = vx[i];
}

enum class Api { Runtime, Driver, RuntimeAsync, DriverAsync, DriverAsyncPtsz };

const char* api_name(Api a) {
  switch (a) {
    case Api::Runtime:
      return "cudaMalloc/cudaFree";
    case Api::Driver:
      return "cuMemAlloc_v2/cuMemFree_v2";
    case Api::RuntimeAsync:
      return "cudaMallocAsync/cudaFreeAsync";
    case Api::DriverAsync:
      return "cuMemAllocAsync/cuMemFreeAsync";
    case Api::DriverAsyncPtsz:
      return "cuMemAllocAsync_ptsz/cuMemFreeAsync_ptsz";
  }
  return "?";
}

// Stream-ordered APIs use `s` (for the _ptsz variants, cudaStreamPerThread means the driver's
// stream 0, which they read as the calling thread's default stream).
std::uint32_t* alloc(Api api, std::size_t size, cudaStream_t s) {
  const Driver& d = Driver::get();
  void* p = nullptr;
  CUdeviceptr dp = 0;
  switch (api) {
    case Api::Runtime:
      CHECK(cudaMalloc(&p, size));
      break;
    case Api::RuntimeAsync:
      CHECK(cudaMallocAsync(&p, size, s));
      break;
    case Api::Driver:
      CHECK_DRV(d.mem_alloc(&dp, size));
      p = reinterpret_cast<void*>(dp);
      break;
    case Api::DriverAsync:
      CHECK_DRV(d.mem_alloc_async(&dp, size, reinterpret_cast<CUstream>(s)));
      p = reinterpret_cast<void*>(dp);
      break;
    case Api::DriverAsyncPtsz:
      CHECK_DRV(d.mem_alloc_async_ptsz(
          &dp, size, s == cudaStreamPerThread ? nullptr : reinterpret_cast<CUstream>(s)));
      p = reinterpret_cast<void*>(dp);
      break;
  }
  return static_cast<std::uint32_t*>(p);
}

void release(Api api, void* p, cudaStream_t s) {
  const Driver& d = Driver::get();
  const auto dp = reinterpret_cast<CUdeviceptr>(p);
  switch (api) {
    case Api::Runtime:
      CHECK(cudaFree(p));
      break;
    case Api::RuntimeAsync:
      CHECK(cudaFreeAsync(p, s));
      break;
    case Api::Driver:
      CHECK_DRV(d.mem_free(dp));
      break;
    case Api::DriverAsync:
      CHECK_DRV(d.mem_free_async(dp, reinterpret_cast<CUstream>(s)));
      break;
    case Api::DriverAsyncPtsz:
      CHECK_DRV(d.mem_free_async_ptsz(
          dp, s == cudaStreamPerThread ? nullptr : reinterpret_cast<CUstream>(s)));
      break;
  }
}

// Which streams A and B are.
enum class Kind {
  NonBlocking,       // both non-blocking (created before X)
  Blocking,          // both blocking
  LegacyA,           // A the legacy default stream, B blocking
  LateNonBlockingB,  // A blocking; B non-blocking, created after Y is allocated
};

struct Streams {
  cudaStream_t a = nullptr, b = nullptr;
  Kind kind;
  explicit Streams(Kind k = Kind::NonBlocking) : kind(k) {
    const unsigned flags = k == Kind::NonBlocking ? cudaStreamNonBlocking : cudaStreamDefault;
    if (k != Kind::LegacyA) CHECK(cudaStreamCreateWithFlags(&a, flags));
    if (k != Kind::LateNonBlockingB) CHECK(cudaStreamCreateWithFlags(&b, flags));
  }
  void late_b() {
    if (kind == Kind::LateNonBlockingB) CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  }
  ~Streams() {
    if (a) cudaStreamDestroy(a);
    if (b) cudaStreamDestroy(b);
  }
};

// Counts the words of p[0, n) that are not tag's pattern (synchronises the device).
unsigned long long wrong_words(const std::uint32_t* p, std::size_t n, std::uint32_t tag) {
  DeviceCounter errors;
  verify_words_kernel<<<grid_for(n), 256>>>(p, n, tag, errors.p);
  CHECK_LAUNCH();
  return errors.read();
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// X from `api`, freed with `api` right after the long kernel's launch; Y from `realloc_api`
// (on B where stream-ordered).
void free_then_alloc(Api api, Api realloc_api, std::size_t size, bool expect_shim,
                     bool expect_reuse, Kind kind = Kind::NonBlocking) {
  note("free with %s, reallocate with %s, %s blocks", api_name(api), api_name(realloc_api),
       human(size).c_str());
  Streams st(kind);
  const std::size_t n = size / sizeof(std::uint32_t);
  std::uint32_t* r = nullptr;
  CHECK(cudaMalloc(&r, size));
  CHECK(cudaMemset(r, 0, size));
  std::uint32_t* x = alloc(api, size, st.a);
  CHECK(cudaDeviceSynchronize());

  const auto t0 = std::chrono::steady_clock::now();
  spin_write_copy_kernel<<<kBlocks, kThreads, 0, st.a>>>(x, r, n, kP1);
  CHECK_LAUNCH();
  release(api, x, st.a);
  const double free_ms = ms_since(t0);
  const cudaError_t query = cudaStreamQuery(st.a);
  if (query != cudaErrorNotReady) CHECK(query);
  const bool a_running = query == cudaErrorNotReady;
  std::uint32_t* y = alloc(realloc_api, size, st.b);
  const double alloc_ms = ms_since(t0) - free_ms;
  st.late_b();
  fill_words_kernel<<<grid_for(n), 256, 0, st.b>>>(y, n, kP2);
  CHECK_LAUNCH();
  note("free returned after %.1f ms with A %s; the new block came %.1f ms later at %s address",
       free_ms, a_running ? "still running" : "finished", alloc_ms,
       y == x ? "the SAME" : "another");
  if (expect_shim)
    expect(a_running,
           "the free waited for the kernel on A (%.1f ms): under the shim a free must "
           "not synchronise the device",
           free_ms);
  if (expect_reuse && realloc_api != Api::RuntimeAsync)
    expect(y == x && alloc_ms < 50.0,
           "with pending_free_bytes:1 the shim should fence at the free and hand X out again "
           "at once (got %s address after %.1f ms): this case would not test the fence",
           y == x ? "the same" : "another", alloc_ms);
  CHECK(cudaDeviceSynchronize());

  const unsigned long long bad_r = wrong_words(r, n, kP1);
  const unsigned long long bad_y = wrong_words(y, n, kP2);
  expect(bad_r == 0,
         "R, A's copy of X, has %llu of %zu words that are not A's pattern: the new "
         "block Y was written while A still used X",
         bad_r, n);
  expect(bad_y == 0,
         "Y has %llu of %zu words that are not B's pattern: A wrote into Y after B "
         "(Y was X while A still ran)",
         bad_y, n);
  release(realloc_api, y, st.b);
  CHECK(cudaFree(r));
  CHECK(cudaDeviceSynchronize());
}

// X, Z on A and Y on B, all stream-ordered with `api`.
void async_cross_stream(Api api, std::size_t size) {
  note("%s, %s blocks", api_name(api), human(size).c_str());
  Streams st;
  const cudaStream_t a = api == Api::DriverAsyncPtsz ? cudaStreamPerThread : st.a;
  const std::size_t n = size / sizeof(std::uint32_t);
  std::uint32_t* r = nullptr;
  CHECK(cudaMalloc(&r, size));
  CHECK(cudaMemset(r, 0, size));
  CHECK(cudaDeviceSynchronize());

  std::uint32_t* x = alloc(api, size, a);
  spin_write_copy_kernel<<<kBlocks, kThreads, 0, a>>>(x, r, n, kP1);
  CHECK_LAUNCH();
  release(api, x, a);
  std::uint32_t* y = alloc(api, size, st.b);
  fill_words_kernel<<<grid_for(n), 256, 0, st.b>>>(y, n, kP2);
  CHECK_LAUNCH();
  std::uint32_t* z = alloc(api, size, a);
  fill_words_kernel<<<grid_for(n), 256, 0, a>>>(z, n, kP3);
  CHECK_LAUNCH();
  note("Y (on B) at %s address as X; Z (on A) at %s address as X", y == x ? "the SAME" : "another",
       z == x ? "the SAME" : "another");
  CHECK(cudaDeviceSynchronize());

  const unsigned long long bad_r = wrong_words(r, n, kP1);
  const unsigned long long bad_y = wrong_words(y, n, kP2);
  const unsigned long long bad_z = wrong_words(z, n, kP3);
  expect(bad_r == 0,
         "R, A's copy of X, has %llu of %zu wrong words: Y or Z was written while "
         "A still used X",
         bad_r, n);
  expect(bad_y == 0,
         "Y (allocated on B) has %llu of %zu wrong words: A wrote into it after B "
         "(B got memory A still used)",
         bad_y, n);
  expect(bad_z == 0, "Z (allocated on A after the free) has %llu of %zu wrong words", bad_z, n);
  release(api, y, st.b);
  release(api, z, a);
  CHECK(cudaFree(r));
  CHECK(cudaDeviceSynchronize());
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc, argv, "shim_free_reuse");
  const bool expect_shim = start(program, argc, argv) && has_flag(argc, argv, "--expect-shim");
  const bool expect_reuse = expect_shim && has_flag(argc, argv, "--expect-reuse");
  Driver::get();
  for (std::size_t size : {4 * KiB, 8 * MiB}) {
    const std::string sz = size < MiB ? "_small" : "_large";
    run_case(("free_then_alloc_runtime" + sz).c_str(),
             [&] { free_then_alloc(Api::Runtime, Api::Runtime, size, expect_shim, expect_reuse); });
    run_case(("free_then_alloc_driver" + sz).c_str(),
             [&] { free_then_alloc(Api::Driver, Api::Driver, size, expect_shim, expect_reuse); });
    run_case(("free_then_alloc_async_on_b" + sz).c_str(), [&] {
      free_then_alloc(Api::Runtime, Api::RuntimeAsync, size, expect_shim, expect_reuse);
    });
    run_case(("async_runtime" + sz).c_str(), [&] { async_cross_stream(Api::RuntimeAsync, size); });
    run_case(("async_driver" + sz).c_str(), [&] { async_cross_stream(Api::DriverAsync, size); });
    run_case(("async_driver_ptsz" + sz).c_str(),
             [&] { async_cross_stream(Api::DriverAsyncPtsz, size); });
  }
  // Last: these need every non-blocking stream of the cases above destroyed.
  for (std::size_t size : {4 * KiB, 8 * MiB}) {
    const std::string sz = size < MiB ? "_small" : "_large";
    run_case(("blocking_streams" + sz).c_str(), [&] {
      free_then_alloc(Api::Runtime, Api::Runtime, size, expect_shim, expect_reuse, Kind::Blocking);
    });
    run_case(("blocking_legacy_a" + sz).c_str(), [&] {
      free_then_alloc(Api::Driver, Api::Driver, size, expect_shim, expect_reuse, Kind::LegacyA);
    });
    run_case(("blocking_late_non_blocking_b" + sz).c_str(), [&] {
      free_then_alloc(Api::Runtime, Api::Runtime, size, expect_shim, expect_reuse,
                      Kind::LateNonBlockingB);
    });
  }
  return finish(program);
}
