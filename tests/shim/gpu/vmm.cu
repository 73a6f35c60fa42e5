// shim_vmm: the driver's virtual memory calls as frameworks make them. Cases:
//   xla_order          cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess per buffer
//                      (XLA's VMM allocator, 2026), sizes 2-64 MiB, each filled and verified,
//                      then unmapped, its range freed and its handle released. Under the shim
//                      the handles are the shim's (served: it hands out tokens, 0xC0A4...).
//   release_first      the handle released while mapped: the memory stays the program's until
//                      the range is unmapped and freed (CUDA's rule); verified after the release
//   reserve_first      one range reserved first, two handles mapped into it (PyTorch's
//                      expandable segments): under the shim the handles become real memory at
//                      their map; the whole range verified
//   xla_props          XLA's own properties (2026): a POSIX file-descriptor handle type, GPUDirect
//                      RDMA capable where the device supports it with VMM, aligned to the
//                      recommended granularity; freed as XLA does (unmap, release, range free).
//                      Under the shim: served (a token), its properties reported as asked
//   shareable          a POSIX file-descriptor handle exported: without the shim (and under it
//                      with --shareable-stays, for CUARENA_CONF=serve_shareable:False) the
//                      driver's, exported to a file descriptor; under the shim by default
//                      served, and its export refused with CUDA_ERROR_NOT_SUPPORTED
//   dlsym_path         cuMemCreate looked up with dlsym on libcuda's handle (XLA's stubs) is
//                      the shim's: its handle is a token
// Flags: --expect-shim / --expect-no-shim, --shareable-stays.
#include <dlfcn.h>
#include <unistd.h>

#include <vector>

#include "shim_test.cuh"

using namespace shimtest;

namespace {

constexpr unsigned long long kTokenBase = 0xC0A4'0000'0000'0000ull;
bool g_shim = false;
bool g_shareable_stays = false;  // --shareable-stays: the shim leaves shareable memory alone

CUmemAllocationProp plain_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  return p;
}

std::size_t granularity(const CUmemAllocationProp& p) {
  std::size_t g = 0;
  CHECK_DRV(Driver::get().granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return g;
}

void set_access(CUdeviceptr p, std::size_t size) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_DRV(Driver::get().mem_set_access(p, size, &d, 1));
}

unsigned long long* g_errors = nullptr;

// Fills [p, p + n) with tag's pattern and verifies it; returns the bytes that differ.
unsigned long long fill_and_verify(CUdeviceptr p, std::size_t n, std::uint32_t tag) {
  CHECK(cudaMemset(g_errors, 0, sizeof *g_errors));
  fill_bytes(reinterpret_cast<void*>(p), n, tag);
  verify_bytes(reinterpret_cast<void*>(p), n, tag, g_errors);
  unsigned long long bad = 0;
  CHECK(cudaMemcpy(&bad, g_errors, sizeof bad, cudaMemcpyDeviceToHost));
  return bad;
}

unsigned long long verify(CUdeviceptr p, std::size_t n, std::uint32_t tag) {
  CHECK(cudaMemset(g_errors, 0, sizeof *g_errors));
  verify_bytes(reinterpret_cast<void*>(p), n, tag, g_errors);
  unsigned long long bad = 0;
  CHECK(cudaMemcpy(&bad, g_errors, sizeof bad, cudaMemcpyDeviceToHost));
  return bad;
}

void xla_order() {
  const Driver& d = Driver::get();
  const CUmemAllocationProp prop = plain_prop();
  const std::size_t g = granularity(prop);
  std::uint32_t tag = 1;
  for (int round = 0; round < 3; ++round) {
    struct Buf {
      CUmemGenericAllocationHandle h;
      CUdeviceptr p;
      std::size_t size;
      std::uint32_t tag;
    };
    std::vector<Buf> bufs;
    for (std::size_t granules : {1, 2, 3, 32}) {
      Buf b{0, 0, granules * g, tag++};
      CHECK_DRV(d.mem_create(&b.h, b.size, &prop, 0));
      // Aligned to the granularity, as XLA asks.
      CHECK_DRV(d.address_reserve(&b.p, b.size, g, 0, 0));
      expect(b.p % g == 0, "range %#llx not aligned to %zu", static_cast<unsigned long long>(b.p),
             g);
      CHECK_DRV(d.mem_map(b.p, b.size, 0, b.h, 0));
      set_access(b.p, b.size);
      expect(fill_and_verify(b.p, b.size, b.tag) == 0, "%zu B buffer: wrong bytes", b.size);
      if (g_shim)
        expect(b.h >= kTokenBase, "under the shim cuMemCreate's handle %#llx is the driver's",
               static_cast<unsigned long long>(b.h));
      bufs.push_back(b);
    }
    for (const Buf& b : bufs)  // all live at once: disjoint, each still its own pattern
      expect(verify(b.p, b.size, b.tag) == 0, "%zu B buffer changed while others lived", b.size);
    CHECK(cudaDeviceSynchronize());
    for (const Buf& b : bufs) {
      CHECK_DRV(d.mem_unmap(b.p, b.size));
      CHECK_DRV(d.address_free(b.p, b.size));
      CHECK_DRV(d.mem_release(b.h));
    }
  }
}

