// cuarena_bench: CPU benchmarks of the policy core on the SimBackend.
//
// Every benchmark runs on the host only: the SimBackend does address arithmetic, so these numbers
// measure the allocator's bookkeeping (size classes, block pool, slabs, sweeps, the mutex) plus
// the simulator's own map/unmap/event cost, never device work. They are for comparing policy
// changes against each other, not for predicting latency on a GPU, where map/unmap cost tens of
// microseconds each.
//
//   BM_AllocFree/<bytes>        one allocate + one deallocate of <bytes> on one stream, in steady
//                               state (cache warmed first). Time per pair; items/s = pairs/s.
//                               Counters maps/iter: backend map() calls per pair (0 when the
//                               request is served from cache); slabs/iter: slabs created per
//                               pair (1 when each free empties a slab and the next allocate
//                               builds a new one).
//   BM_MixedSizes/<trace>/<cfg> the alloc / free_completed stream of a trace through one
//                               long-lived Allocator, one full pass per iteration (blocks left
//                               live at the end of the trace are freed in the pass), after one
//                               warm-up pass: the steady state of a training loop. Time per
//                               pass; items/s = allocator calls/s. Counters per pass (steady
//                               state): moved = granules stolen + aliased, maps / unmaps =
//                               backend map/unmap calls, reactivated = dormant mappings taken
//                               back, creates = chunks created; ratio = peak
//                               reserved / peak requested over all passes. <cfg> is the default
//                               or whole_chunk_min:0 (memory first).
//   BM_SimReplay/<trace>        replay::replay_cuarena() over a whole trace with SimOptions{},
//                               exactly what `cuarena replay --backend sim` does per device
//                               (including its second partial run that measures fragmentation at
//                               the peak). Time per replay; items/s = trace events/s.
//   BM_CallLatency/<trace>      one replay of the trace through a fresh Allocator (as a GPU
//                               replay row runs it), each allocate and deallocate timed alone.
//                               Counters alloc_p50/p99_ns, free_p50/p99_ns over every call of
//                               every iteration: the host cost of the policy on the simulator,
//                               the figure to watch when moving work off the free path (the
//                               GPU's free p99 adds event calls to it). CUARENA_CONF sets the
//                               configuration (default: the default).
//   BM_MultiStream/.../threads:N  N host threads, each on its own stream (thread_index + 1),
//                               allocating and freeing a 64 KiB (slab) and a 4 MiB (block pool)
//                               block per iteration on one shared Allocator. Wall-clock time;
//                               items/s = allocate+deallocate pairs/s summed over all threads.
//                               Counter cache_hits = share of allocations served from a stream
//                               cache (frees that found the device lock taken park their block
//                               in their stream's cache; see allocator.hpp).
//
// Any failure (a trace that does not load, an allocator exception, an invariant violation, a
// leaked block) ends that benchmark with SkipWithError, which prints the message in the table.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuarena/allocator.hpp"
#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/trace.hpp"
#include "cuarena/sim_backend.hpp"
#include "trace_ops.hpp"

#ifndef CUARENA_BENCH_TRACE_DIR
#error "CUARENA_BENCH_TRACE_DIR must name tests/data/traces (set by bench/CMakeLists.txt)"
#endif

