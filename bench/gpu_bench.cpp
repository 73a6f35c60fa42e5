// cuarena_gpu_bench: allocator speed on a real GPU, every allocator in the same run.
//
// Allocators (the names in the benchmark names and labels):
//   cuarena       cuarena::Allocator over the CUDA backend of the configured upstream (vmm unless
//                 $CUARENA_CONF says otherwise) on device 0, via replay::make_cuarena_gpu
//   cuda-async    cudaMallocFromPoolAsync / cudaFreeAsync on a private pool with release threshold
//                 UINT64_MAX, via replay::make_cuda_async
//   cub           cub::CachingDeviceAllocator, CUB's default configuration (bins up to 2 MiB,
//                 ~6 MiB cached; larger blocks are cudaMalloc'd / cudaFree'd per call), via
//                 replay::make_cub (tools/replay/src/cub_caching.hpp)
//   torch-native  PyTorch's CUDACachingAllocator (raw_alloc_with_stream / raw_delete), only in a
//                 build with -DCUARENA_WITH_TORCH=ON (torch_adapter.hpp). Its mode comes from
//                 PYTORCH_CUDA_ALLOC_CONF; the label shows it when that is set.
//
// Benchmarks (all on device 0, wall-clock time; every allocator instance is created for the run
// and destroyed after it, releasing its memory, so allocators do not hold memory for each other;
// torch's allocator is process-wide, so its "destruction" is cca::emptyCache()):
//   AllocFree/<alloc>/<bytes>   one allocate + one free of <bytes> per iteration on one
//                               non-blocking stream, after a warm-up that leaves the cache warm.
//                               No device synchronisation inside the timed loop beyond what the
//                               allocator does itself. items/s = pairs/s.
//   MixedTrace/<alloc>          the alloc / free_completed stream of gpt2_train (recorded on an
//                               H200), one full pass per iteration on one non-blocking stream per
//                               trace stream; blocks the trace leaves live are freed at the end of
//                               each pass. An untimed warm-up pass first fills the cache and
//                               measures peak reserved. items/s = allocator calls (events)/s.
//   Threads/<alloc>/real_time/threads:N
//                               N host threads sharing one allocator instance, each on its own
//                               non-blocking stream: per iteration it allocates a 64 KiB and a
//                               4 MiB block and frees the oldest of its last 4 of each (so every
//                               allocation is served by a block other than the one just freed).
//                               items/s = allocate+free pairs/s summed over the threads.
//
// Counters: `<counter>/iter` are the allocator's own counters (cuarena: driver calls, maps,
// unmaps, events...; torch: cudaMalloc/cudaFree calls) per iteration (per pass for MixedTrace);
// reserved_MiB is the memory the allocator holds after the run (its own accounting);
// MixedTrace adds peak_reserved_GiB and reserved_ratio (peak reserved / peak requested) of the
// warm-up pass. Any failure (an allocation that returns null, a CUDA error, an allocator
// exception) ends that benchmark with SkipWithError.
//
// Without a CUDA device it prints one line and exits 0 without registering anything.
//
//   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release [-DCUARENA_WITH_TORCH=ON]
//   cmake --build build --target cuarena_gpu_bench
//   ./build/bin/cuarena_gpu_bench [--benchmark_filter=AllocFree/cuarena]
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuarena/config.hpp"
#include "cuarena/replay/cub_caching.hpp"
#include "cuarena/replay/cuda_check.hpp"
#include "cuarena/replay/gpu_replay.hpp"
#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/trace.hpp"
#include "trace_ops.hpp"
#ifdef CUARENA_BENCH_TORCH
#include "torch_adapter.hpp"
#endif

#ifndef CUARENA_BENCH_TRACE_DIR
#error "CUARENA_BENCH_TRACE_DIR must name tests/data/traces (set by bench/CMakeLists.txt)"
#endif

