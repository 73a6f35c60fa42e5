// shim_stress: host threads (8), each on its own non-blocking stream, doing random allocations
// and frees (20,000 operations a thread): mostly cudaMallocAsync/cudaFreeAsync on the thread's
// stream, some (15%) cudaMalloc/cudaFree; sizes 512 B .. 1 MiB mostly, up to 16 MiB sometimes.
// Every block is filled by a kernel on the thread's stream with a tag unique to it, and verified
// by a kernel on the same stream just before its free; mismatching bytes are counted in device
// memory, per thread. Before one verify in ten the stream is held up for 100 us, so frees are
// often issued while the block's last kernel is still queued: a block handed to another thread
// (or reused) before its owner's kernels have run shows as mismatches in one of the two. Every
// allocation is also checked on the host against all live blocks of all threads (no overlap).
//
// Meant to run under compute-sanitizer --tool memcheck too (tests/shim/gpu/run.sh): a kernel
// touching memory the shim has unmapped is an error there.
// Flags: --threads N (8), --ops N (operations a thread, 20000), --seed N, --max-live N (live
// blocks a thread, 48), and --expect-shim / --expect-no-shim.
// Churn mode: --min-size B --max-size B draw every size log-uniformly from [B, B] instead, and
// --sync-percent P sets the share of cudaMalloc/cudaFree (15). The program prints
// "peak_live_bytes=N": the most bytes its threads held at once (counted after an allocation
// returns, before its free is issued), the denominator of tests/shim/gpu/run.sh's churn ratio.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "shim_test.cuh"

using namespace shimtest;

namespace {

struct Options {
  int threads = 8;
  long ops = 20000;  // a thread
  std::uint64_t seed = 7;
  std::size_t max_live = 48;
  std::size_t min_size = 0, max_size = 0;  // churn mode when max_size != 0
  int sync_percent = 15;
};

// Bytes the program holds now and at most (all threads).
struct LiveBytes {
  std::atomic<std::size_t> now{0}, peak{0};
  void add(std::size_t n) {
    const std::size_t v = now.fetch_add(n) + n;
    std::size_t p = peak.load();
    while (v > p && !peak.compare_exchange_weak(p, v)) {
    }
  }
  void sub(std::size_t n) { now.fetch_sub(n); }
};

struct Block {
  void* p = nullptr;
  std::size_t size = 0;
  std::uint32_t tag = 0;
  bool async = false;
};

// All live blocks of all threads, by address.
class LiveMap {
 public:
  void add(const Block& b) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto p = reinterpret_cast<std::uintptr_t>(b.p);
    auto next = blocks_.lower_bound(p);
    if (next != blocks_.end())
      expect(p + b.size <= next->first,
             "new block [%p, +%zu) (tag %x) overlaps the live block "
             "at 0x%zx (tag %x)",
             b.p, b.size, b.tag, std::size_t(next->first), next->second.tag);
    if (next != blocks_.begin()) {
      auto prev = std::prev(next);
      expect(prev->first + prev->second.size <= p,
             "new block [%p, +%zu) (tag %x) overlaps the "
             "live block [0x%zx, +%zu) (tag %x)",
             b.p, b.size, b.tag, std::size_t(prev->first), prev->second.size, prev->second.tag);
    }
    blocks_[p] = b;
  }
  void remove(const Block& b) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(b.p));
  }

 private:
  std::mutex mu_;
  std::map<std::uintptr_t, Block> blocks_;
};

struct ThreadResult {
  long allocs = 0, frees = 0, sync_api = 0;
};