namespace {

using cuarena::Allocator;
using cuarena::KiB;
using cuarena::MiB;
using cuarena::SimBackend;
using cuarena::StreamId;
namespace replay = cuarena::replay;

constexpr StreamId kStream = 1;  // the stream of the single-stream benchmarks

// Allocations currently live in `alloc` (the "all" pool).
std::int64_t live_allocations(const Allocator& alloc) {
  return alloc.stats().allocation[static_cast<int>(cuarena::Pool::kAll)].current;
}

// Ends the benchmark with an error when `alloc` still holds allocations or breaks an invariant.
// Call after the timed loop (untimed). Returns false when it reported an error.
bool check_clean(benchmark::State& state, const Allocator& alloc) {
  try {
    alloc.check_invariants();
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("allocator invariant broken: ") + e.what()).c_str());
    return false;
  }
  if (const std::int64_t live = live_allocations(alloc); live != 0) {
    state.SkipWithError((std::to_string(live) + " allocations still live after the run").c_str());
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Trace cache: each trace is loaded (through the Python converter) once per process, on first
// use, outside any timed region. Entries are never erased, so references stay valid.

struct LoadedTrace {
  std::string error;  // non-empty: the trace could not be used; the message says why
  // Events of each device, in trace order (the CLI replays devices separately).
  std::vector<std::pair<int, std::vector<replay::Event>>> devices;
  std::size_t total_events = 0;
};

const LoadedTrace& load_cached(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, LoadedTrace> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache.try_emplace(name);
  LoadedTrace& t = it->second;
  if (!inserted) return t;
  const std::string path = std::string(CUARENA_BENCH_TRACE_DIR) + "/" + name + ".pickle.gz";
  try {
    const std::vector<replay::Event> all = replay::load_trace(path);
    for (int device : replay::devices_in(all))
      t.devices.emplace_back(device, replay::device_events(all, device));
    t.total_events = all.size();
    if (t.total_events == 0) t.error = path + ": the trace has no events";
  } catch (const std::exception& e) {
    t.error = std::string("cannot load trace: ") + e.what();
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// BM_AllocFree/<bytes>: the latency of one allocate + deallocate pair on one stream.
//
// A block freed on stream S is reusable at once on S, so after the warm-up every iteration is
// served from the cache: large sizes measure the block pool's best-fit lookup and coalescing,
// small sizes the slab path (a slab that empties returns its granule to the page pool at once,
// so a lone small block rebuilds its slab every pair: that shows up in slabs/iter).

void BM_AllocFree(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  SimBackend sim;
  try {
    Allocator alloc(sim);
    // Warm the cache: the first request maps fresh granules; we time the steady state.
    for (int i = 0; i < 4; ++i) alloc.deallocate(alloc.allocate(bytes, kStream));
    const cuarena::Stats before = alloc.stats();

    for (auto _ : state) {
      void* p = alloc.allocate(bytes, kStream);
      benchmark::DoNotOptimize(p);
      alloc.deallocate(p);
    }

    state.SetItemsProcessed(state.iterations());
    const cuarena::Stats after = alloc.stats();
    state.counters["maps/iter"] =
        benchmark::Counter(static_cast<double>(after.map_calls - before.map_calls),
                           benchmark::Counter::kAvgIterations);
    state.counters["slabs/iter"] =
        benchmark::Counter(static_cast<double>(after.slabs_created - before.slabs_created),
                           benchmark::Counter::kAvgIterations);
    check_clean(state, alloc);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK(BM_AllocFree)->Arg(512)->Arg(64 * KiB)->Arg(1 * MiB)->Arg(8 * MiB)->Arg(256 * MiB);

// ---------------------------------------------------------------------------------------------
// BM_MixedSizes: a realistic mixed-size allocate/free stream (gpt2_train).
//
// The trace's alloc / free_completed events are compiled once into a flat list of operations
// on dense slot numbers, so the timed loop does no hashing of trace addresses and measures the
// allocator alone (plus one SimBackend clock tick per operation, as the replayer does, so that
// sweep events complete and cross-stream reuse happens as in a replay). Trace quirks are
// handled as replay_cuarena handles them: a free of an address never allocated is dropped; an
// alloc at an address still live first frees the old block (the trace lost its free).

struct OpStream {
  std::string error;
  std::string label;
  cuarena::bench::TraceOps trace;
};

OpStream compile_ops(const std::string& trace_name) {
  OpStream out;
  const LoadedTrace& t = load_cached(trace_name);
  if (!t.error.empty()) {
    out.error = t.error;
    return out;
  }
  // The first device's events (the benchmark traces of interest record one device).
  const auto& [device, events] = t.devices.front();
  out.label = trace_name + (t.devices.size() > 1 ? " cuda" + std::to_string(device) : "");
  out.trace = cuarena::bench::compile_trace_ops(events);
  if (out.trace.ops.empty()) out.error = trace_name + ": no alloc/free_completed events";
  return out;
}

void BM_MixedSizes(benchmark::State& state, const char* trace_name, const char* config) {
  const OpStream stream = compile_ops(trace_name);
  if (!stream.error.empty()) {
    state.SkipWithError(stream.error.c_str());
    return;
  }
  SimBackend sim;
  try {
    Allocator alloc(sim, cuarena::Config::parse(config));
    std::vector<void*> slots(stream.trace.slots, nullptr);
    auto pass = [&] {
      for (const cuarena::bench::TraceOp& op : stream.trace.ops) {
        sim.advance(1);
        if (op.alloc)
          slots[op.slot] = alloc.allocate(op.size, stream.trace.stream_handles[op.stream]);
        else
          alloc.deallocate(slots[op.slot]);
      }
    };
    pass();  // warm-up: fill the cache, so passes are timed in steady state
    const cuarena::Stats before = alloc.stats();

    for (auto _ : state) pass();

    const cuarena::Stats after = alloc.stats();
    const double passes = double(state.iterations());
    auto per_pass = [&](std::int64_t a, std::int64_t b) { return double(b - a) / passes; };
    state.counters["moved"] = per_pass(before.granules_stolen + before.granules_aliased,
                                       after.granules_stolen + after.granules_aliased);
    state.counters["maps"] = per_pass(before.map_calls, after.map_calls);
    state.counters["reactivated"] =
        per_pass(before.granules_reactivated, after.granules_reactivated);
    state.counters["unmaps"] = per_pass(before.unmap_calls, after.unmap_calls);
    state.counters["creates"] = per_pass(before.num_device_alloc, after.num_device_alloc);
    const int all = static_cast<int>(cuarena::Pool::kAll);
    state.counters["ratio"] =
        double(after.reserved_bytes[all].peak) / double(after.requested_bytes[all].peak);
    state.SetItemsProcessed(state.iterations() *
                            static_cast<std::int64_t>(stream.trace.ops.size()));
    state.SetLabel(stream.label);
    check_clean(state, alloc);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}
BENCHMARK_CAPTURE(BM_MixedSizes, gpt2_train, "gpt2_train", "")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MixedSizes, gpt2_train_memory_first, "gpt2_train", "whole_chunk_min:0")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MixedSizes, moe_train, "moe_train", "")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MixedSizes, moe_train_memory_first, "moe_train", "whole_chunk_min:0")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MixedSizes, resnet50_amp, "resnet50_amp", "")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MixedSizes, resnet50_amp_memory_first, "resnet50_amp", "whole_chunk_min:0")
    ->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------
// BM_CallLatency/<trace>: per-call host latency of allocate and deallocate over one fresh replay.

void BM_CallLatency(benchmark::State& state, const char* trace_name) {
  const OpStream stream = compile_ops(trace_name);
  if (!stream.error.empty()) {
    state.SkipWithError(stream.error.c_str());
    return;
  }
  using Clock = std::chrono::steady_clock;
  std::vector<double> alloc_ns, free_ns;
  try {
    for (auto _ : state) {
      state.PauseTiming();
      SimBackend sim;
      auto alloc = std::make_unique<Allocator>(sim, cuarena::Config::from_env());
      std::vector<void*> slots(stream.trace.slots, nullptr);
      state.ResumeTiming();
      for (const cuarena::bench::TraceOp& op : stream.trace.ops) {
        sim.advance(1);
        const auto t0 = Clock::now();
        if (op.alloc) {
          slots[op.slot] = alloc->allocate(op.size, stream.trace.stream_handles[op.stream]);
        } else {
          alloc->deallocate(slots[op.slot]);
        }
        const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
        (op.alloc ? alloc_ns : free_ns).push_back(ns);
      }
      state.PauseTiming();
      const bool clean = check_clean(state, *alloc);
      alloc.reset();
      state.ResumeTiming();
      if (!clean) return;
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  state.counters["alloc_p50_ns"] = replay::percentile(alloc_ns, 0.50);
  state.counters["alloc_p99_ns"] = replay::percentile(alloc_ns, 0.99);
  state.counters["free_p50_ns"] = replay::percentile(free_ns, 0.50);
  state.counters["free_p99_ns"] = replay::percentile(free_ns, 0.99);
  state.SetLabel(stream.label);
}
BENCHMARK_CAPTURE(BM_CallLatency, gpt2_train, "gpt2_train")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CallLatency, resnet50_amp, "resnet50_amp")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CallLatency, bert_varlen_infer, "bert_varlen_infer")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CallLatency, vit_multistream, "vit_multistream")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CallLatency, moe_train, "moe_train")->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------
// BM_SimReplay/<trace>: end-to-end replay throughput of the simulator, per recorded trace.
//
// Each iteration builds a fresh SimBackend + Allocator per device and replays every event, as
// `cuarena replay --backend sim` does. Counters: reserved_ratio (peak reserved / peak requested,
// lower is better, 1.0 is perfect) so a speed-up that costs memory is visible next to it.