namespace {

namespace replay = cuarena::replay;
using replay::GpuAllocator;

constexpr int kDevice = 0;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

// CUDA errors: the replayer's one helper, with the benchmark's name in front.
void check_cuda(cudaError_t err, const char* what) {
  replay::check_cuda(err, what, "cuarena_gpu_bench");
}

// ---------------------------------------------------------------------------------------------
// The allocators. Each factory builds a fresh instance (on the calling thread's device 0).
// Every allocate/deallocate below is safe to call from several host threads at once (the
// Threads benchmark relies on it): cuarena and CUB lock their own mutex, the CUDA runtime and
// PyTorch's allocator are thread-safe.

#ifdef CUARENA_BENCH_TORCH
namespace torch_native = cuarena::bench::torch_native;

class TorchGpu final : public GpuAllocator {
 public:
  TorchGpu() {
    if (!torch_native::init()) throw std::runtime_error(torch_native::last_error());
  }
  // The allocator is process-wide: hand its cache back so the next benchmark starts clean.
  ~TorchGpu() override {
    cudaDeviceSynchronize();
    torch_native::empty_cache();
  }
  std::string name() const override { return "torch-native"; }
  void* allocate(std::size_t bytes, void* stream) override {
    void* p = nullptr;
    switch (torch_native::allocate(bytes, stream, &p)) {
      case torch_native::AllocStatus::kOk:
        return p;
      case torch_native::AllocStatus::kOutOfMemory:
        return nullptr;
      case torch_native::AllocStatus::kError:
        break;
    }
    throw std::runtime_error(torch_native::last_error());
  }
  void deallocate(void* ptr, std::size_t, void*) override {
    if (!torch_native::deallocate(ptr)) throw std::runtime_error(torch_native::last_error());
  }
  std::size_t reserved_bytes() override {
    return std::size_t(std::max<std::int64_t>(0, stats().reserved_bytes));
  }
  std::map<std::string, std::int64_t> counters() override {
    const torch_native::Stats s = stats();
    return {{"num_device_alloc", s.num_device_alloc},
            {"num_device_free", s.num_device_free},
            {"num_alloc_retries", s.num_alloc_retries}};
  }

 private:
  static torch_native::Stats stats() {
    torch_native::Stats s;
    if (!torch_native::stats(kDevice, &s)) throw std::runtime_error(torch_native::last_error());
    return s;
  }
};
#endif

struct AllocatorKind {
  std::string name;   // in benchmark names
  std::string label;  // the benchmark's label: the name, plus the configuration if not default
  std::function<std::unique_ptr<GpuAllocator>()> make;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<AllocatorKind> allocator_kinds() {
  std::vector<AllocatorKind> kinds;
  const std::string conf = env("CUARENA_CONF");
  kinds.push_back({"cuarena", conf.empty() ? "cuarena" : "cuarena CUARENA_CONF=" + conf,
                   [] { return replay::make_cuarena_gpu(kDevice, cuarena::Config::from_env()); }});
  kinds.push_back({"cuda-async", "cuda-async", [] { return replay::make_cuda_async(kDevice); }});
  kinds.push_back(
      {"cub", "cub", [] { return replay::make_cub(kDevice, replay::kCubDefaultMaxCachedBytes); }});
#ifdef CUARENA_BENCH_TORCH
  const std::string torch_conf = env("PYTORCH_CUDA_ALLOC_CONF");
  kinds.push_back(
      {"torch-native",
       torch_conf.empty() ? "torch-native" : "torch-native PYTORCH_CUDA_ALLOC_CONF=" + torch_conf,
       [] {
         check_cuda(cudaSetDevice(kDevice), "cudaSetDevice");
         return std::unique_ptr<GpuAllocator>(std::make_unique<TorchGpu>());
       }});
#endif
  return kinds;
}

// ---------------------------------------------------------------------------------------------
// Shared helpers.

// Non-blocking streams and the allocator that uses them. Destruction waits for the streams,
// destroys the allocator (releasing its memory), then the streams.
struct Session {
  std::vector<cudaStream_t> streams;
  std::unique_ptr<GpuAllocator> alloc;

