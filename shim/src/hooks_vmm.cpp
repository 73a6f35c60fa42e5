// The driver's virtual memory management calls, served as one cuarena block per
// cuMemCreate + cuMemAddressReserve + cuMemMap (vmm_tokens.hpp says how), or passed to the
// driver. Served (servable()): pinned memory on the current context's device with no allocation
// flags and nothing cuarena's own memory lacks: GPUDirect RDMA capable only where cuarena's is,
// a POSIX file-descriptor handle type (XLA asks for one on every buffer) unless serve_shareable
// is off or NCCL or NVSHMEM asks (they export theirs to other processes, which a part of a
// cuarena mapping cannot be). Exporting a served handle fails, logged.
#include <dlfcn.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstring>

#include "driver_hook.hpp"
#include "hooks.hpp"
#include "real_driver.hpp"
#include "serve.hpp"
#include "shim.hpp"
#include "vmm_tokens.hpp"

using namespace cuarena;
using namespace cuarena::shim;

namespace {
const RealDriver& real() { return RealDriver::get(); }

VmmTokens& tokens() {
  static VmmTokens* t = new VmmTokens();  // lives as long as the process (hooks run at exit)
  return *t;
}

/// The properties of device memory on `device` with `traits`: what a served handle reports,
/// and what a materialized one is created with.
CUmemAllocationProp prop_of(int device, VmmTokens::Traits traits = {}) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(traits.handle_types);
  p.allocFlags.gpuDirectRDMACapable = traits.rdma ? 1 : 0;
  return p;
}

/// Whether the code at `caller` belongs to a library that exports its cuMem handles to other
/// processes (NCCL, NVSHMEM), by the name of the object holding it.
bool exporting_library(const void* caller) {
  Dl_info info{};
  if (caller == nullptr || dladdr(caller, &info) == 0 || info.dli_fname == nullptr) return false;
  return std::strstr(info.dli_fname, "nccl") != nullptr ||
         std::strstr(info.dli_fname, "nvshmem") != nullptr;
}

/// The traits of a cuMemCreate the shim serves on `s`, called from `caller`; nullopt with
/// `why` set for one it leaves to the driver.
std::optional<VmmTokens::Traits> servable(const CUmemAllocationProp* prop, unsigned long long flags,
                                          const DeviceState& s, const void* caller,
                                          const char*& why) {
  if (prop == nullptr || flags != 0) return why = "flags", std::nullopt;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != s.device())
    return why = "not device memory of the current context", std::nullopt;
  using Flags = decltype(prop->allocFlags);
  const Flags& f = prop->allocFlags;
  const Flags none{};
  Flags rest = f;
  rest.gpuDirectRDMACapable = 0;
  if (prop->win32HandleMetaData != nullptr || std::memcmp(&rest, &none, sizeof rest) != 0)
    return why = "allocation flags (compression, usage)", std::nullopt;
  VmmTokens::Traits t;
  t.rdma = f.gpuDirectRDMACapable != 0;
  if (t.rdma && !s.rdma_capable())
    return why = "GPUDirect RDMA capable, which cuarena's memory is not here", std::nullopt;
  t.handle_types = int(prop->requestedHandleTypes);
  if (t.handle_types == CU_MEM_HANDLE_TYPE_NONE) return t;
  if (t.handle_types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return why = "a handle type other than a POSIX file descriptor", std::nullopt;
  if (!Shim::get().config().serve_shareable)
    return why = "a POSIX file-descriptor handle (serve_shareable:False)", std::nullopt;
  if (exporting_library(caller))
    return why = "a POSIX file-descriptor handle asked by NCCL or NVSHMEM", std::nullopt;
  return t;
}

/// The device's minimum mapping granularity (2 MiB on current GPUs), asked once per device.
std::size_t granularity(int device) {
  constexpr int kDevices = 64;
  static std::atomic<std::size_t> cache[kDevices];
  std::size_t g = device >= 0 && device < kDevices ? cache[device].load() : 0;
  if (g != 0) return g;
  const CUmemAllocationProp p = prop_of(device);
  if (real().granularity == nullptr ||
      real().granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || g == 0)
    g = std::size_t{2} << 20;
  if (device >= 0 && device < kDevices) cache[device].store(g);
  return g;
}