void BM_SimReplay(benchmark::State& state, const char* trace_name) {
  const LoadedTrace& t = load_cached(trace_name);
  if (!t.error.empty()) {
    state.SkipWithError(t.error.c_str());
    return;
  }
  std::vector<replay::Result> results(t.devices.size());
  try {
    for (auto _ : state) {
      for (std::size_t d = 0; d < t.devices.size(); ++d) {
        results[d] = replay::replay_cuarena(t.devices[d].second, replay::SimOptions{});
        benchmark::DoNotOptimize(results[d].peak_reserved_bytes);
      }
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  // The traces were recorded on an H200, and the SimOptions{} capacity is that H200's: an
  // out-of-memory here is a policy regression, not a property of the trace.
  std::uint64_t ooms = 0, requested = 0, reserved = 0;
  for (const replay::Result& r : results) {
    ooms += r.ooms;
    requested += r.peak_requested_bytes;
    reserved += r.peak_reserved_bytes;
  }
  if (ooms != 0) {
    state.SkipWithError((std::to_string(ooms) + " out-of-memory errors in the replay").c_str());
    return;
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(t.total_events));
  state.counters["reserved_ratio"] =
      requested ? static_cast<double>(reserved) / static_cast<double>(requested) : 0.0;
}
BENCHMARK_CAPTURE(BM_SimReplay, gpt2_train, "gpt2_train")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SimReplay, resnet50_amp, "resnet50_amp")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SimReplay, bert_varlen_infer, "bert_varlen_infer")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SimReplay, vit_multistream, "vit_multistream")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SimReplay, moe_train, "moe_train")->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------
// BM_MultiStream: scaling of one shared Allocator over host threads, one stream per thread.
//
// Thread 0 builds the shared SimBackend + Allocator before the timed loop and warms every
// thread's stream; Google Benchmark starts no thread's loop before every thread reached it, so
// the other threads see a ready allocator. The SimBackend's clock is never advanced here (that
// would race with the allocator's calls into it): each stream reuses its own freed blocks at
// once, which is exactly the stream-ordered fast path. After the loop (all threads have
// finished theirs), thread 0 checks the allocator and tears it down.

