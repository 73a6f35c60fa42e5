// What the shim's GPU programs share: checked CUDA calls, the driver entry points (looked up
// through cudaGetDriverEntryPointByVersion, never by linking libcuda), PASS/FAIL reporting, the
// shim's presence check, and the kernels that write and verify per-block patterns.
//
// Each program includes this once (the kernels are defined here, one translation unit each).
// Every CUDA call is checked: an unexpected error prints a FAIL line naming the call and exits 1.
// A check of behaviour (expect) prints what it saw and fails the case it belongs to; a program
// exits 1 when any case failed, 77 (skipped) where no CUDA device is visible.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

// cuda.h (driver types and prototypes only: the functions come from entry points) and the rows
// of the driver entry points.
#include "cuarena/driver_symbols.hpp"

namespace shimtest {

constexpr int kSkipExit = 77;  // CTest's SKIP_RETURN_CODE: no CUDA device here
constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// ---- checked calls ----------------------------------------------------------------------------

[[noreturn]] inline void die(const char* fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("FAIL ", stdout);
  std::vprintf(fmt, ap);
  std::fputs("\n", stdout);
  va_end(ap);
  std::fflush(stdout);
  std::exit(1);
}

inline void check_rt(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    die("%s -> %s (%s) at %s:%d", call, cudaGetErrorName(e), cudaGetErrorString(e), file, line);
}

const char* driver_error_name(CUresult r);

inline void check_drv(CUresult r, const char* call, const char* file, int line) {
  if (r != CUDA_SUCCESS)
    die("%s -> %s (%d) at %s:%d", call, driver_error_name(r), int(r), file, line);
}

#define CHECK(call) ::shimtest::check_rt((call), #call, __FILE__, __LINE__)
#define CHECK_DRV(call) ::shimtest::check_drv((call), #call, __FILE__, __LINE__)
// After a kernel launch: the launch itself (configuration errors) is checked at once.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

// ---- driver entry points ----------------------------------------------------------------------

// The driver functions the programs call (the test rows of driver_symbols.def, each of the ABI
// cuda.h maps its name to), obtained as cudart obtains them: through cuGetProcAddress, which the
// shim wraps, by name and version, the per-thread variants with cudaEnablePerThreadDefaultStream.
struct Driver {
#define CUARENA_DRIVER_SYMBOL(member, api, abi, version, per_thread, backend, shim, tests) \
  CUARENA_DRIVER_IF(tests, decltype(&::api) member = nullptr;)
#include "cuarena/driver_symbols.def"
#undef CUARENA_DRIVER_SYMBOL

  static const Driver& get();
};

template <class Fn>
void resolve(Fn& fn, const char* symbol, unsigned int cuda_version, bool per_thread) {
  const unsigned long long flags =
      per_thread ? cudaEnablePerThreadDefaultStream : cudaEnableDefault;
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, cuda_version, flags, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr)
    die("cudaGetDriverEntryPointByVersion(%s) -> %s, status %d", symbol, cudaGetErrorName(e),
        int(status));
  fn = reinterpret_cast<Fn>(p);
}