void worker(int t, const Options& o, LiveMap& map, LiveBytes& bytes, unsigned long long* errors,
            ThreadResult& result) {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937_64 rng(o.seed * 1000 + t);
  std::uniform_real_distribution<double> small(std::log(512.0), std::log(double(MiB)));
  std::uniform_real_distribution<double> large(std::log(double(MiB)), std::log(16.0 * MiB));
  std::uniform_real_distribution<double> churn(
      std::log(double(std::max<std::size_t>(o.min_size, 1))),
      std::log(double(std::max<std::size_t>(o.max_size, 1))));
  std::vector<Block> live;
  std::uint32_t counter = 0;
  auto release = [&](std::size_t i) {
    Block b = live[i];
    live[i] = live.back();
    live.pop_back();
    if (rng() % 10 == 0) {  // the free below is then issued while the verify is still queued
      spin_kernel<<<1, 1, 0, s>>>(100'000);
      CHECK_LAUNCH();
    }
    verify_bytes(b.p, b.size, b.tag, errors + t, s);
    map.remove(b);  // before the free: another thread may get the address at once
    bytes.sub(b.size);
    if (b.async)
      CHECK(cudaFreeAsync(b.p, s));
    else
      CHECK(cudaFree(b.p));
    ++result.frees;
  };

  for (long op = 0; op < o.ops; ++op) {
    const bool grow = live.empty() || (live.size() < o.max_live && rng() % 100 < 55);
    if (!grow) {
      release(rng() % live.size());
      continue;
    }
    Block b;
    if (o.max_size != 0)
      b.size = std::clamp(std::size_t(std::exp(churn(rng))), o.min_size, o.max_size);
    else
      b.size = std::size_t(std::exp(rng() % 100 < 85 ? small(rng) : large(rng)));
    b.tag = (std::uint32_t(t) << 24) | (counter++ & 0xffffff);
    b.async = int(rng() % 100) >= o.sync_percent;
    if (b.async) {
      CHECK(cudaMallocAsync(&b.p, b.size, s));
    } else {
      CHECK(cudaMalloc(&b.p, b.size));
      ++result.sync_api;
    }
    ++result.allocs;
    bytes.add(b.size);
    map.add(b);
    fill_bytes(b.p, b.size, b.tag, s);
    live.push_back(b);
  }
  while (!live.empty()) release(live.size() - 1);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc, argv, "shim_stress");
  start(program, argc, argv);
  Options o;
  if (const char* v = flag_value(argc, argv, "--threads")) o.threads = std::atoi(v);
  if (const char* v = flag_value(argc, argv, "--ops")) o.ops = std::atol(v);
  if (const char* v = flag_value(argc, argv, "--seed")) o.seed = std::strtoull(v, nullptr, 0);
  if (const char* v = flag_value(argc, argv, "--max-live"))
    o.max_live = std::strtoull(v, nullptr, 0);
  if (const char* v = flag_value(argc, argv, "--min-size"))
    o.min_size = parse_size("--min-size", v);
  if (const char* v = flag_value(argc, argv, "--max-size"))
    o.max_size = parse_size("--max-size", v);
  if (const char* v = flag_value(argc, argv, "--sync-percent")) o.sync_percent = std::atoi(v);
  if (o.threads < 1 || o.ops < 1 || o.max_live < 1) die("bad --threads/--ops/--max-live");
  if (o.max_size != 0 && (o.min_size < 1 || o.min_size > o.max_size))
    die("--min-size must be from 1 to --max-size");
  if (o.sync_percent < 0 || o.sync_percent > 100) die("--sync-percent must be from 0 to 100");

  run_case("threads_alloc_free_verify", [&] {
    note("%d threads, %ld operations each, seed %" PRIu64 ", up to %zu live blocks a thread",
         o.threads, o.ops, o.seed, o.max_live);
    if (o.max_size != 0)
      note("sizes %zu .. %zu B log-uniform, %d%% cudaMalloc", o.min_size, o.max_size,
           o.sync_percent);
    unsigned long long* errors = nullptr;
    CHECK(cudaMalloc(&errors, o.threads * sizeof *errors));
    CHECK(cudaMemset(errors, 0, o.threads * sizeof *errors));
    CHECK(cudaDeviceSynchronize());
    LiveMap map;
    LiveBytes bytes;
    std::vector<ThreadResult> results(o.threads);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < o.threads; ++t)
      threads.emplace_back(worker, t, std::cref(o), std::ref(map), std::ref(bytes), errors,
                           std::ref(results[t]));
    for (auto& th : threads) th.join();
    CHECK(cudaDeviceSynchronize());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<unsigned long long> bad(o.threads);
    CHECK(cudaMemcpy(bad.data(), errors, bad.size() * sizeof bad[0], cudaMemcpyDeviceToHost));
    long allocs = 0, sync_api = 0;
    for (int t = 0; t < o.threads; ++t) {
      allocs += results[t].allocs;
      sync_api += results[t].sync_api;
      expect(results[t].allocs == results[t].frees, "thread %d: %ld allocations, %ld frees", t,
             results[t].allocs, results[t].frees);
      expect(bad[t] == 0,
             "thread %d: %llu bytes of its blocks were not its pattern when "
             "verified before their free (a block was shared or reused too early)",
             t, bad[t]);
    }
    note("%ld allocations (%ld with cudaMalloc) in %.2f s", allocs, sync_api, s);
    std::printf("peak_live_bytes=%zu\n", bytes.peak.load());
    CHECK(cudaFree(errors));
  });
  return finish(program);
}