void release_first() {
  const Driver& d = Driver::get();
  const CUmemAllocationProp prop = plain_prop();
  const std::size_t size = 4 * granularity(prop);
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr p = 0;
  CHECK_DRV(d.mem_create(&h, size, &prop, 0));
  CHECK_DRV(d.address_reserve(&p, size, 0, 0, 0));
  CHECK_DRV(d.mem_map(p, size, 0, h, 0));
  set_access(p, size);
  expect(fill_and_verify(p, size, 77) == 0, "before the release: wrong bytes");
  CHECK_DRV(d.mem_release(h));
  // Other allocations meanwhile must not be given this memory.
  void* other = nullptr;
  CHECK(cudaMalloc(&other, size));
  fill_bytes(other, size, 78);
  expect(verify(p, size, 77) == 0, "after its handle's release the mapped memory changed");
  CHECK(cudaFree(other));
  CHECK_DRV(d.mem_unmap(p, size));
  CHECK_DRV(d.address_free(p, size));
}

void reserve_first() {
  const Driver& d = Driver::get();
  const CUmemAllocationProp prop = plain_prop();
  const std::size_t g = granularity(prop);
  const std::size_t half = 2 * g;
  CUdeviceptr range = 0;
  CHECK_DRV(d.address_reserve(&range, 2 * half, 0, 0, 0));
  CUmemGenericAllocationHandle h[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    CHECK_DRV(d.mem_create(&h[i], half, &prop, 0));
    CHECK_DRV(d.mem_map(range + i * half, half, 0, h[i], 0));
  }
  set_access(range, 2 * half);
  expect(fill_and_verify(range, 2 * half, 91) == 0, "the range of two mapped handles");
  CHECK(cudaDeviceSynchronize());
  CHECK_DRV(d.mem_unmap(range, 2 * half));
  for (auto handle : h) CHECK_DRV(d.mem_release(handle));
  CHECK_DRV(d.address_free(range, 2 * half));
}