inline const Driver& Driver::get() {
  static const Driver d = [] {
    Driver x;
#define CUARENA_DRIVER_SYMBOL(member, api, abi, version, per_thread, backend, shim, tests) \
  CUARENA_DRIVER_IF(tests, resolve(x.member, #api, version, per_thread);)
#include "cuarena/driver_symbols.def"
#undef CUARENA_DRIVER_SYMBOL
    return x;
  }();
  return d;
}

inline const char* driver_error_name(CUresult r) {
  const char* name = nullptr;
  if (Driver::get().get_error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
  return name ? name : "unknown CUresult";
}

// ---- cases and checks -------------------------------------------------------------------------

// The checks of the case running now. expect() may be called from several host threads.
struct CaseState {
  std::atomic<int> failed_checks{0};
  std::mutex print;
};
inline CaseState& case_state() {
  static CaseState s;
  return s;
}

inline bool expect(bool ok, const char* fmt, ...) {
  if (ok) return true;
  CaseState& s = case_state();
  const int n = ++s.failed_checks;
  if (n <= 20) {  // enough to see the pattern; the count is reported in full
    std::lock_guard<std::mutex> lock(s.print);
    std::va_list ap;
    va_start(ap, fmt);
    std::fputs("  check failed: ", stdout);
    std::vprintf(fmt, ap);
    std::fputs("\n", stdout);
    va_end(ap);
    std::fflush(stdout);
  }
  return false;
}

inline void note(const char* fmt, ...) {
  std::lock_guard<std::mutex> lock(case_state().print);
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("  ", stdout);
  std::vprintf(fmt, ap);
  std::fputs("\n", stdout);
  va_end(ap);
  std::fflush(stdout);
}

struct Tally {
  int passed = 0, failed = 0, skipped = 0;
};
inline Tally& tally() {
  static Tally t;
  return t;
}

// --only NAME[,NAME...]: the cases to run (others are not run, nor counted); empty: all.
inline std::string& only_cases() {
  static std::string s;
  return s;
}

inline bool selected(const char* name) {
  const std::string& only = only_cases();
  if (only.empty() || std::strncmp(name, "shim_", 5) == 0) return true;  // presence: always
  const std::string list = "," + only + ",";
  return list.find("," + std::string(name) + ",") != std::string::npos;
}

// Runs one case: its checks' failures make it FAIL; a CUDA error inside exits the program (FAIL).
template <class Fn>
void run_case(const char* name, Fn&& fn) {
  if (!selected(name)) return;
  std::printf("-- %s\n", name);
  std::fflush(stdout);
  case_state().failed_checks = 0;
  fn();
  const int bad = case_state().failed_checks;
  if (bad == 0) {
    tally().passed++;
    std::printf("PASS %s\n", name);
  } else {
    tally().failed++;
    std::printf("FAIL %s (%d failed checks)\n", name, bad);
  }
  std::fflush(stdout);
}

inline void skip_case(const char* name, const char* why) {
  if (!selected(name)) return;
  tally().skipped++;
  std::printf("SKIP %s (%s)\n", name, why);
  std::fflush(stdout);
}

// The program's closing line and exit code.
inline int finish(const char* program) {
  const Tally& t = tally();
  std::printf("%s: %d passed, %d failed, %d skipped\n", program, t.passed, t.failed, t.skipped);
  std::fflush(stdout);
  return t.failed == 0 ? 0 : 1;
}

// ---- command line and environment ----------------------------------------------------------

inline bool has_flag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

// The value after `flag`, or nullptr.
inline const char* flag_value(int argc, char** argv, const char* flag) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return argv[i + 1];
  return nullptr;
}

// A flag's size: bytes, or a number with KiB, MiB or GiB ("256MiB", "1.5GiB").
inline std::size_t parse_size(const char* flag, const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  std::size_t unit = 1;
  if (std::strcmp(end, "KiB") == 0)
    unit = KiB;
  else if (std::strcmp(end, "MiB") == 0)
    unit = MiB;
  else if (std::strcmp(end, "GiB") == 0)
    unit = 1024 * MiB;
  else if (*end != '\0' || end == s || v < 0)
    die("%s %s: give bytes, or a number with KiB, MiB or GiB", flag, s);
  return std::size_t(v * double(unit));
}

// The shim exports cuarena_preload_version; nothing else in a process does.
inline bool shim_present() { return dlsym(RTLD_DEFAULT, "cuarena_preload_version") != nullptr; }

// argv[0] without its directory, for messages.
inline const char* program_name(int argc, char** argv, const char* fallback) {
  if (argc < 1 || argv[0] == nullptr) return fallback;
  const char* slash = std::strrchr(argv[0], '/');
  return slash ? slash + 1 : argv[0];
}

// The start of every program: skip (exit 77) without a device, then the presence case:
// --expect-shim requires the shim, --expect-no-shim its absence (--only selects cases, for
// debugging one). Returns whether the shim is present.
inline bool start(const char* program, int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (const char* only = flag_value(argc, argv, "--only")) only_cases() = only;
  const bool present = shim_present();
  std::printf("%s: shim %s\n", program,
              present ? "present (cuarena_preload_version found)" : "absent");
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIP %s: no CUDA device (%s)\n", program, cudaGetErrorName(e));
    std::exit(kSkipExit);
  }
  CHECK(cudaSetDevice(0));
  if (has_flag(argc, argv, "--expect-shim"))
    run_case("shim_present", [&] {
      expect(present,
             "--expect-shim: dlsym(RTLD_DEFAULT, \"cuarena_preload_version\") is NULL: "
             "the program did not run under libcuarena_preload.so");
    });
  if (has_flag(argc, argv, "--expect-no-shim"))
    run_case("shim_absent", [&] {
      expect(!present, "--expect-no-shim: cuarena_preload_version found: LD_PRELOAD leaked in?");
    });
  return present;
}

// ---- patterns and kernels ---------------------------------------------------------------------

// The byte at offset i of a block tagged `tag`: a hash, so a block holding another tag's bytes,
// or its own shifted by any offset, does not verify.
__host__ __device__ inline std::uint8_t pattern_byte(std::uint32_t tag, std::uint64_t i) {
  std::uint64_t x = (std::uint64_t{tag} << 40) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<std::uint8_t>(x);
}

// The 32-bit word at index i of a block tagged `tag` (used where kernels move words).
__host__ __device__ inline std::uint32_t pattern_word(std::uint32_t tag, std::uint64_t i) {
  std::uint64_t x = (std::uint64_t{tag} << 36) ^ i ^ 0x9e3779b97f4a7c15ULL;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  return static_cast<std::uint32_t>(x ^ (x >> 32));
}

__global__ void fill_bytes_kernel(std::uint8_t* p, std::size_t n, std::uint32_t tag) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = pattern_byte(tag, i);
}

