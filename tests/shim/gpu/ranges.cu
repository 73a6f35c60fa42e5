// shim_ranges: what the driver says about a pointer, for allocations the shim carves out of its
// pools: each must look like an allocation of its own, as the real driver answers for its own.
//
// Allocations of several sizes (512 B to 64 MiB, odd sizes among them) from cudaMalloc,
// cuMemAlloc_v2 and cudaMallocAsync. For each, at its base, in its middle and at its last byte:
//   - cuMemGetAddressRange_v2 gives [base, base + requested size);
//   - cuPointerGetAttributes (RANGE_START_ADDR, RANGE_SIZE, BUFFER_ID, DEVICE_ORDINAL,
//     MEMORY_TYPE) gives the same range, one buffer id for the whole allocation, device 0,
//     device memory; cuPointerGetAttribute gives the same values one at a time;
//   - cudaPointerGetAttributes says device memory on device 0;
//   - just past the end (base + size) belongs to another allocation or none, never this one.
// Buffer ids: distinct across live allocations, and never given twice in the process (the
// driver documents them unique within the process): an allocation freed and made again, at the
// same address or not, gets a new one (the program says whether the address was the same).
// The same assertions hold without the shim: the real driver answers so for its own memory.
#include <set>
#include <vector>

#include "shim_test.cuh"

using namespace shimtest;