/// Whether another device can access `device`'s memory directly. Frameworks grant such peers
/// access to each buffer (cuMemSetAccess), which a cuarena block, one part of a larger mapping,
/// cannot take on its own: their buffers stay the driver's. Asked once per device.
bool has_peers(int device) {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices];  // 0 unknown, 1 none, 2 some
  if (device < 0 || device >= kDevices) return true;
  if (const int known = cache[device].load()) return known == 2;
  const RealDriver& d = real();
  int count = 0;
  bool peers = d.device_count == nullptr || d.can_access_peer == nullptr ||
               d.device_count(&count) != CUDA_SUCCESS;
  for (int other = 0; !peers && other < count; ++other) {
    int can = 0;
    if (other != device &&
        d.can_access_peer(&can, CUdevice(other), CUdevice(device)) == CUDA_SUCCESS)
      peers = can != 0;
  }
  cache[device].store(peers ? 2 : 1);
  return peers;
}

/// Frees a served block as cuMemFree would (held until a fence orders its reuse).
CUresult free_block(DevicePtr block) {
  const std::optional<CUresult> r = serve_free(CUdeviceptr(block), nullptr, Ordering::kSync);
  return r ? *r : CUDA_ERROR_INVALID_VALUE;
}
}  // namespace

CUARENA_HOOK CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                  const CUmemAllocationProp* prop, unsigned long long flags) {
  const void* caller = __builtin_return_address(0);
  return guarded("cuMemCreate", [&]() -> CUresult {
    Shim& shim = Shim::get();
    DeviceState* s = handle != nullptr && size != 0 ? shim.current() : nullptr;
    const char* why = "no cuarena device current";
    const std::optional<VmmTokens::Traits> traits =
        s != nullptr ? servable(prop, flags, *s, caller, why) : std::nullopt;
    if (traits) {
      *handle = tokens().create(size, s->device(), *traits);
      shim.served();
      if (shim.logging())
        shim.log("cuMemCreate %zu B device %d handle types %d rdma %d: token %#llx", size,
                 s->device(), traits->handle_types, int(traits->rdma), *handle);
      return CUDA_SUCCESS;
    }
    if (shim.logging()) shim.log("cuMemCreate %zu B passed to the driver: %s", size, why);
    return or_pass("cuMemCreate", std::nullopt,
                   [&] { return real().mem_create(handle, size, prop, flags); });
  });
}

CUARENA_HOOK CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                          CUdeviceptr addr, unsigned long long flags) {
  return guarded("cuMemAddressReserve", [&]() -> CUresult {
    DeviceState* s = ptr != nullptr && addr == 0 && flags == 0 ? Shim::get().current() : nullptr;
    if (s != nullptr && has_peers(s->device())) s = nullptr;
    std::optional<VmmTokens::Handle> h;
    std::optional<VmmTokens::Token> t;
    // The driver wants a power of two (0: its default); cuarena's block is placed at it.
    if (s != nullptr && (alignment == 0 || std::has_single_bit(alignment)) &&
        (h = tokens().pending_for(size, granularity(s->device()))) && (t = tokens().get(*h)) &&
        t->device == s->device()) {
      CUdeviceptr p = 0;
      const std::optional<CUresult> r =
          serve_alloc(&p, t->size, nullptr, Ordering::kSync, alignment);
      if (r && *r != CUDA_SUCCESS) return *r;  // out of memory, as a reservation can be
      if (r) {
        tokens().bind(*h, DevicePtr(p));
        *ptr = p;
        return CUDA_SUCCESS;
      }
    }
    return or_pass("cuMemAddressReserve", std::nullopt,
                   [&] { return real().address_reserve(ptr, size, alignment, addr, flags); });
  });
}

CUARENA_HOOK CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                               CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return guarded("cuMemMap", [&]() -> CUresult {
    Shim& shim = Shim::get();
    if (!tokens().is_token(handle))
      return or_pass("cuMemMap", std::nullopt,
                     [&] { return real().mem_map(ptr, size, offset, handle, flags); });
    switch (tokens().map(DevicePtr(ptr), size, offset, handle)) {
      case VmmTokens::Map::kBound:
        shim.served();
        return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
      case VmmTokens::Map::kAlias:
        shim.log("cuMemMap of token %#llx at %#llx: it is another range's memory already", handle,
                 static_cast<unsigned long long>(ptr));
        return CUDA_ERROR_NOT_SUPPORTED;
      case VmmTokens::Map::kMaterialize: {
        const VmmTokens::Token t = *tokens().get(handle);
        const CUmemAllocationProp p = prop_of(t.device, t.traits);
        CUmemGenericAllocationHandle made = 0;
        const CUresult r = real().mem_create(&made, t.size, &p, 0);
        if (r != CUDA_SUCCESS) return r;
        tokens().set_real(handle, made);
        if (shim.logging())
          shim.log("token %#llx mapped at a range of the driver's: created as %#llx", handle, made);
        break;
      }
      case VmmTokens::Map::kReal:
        break;
    }
    shim.passed();
    return real().mem_map(ptr, size, offset, tokens().get(handle)->real, flags);
  });
}

