// shim_basic_static / shim_basic_shared (this file, built with the static and with the shared
// cudart): the everyday runtime API under the shim. Cases:
//   malloc_free        cudaMalloc/cudaFree, 256-byte alignment, a kernel's fill read back on the
//                      host, a verify kernel that does see a wrong pattern (so it is no no-op)
//   mem_get_info       cudaMemGetInfo and cuMemGetInfo agree on the total; a live 256 MiB block
//                      lowers free by at least that; after its cudaFree free is back (the shim
//                      counts cached bytes as free)
//   malloc_async       cudaMallocAsync/cudaFreeAsync on a created non-blocking stream, 200 rounds
//                      of varying sizes, each filled and verified on the stream
//   graph              a stream capture of three kernels, instantiated and launched twice; the
//                      results accumulate (launch 2 sees launch 1's)
//   graph_alloc_nodes  cudaMallocAsync/cudaFreeAsync inside a capture become graph memory nodes
//                      (the shim passes allocations on a capturing stream to the driver)
//   many_sizes         4 rounds of random sizes 512 B .. 64 MiB (seeded; --seed N), cudaMalloc
//                      or cudaMallocAsync: each block poisoned, then its own pattern; all live
//                      blocks disjoint by address and each verified after all were written (a
//                      block handed out twice shows the other's pattern); a random half freed
//                      between rounds so later rounds reuse freed memory
// Flags: --expect-shim / --expect-no-shim (shim_test.cuh), --seed N.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "shim_test.cuh"

using namespace shimtest;

namespace {

__global__ void add_index_kernel(std::uint32_t* d, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    d[i] += static_cast<std::uint32_t>(i);
}

__global__ void add_const_kernel(std::uint32_t* d, std::size_t n, std::uint32_t c) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    d[i] += c;
}

__global__ void add_words_kernel(std::uint32_t* d, const std::uint32_t* s, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    d[i] += s[i];
}

void malloc_free() {
  expect(cudaFree(nullptr) == cudaSuccess, "cudaFree(nullptr) must succeed (a no-op)");
  const std::size_t n = MiB + 3;
  void* p = nullptr;
  CHECK(cudaMalloc(&p, n));
  expect(p != nullptr, "cudaMalloc returned a null pointer");
  expect(reinterpret_cast<std::uintptr_t>(p) % 256 == 0, "cudaMalloc pointer %p not 256-aligned",
         p);
  fill_bytes(p, n, 7);
  std::vector<std::uint8_t> host(n);
  CHECK(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += host[i] != pattern_byte(7, i);
  expect(bad == 0, "%zu of %zu bytes read back differ from the kernel's pattern", bad, n);
  DeviceCounter errors;
  verify_bytes(p, n, 7, errors.p);
  expect(errors.read() == 0, "verify kernel: the right pattern counted as wrong");
  errors.reset();
  verify_bytes(p, n, 8, errors.p);
  expect(errors.read() > n / 2, "verify kernel: another tag's pattern was not seen as wrong");
  CHECK(cudaFree(p));
}

void mem_get_info() {
  std::size_t free0 = 0, total = 0, dfree = 0, dtotal = 0;
  CHECK(cudaMemGetInfo(&free0, &total));
  CHECK_DRV(Driver::get().mem_get_info(&dfree, &dtotal));
  note("cudaMemGetInfo: free %s, total %s; cuMemGetInfo: free %s, total %s", human(free0).c_str(),
       human(total).c_str(), human(dfree).c_str(), human(dtotal).c_str());
  expect(total > 0 && free0 <= total, "cudaMemGetInfo: free %zu > total %zu", free0, total);
  expect(dfree <= dtotal, "cuMemGetInfo: free %zu > total %zu", dfree, dtotal);
  expect(total == dtotal, "totals differ: runtime %zu, driver %zu", total, dtotal);

  const std::size_t big = 256 * MiB;
  void* p = nullptr;
  CHECK(cudaMalloc(&p, big));
  fill_bytes(p, big, 3);  // touch it: memory is really there
  CHECK(cudaDeviceSynchronize());
  std::size_t free1 = 0, total1 = 0;
  CHECK(cudaMemGetInfo(&free1, &total1));
  expect(free1 + big <= free0, "a live %s block lowered free by only %s", human(big).c_str(),
         human(free0 > free1 ? free0 - free1 : 0).c_str());
  CHECK(cudaFree(p));
  CHECK(cudaDeviceSynchronize());
  std::size_t free2 = 0, total2 = 0;
  CHECK(cudaMemGetInfo(&free2, &total2));
  const std::size_t slack = 16 * MiB;  // room for bookkeeping, others' small allocations
  expect(free2 + slack >= free0,
         "after cudaFree free is %s, was %s before the allocation: freed "
         "(cached) memory must count as free",
         human(free2).c_str(), human(free0).c_str());
}

void malloc_async() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DeviceCounter errors;
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    const std::size_t n = std::size_t{512} << (rng() % 16);  // 512 B .. 16 MiB
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, n, s));
    expect(reinterpret_cast<std::uintptr_t>(p) % 256 == 0, "cudaMallocAsync %p not aligned", p);
    fill_bytes(p, n, 100 + i, s);
    verify_bytes(p, n, 100 + i, errors.p, s);
    CHECK(cudaFreeAsync(p, s));
  }
  // One more, read back on the host through a pinned buffer on the same stream.
  const std::size_t n = 3 * MiB + 5;
  void* p = nullptr;
  std::uint8_t* host = nullptr;
  CHECK(cudaMallocHost(&host, n));
  CHECK(cudaMallocAsync(&p, n, s));
  fill_bytes(p, n, 99, s);
  CHECK(cudaMemcpyAsync(host, p, n, cudaMemcpyDeviceToHost, s));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += host[i] != pattern_byte(99, i);
  expect(bad == 0, "%zu bytes of a cudaMallocAsync block read back wrong", bad);
  expect(errors.read() == 0, "%llu bytes wrong in the 200 stream-ordered blocks", errors.read());
  CHECK(cudaFreeHost(host));
  CHECK(cudaStreamDestroy(s));
}