void xla_props() {
  const Driver& d = Driver::get();
  CUmemAllocationProp prop = plain_prop();
  int rdma = 0;
  CHECK_DRV(d.device_attribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                               0));  // the runtime names no attribute for it
  prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t g = 0;
  CHECK_DRV(d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const bool served = g_shim && !g_shareable_stays;
  // A live buffer of an odd size first: under the shim, cuarena's next large block would start
  // off the granularity unless placed at the alignment the reservation asks for.
  void* odd = nullptr;
  CHECK(cudaMalloc(&odd, (3u << 20) + 512));
  std::uint32_t tag = 40;
  for (std::size_t granules : {1, 5, 16}) {
    const std::size_t size = granules * g;
    CUmemGenericAllocationHandle h = 0;
    CHECK_DRV(d.mem_create(&h, size, &prop, 0));
    expect(served == (h >= kTokenBase), "XLA's handle %#llx: expected %s",
           static_cast<unsigned long long>(h), served ? "a token (served)" : "the driver's");
    CUmemAllocationProp back{};
    CHECK_DRV(d.allocation_properties(&back, h));
    expect(back.requestedHandleTypes == prop.requestedHandleTypes &&
               back.allocFlags.gpuDirectRDMACapable == prop.allocFlags.gpuDirectRDMACapable &&
               back.location.id == 0,
           "properties reported: handle types %d rdma %d, asked %d %d",
           int(back.requestedHandleTypes), int(back.allocFlags.gpuDirectRDMACapable),
           int(prop.requestedHandleTypes), int(prop.allocFlags.gpuDirectRDMACapable));
    CUdeviceptr p = 0;
    CHECK_DRV(d.address_reserve(&p, size, g, 0, 0));
    expect(p % g == 0, "range %#llx not aligned to %zu", static_cast<unsigned long long>(p), g);
    CHECK_DRV(d.mem_map(p, size, 0, h, 0));
    set_access(p, size);
    // Served, the range is the token's own cuarena block (not memory the driver created for
    // the token at its map): the handle mapped there is the token.
    CUmemGenericAllocationHandle there = 0;
    CHECK_DRV(d.retain_handle(&there, reinterpret_cast<void*>(p)));
    expect(served == (there >= kTokenBase),
           "%zu B range aligned to %zu: handle %#llx there, "
           "expected %s",
           size, g, static_cast<unsigned long long>(there),
           served ? "the token (cuarena's block)" : "the driver's");
    CHECK_DRV(d.mem_release(there));
    expect(fill_and_verify(p, size, tag++) == 0, "%zu B buffer: wrong bytes", size);
    CHECK(cudaDeviceSynchronize());
    CHECK_DRV(d.mem_unmap(p, size));
    CHECK_DRV(d.mem_release(h));
    CHECK_DRV(d.address_free(p, size));
  }
  CHECK(cudaFree(odd));
}

void shareable() {
  const Driver& d = Driver::get();
  CUmemAllocationProp prop = plain_prop();
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const std::size_t size = granularity(prop);
  CUmemGenericAllocationHandle h = 0;
  CHECK_DRV(d.mem_create(&h, size, &prop, 0));
  const bool served = g_shim && !g_shareable_stays;
  expect(served == (h >= kTokenBase), "shareable handle %#llx: expected %s",
         static_cast<unsigned long long>(h), served ? "a token (served)" : "the driver's");
  CUdeviceptr p = 0;
  CHECK_DRV(d.address_reserve(&p, size, 0, 0, 0));
  CHECK_DRV(d.mem_map(p, size, 0, h, 0));
  set_access(p, size);
  int fd = -1;
  const CUresult r = d.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (served) {
    expect(r == CUDA_ERROR_NOT_SUPPORTED, "export of a served handle: %s, expected refused",
           driver_error_name(r));
  } else {
    expect(r == CUDA_SUCCESS && fd >= 0, "export: %s, fd %d", driver_error_name(r), fd);
  }
  if (fd >= 0) close(fd);
  expect(fill_and_verify(p, size, 5) == 0, "shareable buffer: wrong bytes");
  CHECK(cudaDeviceSynchronize());
  CHECK_DRV(d.mem_unmap(p, size));
  CHECK_DRV(d.address_free(p, size));
  CHECK_DRV(d.mem_release(h));
}

void dlsym_path() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  expect(lib != nullptr, "libcuda.so.1 is not loaded");
  if (lib == nullptr) return;
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                              unsigned long long);
  auto create = reinterpret_cast<Create>(dlsym(lib, "cuMemCreate"));
  expect(create != nullptr, "dlsym(libcuda, cuMemCreate) is NULL");
  if (create == nullptr) return;
  const CUmemAllocationProp prop = plain_prop();
  CUmemGenericAllocationHandle h = 0;
  CHECK_DRV(create(&h, granularity(prop), &prop, 0));
  if (g_shim)
    expect(h >= kTokenBase, "dlsym's cuMemCreate is the driver's under the shim (handle %#llx)",
           static_cast<unsigned long long>(h));
  CHECK_DRV(Driver::get().mem_release(h));
  dlclose(lib);
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc, argv, "shim_vmm");
  g_shim = start(program, argc, argv);
  g_shareable_stays = has_flag(argc, argv, "--shareable-stays");
  CHECK(cudaFree(nullptr));  // the primary context, current
  CHECK(cudaMalloc(&g_errors, sizeof *g_errors));
  run_case("xla_order", xla_order);
  run_case("release_first", release_first);
  run_case("reserve_first", reserve_first);
  run_case("xla_props", xla_props);
  run_case("shareable", shareable);
  run_case("dlsym_path", dlsym_path);
  CHECK(cudaFree(g_errors));
  return finish(program);
}