namespace {

enum class Api { Runtime, Driver, RuntimeAsync };

const char* api_name(Api a) {
  return a == Api::Runtime ? "cudaMalloc" : a == Api::Driver ? "cuMemAlloc_v2" : "cudaMallocAsync";
}

struct Alloc {
  Api api;
  std::size_t size;
  CUdeviceptr p = 0;
  unsigned long long id = 0;
};

cudaStream_t g_stream;

CUdeviceptr alloc(Api api, std::size_t size) {
  void* p = nullptr;
  CUdeviceptr dp = 0;
  switch (api) {
    case Api::Runtime:
      CHECK(cudaMalloc(&p, size));
      return reinterpret_cast<CUdeviceptr>(p);
    case Api::Driver:
      CHECK_DRV(Driver::get().mem_alloc(&dp, size));
      return dp;
    case Api::RuntimeAsync:
      CHECK(cudaMallocAsync(&p, size, g_stream));
      CHECK(cudaStreamSynchronize(g_stream));
      return reinterpret_cast<CUdeviceptr>(p);
  }
  return 0;
}

void release(Api api, CUdeviceptr p) {
  switch (api) {
    case Api::Runtime:
      CHECK(cudaFree(reinterpret_cast<void*>(p)));
      break;
    case Api::Driver:
      CHECK_DRV(Driver::get().mem_free(p));
      break;
    case Api::RuntimeAsync:
      CHECK(cudaFreeAsync(reinterpret_cast<void*>(p), g_stream));
      CHECK(cudaStreamSynchronize(g_stream));
      break;
  }
}

struct Attributes {
  CUdeviceptr start = 0;
  std::size_t size = 0;
  unsigned long long buffer_id = 0;
  int ordinal = -1;
  unsigned memory_type = 0;
};

Attributes attributes(CUdeviceptr q) {
  Attributes a;
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  void* data[] = {&a.start, &a.size, &a.buffer_id, &a.ordinal, &a.memory_type};
  CHECK_DRV(Driver::get().pointer_get_attributes(5, which, data, q));
  return a;
}

// Every check for one allocation; returns its buffer id.
unsigned long long check_allocation(const Alloc& al) {
  const Driver& d = Driver::get();
  const CUdeviceptr p = al.p;
  const char* api = api_name(al.api);
  std::vector<std::pair<const char*, CUdeviceptr>> probes = {{"base", p}};
  if (al.size > 2) probes.push_back({"middle", p + al.size / 2});
  if (al.size > 1) probes.push_back({"last byte", p + al.size - 1});

  unsigned long long id = 0;
  for (const auto& [where, q] : probes) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    CHECK_DRV(d.mem_get_address_range(&base, &size, q));
    expect(base == p && size == al.size,
           "%s(%zu) = 0x%llx: cuMemGetAddressRange_v2 at its %s gives [0x%llx, +%zu), not "
           "[0x%llx, +%zu)",
           api, al.size, (unsigned long long)p, where, (unsigned long long)base, size,
           (unsigned long long)p, al.size);

    const Attributes a = attributes(q);
    expect(a.start == p && a.size == al.size,
           "%s(%zu): cuPointerGetAttributes at its %s: range [0x%llx, +%zu), not [0x%llx, +%zu)",
           api, al.size, where, (unsigned long long)a.start, a.size, (unsigned long long)p,
           al.size);
    expect(a.ordinal == 0, "%s(%zu) at its %s: DEVICE_ORDINAL %d, not 0", api, al.size, where,
           a.ordinal);
    expect(a.memory_type == CU_MEMORYTYPE_DEVICE, "%s(%zu) at its %s: MEMORY_TYPE %u, not device",
           api, al.size, where, a.memory_type);
    if (q == p)
      id = a.buffer_id;
    else
      expect(a.buffer_id == id, "%s(%zu): BUFFER_ID %llu at its %s, %llu at its base", api, al.size,
             a.buffer_id, where, id);

    CUdeviceptr start1 = 0;
    std::size_t size1 = 0;
    unsigned long long id1 = 0;
    CHECK_DRV(d.pointer_get_attribute(&start1, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q));
    CHECK_DRV(d.pointer_get_attribute(&size1, CU_POINTER_ATTRIBUTE_RANGE_SIZE, q));
    CHECK_DRV(d.pointer_get_attribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
    expect(start1 == a.start && size1 == a.size && id1 == a.buffer_id,
           "%s(%zu) at its %s: cuPointerGetAttribute (0x%llx, %zu, id %llu) and "
           "cuPointerGetAttributes (0x%llx, %zu, id %llu) differ",
           api, al.size, where, (unsigned long long)start1, size1, id1, (unsigned long long)a.start,
           a.size, a.buffer_id);

    cudaPointerAttributes ra{};
    CHECK(cudaPointerGetAttributes(&ra, reinterpret_cast<void*>(q)));
    expect(ra.type == cudaMemoryTypeDevice && ra.device == 0,
           "%s(%zu) at its %s: cudaPointerGetAttributes type %d device %d", api, al.size, where,
           int(ra.type), ra.device);
  }

  // Just past the end: another allocation's (or nobody's), never this one's.
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (d.mem_get_address_range(&base, &size, p + al.size) == CUDA_SUCCESS)
    expect(base != p, "%s(%zu) = 0x%llx: the byte past its end reports the same range start", api,
           al.size, (unsigned long long)p);
  return id;
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc, argv, "shim_ranges");
  start(program, argc, argv);
  Driver::get();
  CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));

  std::vector<Alloc> allocs;
  std::set<unsigned long long> ids_ever;  // every buffer id seen in this process
  run_case("ranges_and_attributes", [&] {
    for (std::size_t size : {std::size_t{512}, std::size_t{512}, std::size_t{1000}, 4 * KiB,
                             64 * KiB + 3, MiB, MiB + 1, 3 * MiB, 64 * MiB + 12345})
      allocs.push_back({Api::Runtime, size});
    for (std::size_t size : {std::size_t{777}, 2 * MiB + 5}) allocs.push_back({Api::Driver, size});
    for (std::size_t size : {std::size_t{2048}, 5 * MiB})
      allocs.push_back({Api::RuntimeAsync, size});
    for (Alloc& a : allocs) a.p = alloc(a.api, a.size);
    for (Alloc& a : allocs) {
      a.id = check_allocation(a);
      expect(ids_ever.insert(a.id).second,
             "%s(%zu): BUFFER_ID %llu already belongs to another "
             "live allocation",
             api_name(a.api), a.size, a.id);
    }
  });

  run_case("new_buffer_id_after_free", [&] {
    int same_address = 0, tries = 0;
    for (Alloc& a : allocs) {
      // cudaMalloc's 512 B and 3 MiB blocks, and every driver and stream-ordered one.
      if (a.api == Api::Runtime && a.size != 512 && a.size != 3 * MiB) continue;
      for (int round = 0; round < 3; ++round) {
        const CUdeviceptr old = a.p;
        const unsigned long long old_id = a.id;
        release(a.api, a.p);
        CHECK(cudaDeviceSynchronize());  // nothing pending: the freed block may come back at once
        a.p = alloc(a.api, a.size);
        a.id = check_allocation(a);
        ++tries;
        same_address += a.p == old;
        expect(ids_ever.insert(a.id).second,
               "%s(%zu) again at 0x%llx (%s address): BUFFER_ID "
               "%llu was given before (the old one was %llu)",
               api_name(a.api), a.size, (unsigned long long)a.p,
               a.p == old ? "the same" : "another", a.id, old_id);
      }
    }
    note("%d of %d reallocations came back at the freed address", same_address, tries);
  });

  for (Alloc& a : allocs) release(a.api, a.p);
  CHECK(cudaStreamDestroy(g_stream));
  return finish(program);
}