std::vector<std::uint32_t> read_words(const std::uint32_t* d, std::size_t n) {
  std::vector<std::uint32_t> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
  return h;
}

void graph() {
  const std::size_t n = std::size_t{1} << 20;
  std::uint32_t* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof *d));
  CHECK(cudaMemset(d, 0, n * sizeof *d));
  CHECK(cudaDeviceSynchronize());
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  add_index_kernel<<<grid_for(n), 256, 0, s>>>(d, n);
  add_const_kernel<<<grid_for(n), 256, 0, s>>>(d, n, 1);
  add_const_kernel<<<grid_for(n), 256, 0, s>>>(d, n, 2);
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  for (std::uint32_t launch = 1; launch <= 2; ++launch) {
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    const auto h = read_words(d, n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += h[i] != launch * (std::uint32_t(i) + 3);
    expect(bad == 0, "after graph launch %u: %zu of %zu words wrong", launch, bad, n);
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
}

void graph_alloc_nodes() {
  const std::size_t n = std::size_t{1} << 20;
  const std::uint32_t tag = 42;
  std::uint32_t* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof *d));
  CHECK(cudaMemset(d, 0, n * sizeof *d));
  CHECK(cudaDeviceSynchronize());
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  std::uint32_t* tmp = nullptr;
  CHECK(cudaMallocAsync(&tmp, n * sizeof *tmp, s));
  fill_words_kernel<<<grid_for(n), 256, 0, s>>>(tmp, n, tag);
  add_words_kernel<<<grid_for(n), 256, 0, s>>>(d, tmp, n);
  CHECK(cudaFreeAsync(tmp, s));
  CHECK(cudaStreamEndCapture(s, &g));

  std::size_t count = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
  int allocs = 0, frees = 0, kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(node, &type));
    allocs += type == cudaGraphNodeTypeMemAlloc;
    frees += type == cudaGraphNodeTypeMemFree;
    kernels += type == cudaGraphNodeTypeKernel;
  }
  note("captured graph: %zu nodes (%d alloc, %d free, %d kernel)", count, allocs, frees, kernels);
  expect(allocs == 1 && frees == 1,
         "the capture holds %d memory-alloc and %d memory-free nodes, "
         "not 1 and 1: cudaMallocAsync on a capturing stream did not reach the driver",
         allocs, frees);
  expect(kernels == 2, "the capture holds %d kernel nodes, not 2", kernels);

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, g, 0));
  for (std::uint32_t launch = 1; launch <= 2; ++launch) {
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    const auto h = read_words(d, n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += h[i] != launch * pattern_word(tag, i);
    expect(bad == 0, "after launch %u of the graph with memory nodes: %zu words wrong", launch,
           bad);
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  CHECK(cudaDeviceGraphMemTrim(0));
}

struct Block {
  void* p = nullptr;
  std::size_t size = 0;
  std::uint32_t tag = 0;
  bool async = false;  // cudaMallocAsync on the case's stream (else cudaMalloc)
};

// Every pair of live blocks must be disjoint: [p, p+size) by address.
void expect_disjoint(std::vector<Block> live) {
  std::sort(live.begin(), live.end(), [](const Block& a, const Block& b) { return a.p < b.p; });
  for (std::size_t i = 1; i < live.size(); ++i) {
    const auto end = reinterpret_cast<std::uintptr_t>(live[i - 1].p) + live[i - 1].size;
    expect(end <= reinterpret_cast<std::uintptr_t>(live[i].p),
           "live blocks overlap: [%p, +%zu) (tag %u) and %p (tag %u)", live[i - 1].p,
           live[i - 1].size, live[i - 1].tag, live[i].p, live[i].tag);
  }
}

void many_sizes(std::uint64_t seed) {
  note("seed %" PRIu64 " (--seed N to repeat)", seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(std::log(512.0), std::log(64.0 * MiB));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr int kMaxLive = 256;
  unsigned long long* errors = nullptr;  // one counter per slot of `live`
  CHECK(cudaMalloc(&errors, kMaxLive * sizeof *errors));

  std::vector<Block> live;
  std::uint32_t next_tag = 1000;
  std::size_t reused = 0, allocated = 0;
  std::vector<std::uintptr_t> freed;  // addresses freed so far, to count reuse
  for (int round = 0; round < 4; ++round) {
    std::vector<std::size_t> sizes;
    if (round == 0)  // the edges of the small classes and of the 2 MiB granules
      sizes = {512, 513, 4096, MiB - 1, MiB, MiB + 1, 2 * MiB - 1, 2 * MiB, 2 * MiB + 1, 64 * MiB};
    while (sizes.size() < 60) sizes.push_back(std::size_t(std::exp(log_size(rng))));
    for (std::size_t size : sizes) {
      Block b;
      b.size = size;
      b.tag = next_tag++;
      b.async = rng() % 2;
      if (b.async)
        CHECK(cudaMallocAsync(&b.p, size, s));
      else
        CHECK(cudaMalloc(&b.p, size));
      expect(reinterpret_cast<std::uintptr_t>(b.p) % 256 == 0, "%s(%zu) = %p: not 256-aligned",
             b.async ? "cudaMallocAsync" : "cudaMalloc", size, b.p);
      const auto addr = reinterpret_cast<std::uintptr_t>(b.p);
      reused += std::find(freed.begin(), freed.end(), addr) != freed.end();
      ++allocated;
      const cudaStream_t fs = b.async ? s : cudaStream_t{0};
      CHECK(cudaMemsetAsync(b.p, 0xA5, size, fs));  // poison, then the block's own pattern
      fill_bytes(b.p, size, b.tag, fs);
      live.push_back(b);
    }
    expect_disjoint(live);
    CHECK(cudaDeviceSynchronize());  // every block written before any is verified
    CHECK(cudaMemset(errors, 0, kMaxLive * sizeof *errors));
    for (std::size_t i = 0; i < live.size(); ++i)
      verify_bytes(live[i].p, live[i].size, live[i].tag, errors + i);
    std::vector<unsigned long long> bad(live.size());
    CHECK(cudaMemcpy(bad.data(), errors, bad.size() * sizeof bad[0], cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < live.size(); ++i)
      expect(bad[i] == 0, "round %d: block tag %u at %p (%zu B) has %llu wrong bytes", round,
             live[i].tag, live[i].p, live[i].size, bad[i]);
    CHECK(cudaDeviceSynchronize());
    // Free a random half (all at the end).
    std::shuffle(live.begin(), live.end(), rng);
    const std::size_t keep = round == 3 ? 0 : live.size() / 2;
    for (std::size_t i = keep; i < live.size(); ++i) {
      if (live[i].async)
        CHECK(cudaFreeAsync(live[i].p, s));
      else
        CHECK(cudaFree(live[i].p));
      freed.push_back(reinterpret_cast<std::uintptr_t>(live[i].p));
    }
    live.resize(keep);
  }
  CHECK(cudaStreamSynchronize(s));
  note("%zu blocks, %zu of them at an address freed earlier", allocated, reused);
  CHECK(cudaFree(errors));
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc, argv, "shim_basic");
  start(program, argc, argv);
  const char* seed = flag_value(argc, argv, "--seed");
  run_case("malloc_free", malloc_free);
  run_case("mem_get_info", mem_get_info);
  run_case("malloc_async", malloc_async);
  run_case("graph", graph);
  run_case("graph_alloc_nodes", graph_alloc_nodes);
  run_case("many_sizes", [&] { many_sizes(seed ? std::strtoull(seed, nullptr, 0) : 20261201); });
  CHECK(cudaDeviceSynchronize());
  return finish(program);
}