// Adds the number of bytes of p[0, n) that are not tag's pattern to *errors.
__global__ void verify_bytes_kernel(const std::uint8_t* p, std::size_t n, std::uint32_t tag,
                                    unsigned long long* errors) {
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    bad += p[i] != pattern_byte(tag, i);
  if (bad) atomicAdd(errors, bad);
}

__global__ void fill_words_kernel(std::uint32_t* p, std::size_t n, std::uint32_t tag) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = pattern_word(tag, i);
}

__global__ void verify_words_kernel(const std::uint32_t* p, std::size_t n, std::uint32_t tag,
                                    unsigned long long* errors) {
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    bad += p[i] != pattern_word(tag, i);
  if (bad) atomicAdd(errors, bad);
}

// A grid small enough to leave most multiprocessors to other streams, big enough to be quick.
inline unsigned grid_for(std::size_t n, unsigned threads = 256, unsigned max_blocks = 256) {
  const std::size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < max_blocks ? blocks : max_blocks));
}

inline void fill_bytes(void* p, std::size_t n, std::uint32_t tag, cudaStream_t s = 0) {
  fill_bytes_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<std::uint8_t*>(p), n, tag);
  CHECK_LAUNCH();
}

inline void verify_bytes(const void* p, std::size_t n, std::uint32_t tag,
                         unsigned long long* errors, cudaStream_t s = 0) {
  verify_bytes_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const std::uint8_t*>(p), n, tag,
                                                  errors);
  CHECK_LAUNCH();
}

// Device nanoseconds (%globaltimer).
__device__ inline std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every thread waits until `ns` have passed since it started.
__device__ inline void spin_for(std::uint64_t ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) {
  }
}

// Keeps a stream busy for `ns` (one thread): work queued behind it waits that long.
__global__ void spin_kernel(std::uint64_t ns) { spin_for(ns); }

// A device counter (unsigned long long) with a host read-back.
struct DeviceCounter {
  unsigned long long* p = nullptr;
  DeviceCounter() {
    CHECK(cudaMalloc(&p, sizeof *p));
    CHECK(cudaMemset(p, 0, sizeof *p));
  }
  ~DeviceCounter() { cudaFree(p); }
  DeviceCounter(const DeviceCounter&) = delete;
  DeviceCounter& operator=(const DeviceCounter&) = delete;
  unsigned long long read() const {  // synchronises the device
    unsigned long long v = 0;
    CHECK(cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }
  void reset() { CHECK(cudaMemset(p, 0, sizeof *p)); }
};

// "12.0 MiB" / "512 B", for messages.
inline std::string human(std::size_t n) {
  char buf[32];
  if (n >= MiB)
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / double(MiB));
  else if (n >= KiB)
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(n) / double(KiB));
  else
    std::snprintf(buf, sizeof buf, "%zu B", n);
  return buf;
}

}  // namespace shimtest