struct SharedAllocator {
  std::unique_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;  // declared after sim: destroyed before it
};
SharedAllocator g_shared;

constexpr std::size_t kMultiSmall = 64 * KiB;  // slab path
constexpr std::size_t kMultiLarge = 4 * MiB;   // block-pool path

void BM_MultiStream(benchmark::State& state) {
  const StreamId stream = static_cast<StreamId>(state.thread_index()) + 1;
  if (state.thread_index() == 0) {
    // A previous run that failed may have left its allocator; all its threads are gone now.
    g_shared.alloc.reset();
    g_shared.sim.reset();
    try {
      g_shared.sim = std::make_unique<SimBackend>();
      g_shared.alloc = std::make_unique<Allocator>(*g_shared.sim);
      for (int t = 0; t < state.threads(); ++t) {  // warm every thread's stream
        const StreamId s = static_cast<StreamId>(t) + 1;
        void* small = g_shared.alloc->allocate(kMultiSmall, s);
        void* large = g_shared.alloc->allocate(kMultiLarge, s);
        g_shared.alloc->deallocate(large);
        g_shared.alloc->deallocate(small);
      }
    } catch (const std::exception& e) {
      g_shared.alloc.reset();  // tells the other threads that setup failed
      state.SkipWithError((std::string("setup failed: ") + e.what()).c_str());
    }
  }

  Allocator* alloc = nullptr;  // read once inside the loop: setup is complete by then
  try {
    for (auto _ : state) {
      if (alloc == nullptr) {
        alloc = g_shared.alloc.get();
        if (alloc == nullptr) {
          state.SkipWithError("shared allocator setup failed");
          break;
        }
      }
      void* small = alloc->allocate(kMultiSmall, stream);
      void* large = alloc->allocate(kMultiLarge, stream);
      benchmark::DoNotOptimize(small);
      benchmark::DoNotOptimize(large);
      alloc->deallocate(large);
      alloc->deallocate(small);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  state.SetItemsProcessed(2 * state.iterations());  // two allocate+deallocate pairs each

  // Thread 0 ended its loop normally only after every other thread ended its own, so nothing
  // else touches the allocator now. On an error, leave it to the next run's setup instead.
  if (state.thread_index() == 0 && !state.error_occurred() && g_shared.alloc) {
    const double allocations = double(g_shared.alloc->stats().allocation[0].allocated);
    state.counters["cache_hits"] =
        allocations > 0 ? double(g_shared.alloc->stats().stream_cache_hits) / allocations : 0.0;
    check_clean(state, *g_shared.alloc);
    g_shared.alloc.reset();
    g_shared.sim.reset();
  }
}
BENCHMARK(BM_MultiStream)
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->Threads(8)
    ->Threads(16)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