  Session(const AllocatorKind& kind, std::size_t num_streams) {
    try {
      check_cuda(cudaSetDevice(kDevice), "cudaSetDevice");
      for (std::size_t i = 0; i < num_streams; ++i) {
        cudaStream_t s = nullptr;
        check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        streams.push_back(s);
      }
      alloc = kind.make();
    } catch (...) {
      close();
      throw;
    }
  }
  ~Session() { close(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Waits for every stream; throws on an asynchronous CUDA error.
  void synchronize() const {
    for (cudaStream_t s : streams) check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }

 private:
  void close() noexcept {
    for (cudaStream_t s : streams) cudaStreamSynchronize(s);
    alloc.reset();
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    streams.clear();
  }
};

// `<key>/iter`: how much each of the allocator's counters grew per iteration.
void add_counter_deltas(benchmark::State& state, const std::map<std::string, std::int64_t>& before,
                        const std::map<std::string, std::int64_t>& after) {
  for (const auto& [key, value] : after) {
    const auto it = before.find(key);
    const std::int64_t delta = value - (it == before.end() ? 0 : it->second);
    state.counters[key + "/iter"] =
        benchmark::Counter(static_cast<double>(delta), benchmark::Counter::kAvgIterations);
  }
}

// ---------------------------------------------------------------------------------------------
// AllocFree/<alloc>/<bytes>

void BM_AllocFree(benchmark::State& state, const AllocatorKind* kind) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  state.SetLabel(kind->label);
  try {
    Session session(*kind, 1);
    GpuAllocator& alloc = *session.alloc;
    void* const stream = session.streams[0];
    // Warm-up: the first request takes fresh memory from the device; the loop times the cache.
    for (int i = 0; i < 4; ++i) {
      void* p = alloc.allocate(bytes, stream);
      if (p == nullptr) {
        state.SkipWithError("warm-up allocation returned null (out of memory)");
        return;
      }
      alloc.deallocate(p, bytes, stream);
    }
    session.synchronize();
    const auto before = alloc.counters();

    bool failed = false;
    for (auto _ : state) {
      void* p = alloc.allocate(bytes, stream);
      if (p == nullptr) {
        failed = true;
        state.SkipWithError("allocation returned null (out of memory)");
        break;
      }
      benchmark::DoNotOptimize(p);
      alloc.deallocate(p, bytes, stream);
    }
    if (failed) return;

    session.synchronize();
    state.SetItemsProcessed(state.iterations());
    add_counter_deltas(state, before, alloc.counters());
    state.counters["reserved_MiB"] = static_cast<double>(alloc.reserved_bytes()) / kMiB;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// MixedTrace/<alloc>
//
// The trace's alloc / free_completed events are compiled once into operations on dense slot and
// stream numbers, so the timed loop does no hashing of trace addresses. Trace quirks are
// handled as replay_gpu handles them: a free of an address never allocated is dropped; an alloc
// at an address still live first frees the old block (the trace lost its free).

struct TraceOps {
  std::string error;  // non-empty: unusable, says why
  std::string name;
  cuarena::bench::TraceOps compiled;
  std::uint64_t peak_requested = 0;
};

TraceOps compile_trace(const std::string& name) {
  TraceOps out;
  out.name = name;
  const std::string path = std::string(CUARENA_BENCH_TRACE_DIR) + "/" + name + ".pickle.gz";
  std::vector<replay::Event> events;
  try {
    const std::vector<replay::Event> all = replay::load_trace(path);
    const std::vector<int> devices = replay::devices_in(all);
    if (devices.empty()) {
      out.error = path + ": the trace has no events";
      return out;
    }
    events = replay::device_events(all, devices.front());  // gpt2_train records one device
    if (devices.size() > 1) out.name += " cuda" + std::to_string(devices.front());
  } catch (const std::exception& e) {
    out.error = std::string("cannot load trace: ") + e.what();
    return out;
  }
  out.peak_requested = replay::peak_requested(events);
  out.compiled = cuarena::bench::compile_trace_ops(events);
  if (out.compiled.ops.empty()) out.error = name + ": no alloc/free_completed events";
  return out;
}

void BM_MixedTrace(benchmark::State& state, const AllocatorKind* kind) {
  state.SetLabel(kind->label);
  static const TraceOps trace = compile_trace("gpt2_train");  // once, untimed
  if (!trace.error.empty()) {
    state.SkipWithError(trace.error.c_str());
    return;
  }
  state.SetLabel(kind->label + " " + trace.name);
  try {
    Session session(*kind, trace.compiled.stream_handles.size());
    GpuAllocator& alloc = *session.alloc;
    // The live block in each slot and the operation that allocated it (its size and stream).
    struct Slot {
      void* ptr = nullptr;
      const cuarena::bench::TraceOp* op = nullptr;
    };
    std::vector<Slot> slots(trace.compiled.slots);
    std::size_t peak_reserved = 0;

    // One pass; false (after freeing what it holds) when an allocation returned null.
    auto pass = [&](bool track_reserved) {
      for (const cuarena::bench::TraceOp& op : trace.compiled.ops) {
        void* const stream = session.streams[op.stream];
        if (op.alloc) {
          void* p = alloc.allocate(op.size, stream);
          if (p == nullptr) {
            for (Slot& s : slots) {
              if (s.ptr == nullptr) continue;
              alloc.deallocate(s.ptr, s.op->size, session.streams[s.op->stream]);
              s.ptr = nullptr;
            }
            return false;
          }
          slots[op.slot] = {p, &op};
          if (track_reserved) peak_reserved = std::max(peak_reserved, alloc.reserved_bytes());
        } else {
          alloc.deallocate(slots[op.slot].ptr, op.size, stream);
          slots[op.slot].ptr = nullptr;
        }
      }
      return true;
    };
    if (!pass(true)) {  // warm-up: fills the cache and measures peak reserved
      state.SkipWithError("warm-up pass: allocation returned null (out of memory)");
      return;
    }
    session.synchronize();
    const auto before = alloc.counters();

    bool failed = false;
    for (auto _ : state) {
      if (!pass(false)) {
        failed = true;
        state.SkipWithError("allocation returned null (out of memory)");
        break;
      }
    }
    if (failed) return;

    session.synchronize();
    state.SetItemsProcessed(state.iterations() *
                            static_cast<std::int64_t>(trace.compiled.ops.size()));
    add_counter_deltas(state, before, alloc.counters());
    state.counters["events/pass"] = static_cast<double>(trace.compiled.ops.size());
    state.counters["peak_reserved_GiB"] = static_cast<double>(peak_reserved) / kGiB;
    state.counters["reserved_ratio"] =
        trace.peak_requested
            ? static_cast<double>(peak_reserved) / static_cast<double>(trace.peak_requested)
            : 0.0;
    state.counters["reserved_MiB"] = static_cast<double>(alloc.reserved_bytes()) / kMiB;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Threads/<alloc>/real_time/threads:N
//
// Thread 0 builds the shared state (allocator, one stream per thread, each thread's ring of live
// blocks, warmed) before the timed loop and publishes it through an atomic pointer (release);
// Google Benchmark starts no thread's loop before every thread has reached it, so every thread
// then reads (acquire) a complete state. A thread touches only its own stream and ring. Thread
// 0 ends its loop normally only after every other thread has ended its own (or returned), so it
// then frees the rings and tears the state down; on an error it leaves that to the next run's
// setup, or to main() after the last run.

constexpr std::size_t kThreadSmall = 64 * 1024;        // cuarena: slab path
constexpr std::size_t kThreadLarge = 4 * 1024 * 1024;  // cuarena: block-pool path
constexpr std::size_t kRing = 4;                       // live blocks of each size per thread

struct ThreadRing {
  void* small[kRing] = {};
  void* large[kRing] = {};
  std::size_t next = 0;  // oldest entry, replaced next
};

struct ThreadsShared {
  std::unique_ptr<Session> session;  // streams[t] is thread t's
  std::vector<ThreadRing> rings;     // rings[t] is thread t's
  std::map<std::string, std::int64_t> counters_before;
};
ThreadsShared g_threads;
std::atomic<ThreadsShared*> g_threads_ready{nullptr};

// One step of thread `t`: allocate a small and a large block, free the oldest of each.
// Returns an error message, or nullptr.
const char* ring_step(GpuAllocator& alloc, ThreadRing& ring, void* stream) {
  void* small = alloc.allocate(kThreadSmall, stream);
  if (small == nullptr) return "allocation of 64 KiB returned null (out of memory)";
  void* large = alloc.allocate(kThreadLarge, stream);
  if (large == nullptr) {
    alloc.deallocate(small, kThreadSmall, stream);
    return "allocation of 4 MiB returned null (out of memory)";
  }
  const std::size_t i = ring.next;
  if (ring.small[i] != nullptr) alloc.deallocate(ring.small[i], kThreadSmall, stream);
  if (ring.large[i] != nullptr) alloc.deallocate(ring.large[i], kThreadLarge, stream);
  ring.small[i] = small;
  ring.large[i] = large;
  ring.next = (i + 1) % kRing;
  return nullptr;
}

// Frees every ring's blocks and destroys the shared state, even when a free fails (then it
// throws that failure afterwards). No other thread may be using the state.
void teardown_threads() {
  g_threads_ready.store(nullptr, std::memory_order_relaxed);
  std::string error;
  if (g_threads.session && g_threads.session->alloc) {
    GpuAllocator& alloc = *g_threads.session->alloc;
    for (std::size_t t = 0; t < g_threads.rings.size(); ++t) {
      void* const stream = g_threads.session->streams[t];
      ThreadRing& ring = g_threads.rings[t];
      for (std::size_t i = 0; i < kRing; ++i) {
        for (auto [slot, bytes] :
             {std::pair{&ring.small[i], kThreadSmall}, std::pair{&ring.large[i], kThreadLarge}}) {
          if (*slot == nullptr) continue;
          try {
            alloc.deallocate(*slot, bytes, stream);
          } catch (const std::exception& e) {
            if (error.empty()) error = e.what();
          }
          *slot = nullptr;
        }
      }
    }
  }
  g_threads.rings.clear();
  g_threads.session.reset();
  g_threads.counters_before.clear();
  if (!error.empty()) throw std::runtime_error("teardown: " + error);
}

void BM_Threads(benchmark::State& state, const AllocatorKind* kind) {
  const auto t = static_cast<std::size_t>(state.thread_index());
  state.SetLabel(kind->label);
  if (t == 0) {
    try {
      teardown_threads();  // a failed previous run's state; all its threads are gone
      g_threads.session =
          std::make_unique<Session>(*kind, static_cast<std::size_t>(state.threads()));
      g_threads.rings.assign(static_cast<std::size_t>(state.threads()), ThreadRing{});
      GpuAllocator& alloc = *g_threads.session->alloc;
      // Warm every thread's stream: fill its ring, then turn it over twice.
      for (std::size_t i = 0; i < g_threads.rings.size(); ++i) {
        for (std::size_t k = 0; k < 3 * kRing; ++k) {
          if (const char* err = ring_step(alloc, g_threads.rings[i], g_threads.session->streams[i]))
            throw std::runtime_error(std::string("warm-up: ") + err);
        }
      }
      g_threads.session->synchronize();
      g_threads.counters_before = alloc.counters();
      g_threads_ready.store(&g_threads, std::memory_order_release);
    } catch (const std::exception& e) {
      state.SkipWithError((std::string("setup failed: ") + e.what()).c_str());
    }
  } else {
    // The current device is per host thread.
    if (const std::string why = replay::cuda_error(cudaSetDevice(kDevice), "cudaSetDevice");
        !why.empty())
      state.SkipWithError(why.c_str());
  }

  ThreadsShared* shared = nullptr;  // read in the first iteration: setup is complete by then
  try {
    for (auto _ : state) {
      if (shared == nullptr) {
        shared = g_threads_ready.load(std::memory_order_acquire);
        if (shared == nullptr) {
          state.SkipWithError("shared allocator setup failed");
          break;
        }
      }
      if (const char* err =
              ring_step(*shared->session->alloc, shared->rings[t], shared->session->streams[t])) {
        state.SkipWithError(err);
        break;
      }
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  state.SetItemsProcessed(2 * state.iterations());  // two allocate+free pairs per iteration

  if (t == 0 && !state.error_occurred() && g_threads.session) {
    try {
      GpuAllocator& alloc = *g_threads.session->alloc;
      g_threads.session->synchronize();
      // Set by thread 0 only; kAvgIterations divides by the iterations of all threads together.
      add_counter_deltas(state, g_threads.counters_before, alloc.counters());
      state.counters["reserved_MiB"] = static_cast<double>(alloc.reserved_bytes()) / kMiB;
      teardown_threads();
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  }
}

// ---------------------------------------------------------------------------------------------

bool have_cuda_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) cudaGetLastError();
  return err == cudaSuccess && count > kDevice;
}

}  // namespace

int main(int argc, char** argv) {
  if (!have_cuda_device()) {
    std::puts("cuarena_gpu_bench: no CUDA device; run on a GPU machine");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  static const std::vector<AllocatorKind> kinds = allocator_kinds();
  for (const AllocatorKind& kind : kinds) {
    benchmark::RegisterBenchmark(("AllocFree/" + kind.name).c_str(), BM_AllocFree, &kind)
        ->Arg(512)
        ->Arg(64 << 10)
        ->Arg(1 << 20)
        ->Arg(8 << 20)
        ->Arg(256 << 20)
        ->UseRealTime();
  }
  for (const AllocatorKind& kind : kinds) {
    benchmark::RegisterBenchmark(("MixedTrace/" + kind.name).c_str(), BM_MixedTrace, &kind)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (const AllocatorKind& kind : kinds) {
    benchmark::RegisterBenchmark(("Threads/" + kind.name).c_str(), BM_Threads, &kind)
        ->Threads(1)
        ->Threads(2)
        ->Threads(4)
        ->Threads(8)
        ->Threads(16)
        ->UseRealTime();
  }

  benchmark::RunSpecifiedBenchmarks();
  try {
    teardown_threads();  // a failed last Threads run may have left its state
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuarena_gpu_bench: %s\n", e.what());
  }
  benchmark::Shutdown();
  return 0;
}