CUARENA_HOOK CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                     size_t count) {
  return guarded("cuMemSetAccess", [&]() -> CUresult {
    if (const std::optional<VmmTokens::Token> t = tokens().range(DevicePtr(ptr))) {
      bool own = desc != nullptr && count != 0;
      for (std::size_t i = 0; own && i < count; ++i)
        own = desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
              desc[i].location.id == t->device &&
              desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      Shim::get().served();
      if (own) return CUDA_SUCCESS;  // cuarena's memory is read-write to its device already
      // Another device's access: granted on the block's range, as the driver allows it.
      Shim::get().log("cuMemSetAccess for another device on %#llx (%zu B)",
                      static_cast<unsigned long long>(ptr), size);
    }
    return real().mem_set_access(ptr, size, desc, count);
  });
}

CUARENA_HOOK CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded("cuMemUnmap", [&]() -> CUresult {
    if (tokens().unmap(DevicePtr(ptr))) {
      Shim::get().served();
      return CUDA_SUCCESS;
    }
    return or_pass("cuMemUnmap", std::nullopt, [&] { return real().mem_unmap(ptr, size); });
  });
}

CUARENA_HOOK CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guarded("cuMemAddressFree", [&]() -> CUresult {
    const VmmTokens::Freed f = tokens().free_range(DevicePtr(ptr));
    if (!f.ours)
      return or_pass("cuMemAddressFree", std::nullopt,
                     [&] { return real().address_free(ptr, size); });
    Shim::get().served();
    return f.block != 0 ? free_block(f.block) : CUDA_SUCCESS;
  });
}

CUARENA_HOOK CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guarded("cuMemRelease", [&]() -> CUresult {
    const VmmTokens::Freed f = tokens().release(handle);
    if (!f.ours)
      return or_pass("cuMemRelease", std::nullopt, [&] { return real().mem_release(handle); });
    if (f.real != 0) return real().mem_release(f.real);
    Shim::get().served();
    return f.block != 0 ? free_block(f.block) : CUDA_SUCCESS;
  });
}

CUARENA_HOOK CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                  void* addr) {
  return guarded("cuMemRetainAllocationHandle", [&]() -> CUresult {
    if (handle != nullptr) {
      if (const std::optional<VmmTokens::Handle> h =
              tokens().retain(DevicePtr(reinterpret_cast<std::uintptr_t>(addr)))) {
        *handle = *h;
        Shim::get().served();
        return CUDA_SUCCESS;
      }
    }
    return or_pass("cuMemRetainAllocationHandle", std::nullopt,
                   [&] { return real().retain_handle(handle, addr); });
  });
}

CUARENA_HOOK CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                             CUmemGenericAllocationHandle handle) {
  return guarded("cuMemGetAllocationPropertiesFromHandle", [&]() -> CUresult {
    const std::optional<VmmTokens::Token> t = tokens().get(handle);
    if (!t)
      return or_pass("cuMemGetAllocationPropertiesFromHandle", std::nullopt,
                     [&] { return real().allocation_properties(prop, handle); });
    if (t->real != 0) return real().allocation_properties(prop, t->real);
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *prop = prop_of(t->device, t->traits);
    return CUDA_SUCCESS;
  });
}

CUARENA_HOOK CUresult cuMemExportToShareableHandle(void* shareable,
                                                   CUmemGenericAllocationHandle handle,
                                                   CUmemAllocationHandleType type,
                                                   unsigned long long flags) {
  return guarded("cuMemExportToShareableHandle", [&]() -> CUresult {
    const std::optional<VmmTokens::Token> t = tokens().get(handle);
    if (!t)
      return or_pass("cuMemExportToShareableHandle", std::nullopt,
                     [&] { return real().export_handle(shareable, handle, type, flags); });
    if (t->real != 0) return real().export_handle(shareable, t->real, type, flags);
    if ((t->traits.handle_types & int(type)) == 0) return CUDA_ERROR_INVALID_VALUE;  // as asked
    // Served: its memory is a part of a cuarena mapping, which no handle stands for alone.
    std::fprintf(stderr,
                 "cuarena: cuMemExportToShareableHandle of %#llx: its memory is cuarena's and "
                 "cannot be exported; CUARENA_CONF=serve_shareable:False leaves such memory to "
                 "the driver\n",
                 static_cast<unsigned long long>(handle));
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}
