#include "cuarena/cuda_vmm_backend.hpp"

#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "context.hpp"
#include "cuarena/driver_api.hpp"
#include "cuarena/errors.hpp"
#include "events.hpp"

namespace cuarena {

using cuda::DeviceGuard;

struct CudaVmmBackend::Impl {
  Impl(int d, CUcontext c) : device(d), context(c), events(d, log, c) {}
  const cuda::DriverApi& api = cuda::DriverApi::get();
  int device = 0;
  CUcontext context = nullptr;  // null: the device's primary context
  cuda::CallLog log;            // before events, which time into it
  cuda::EventPool events;
  std::size_t granule = 0;
  std::size_t capacity = 0;
  std::size_t created = 0;  // physical bytes held
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  // A chunk is one cuMemCreate handle per granule: cuMemMap maps only whole handles (offset 0,
  // full size; seen on the H200 with driver 580: CUDA_ERROR_NOT_SUPPORTED otherwise), and the
  // core maps and unmaps single granules.
  struct Chunk {
    std::vector<CUmemGenericAllocationHandle> handles;  // one per granule, or one for all
    bool whole = false;
    std::size_t bytes = 0;
  };
  std::unordered_map<PhysHandle, Chunk> chunks;
  std::map<DevicePtr, std::size_t> whole_maps;  // address -> bytes, whole mappings
  bool exportable = false;  // handles are created exportable as POSIX file descriptors
  std::unordered_map<CUmemGenericAllocationHandle, int> exported;  // handle -> its fd
  PhysHandle next_chunk = 1;

  CUmemGenericAllocationHandle create(std::size_t bytes, CUresult& r) {
    CUmemGenericAllocationHandle h = 0;
    r = log("cuMemCreate", [&] { return api.mem_create(&h, bytes, &prop, 0); });
    return h;
  }
};

CudaVmmBackend::CudaVmmBackend(int device, std::size_t capacity, void* context)
    : impl_(std::make_unique<Impl>(device, static_cast<CUcontext>(context))) {
  Impl& m = *impl_;
  DeviceGuard guard(device, m.context);  // initialises the driver and the primary context
  if (!cuda::device_attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device)) {
    throw BackendError("cuarena: device " + std::to_string(device) +
                       " does not support virtual memory management; use upstream:malloc");
  }
  m.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  m.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  m.prop.location.id = device;
  m.access.location = m.prop.location;
  m.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  cuda::check(m.api.granularity(&m.granule, &m.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              "cuMemGetAllocationGranularity");
  // Each capability where the device has it, one trial allocation telling (a sandbox may
  // refuse what the attribute promises): exportable memory (CUDA IPC, torch.multiprocessing),
  // and memory a NIC may reach (GPUDirect RDMA), as NCCL and XLA ask for theirs.
  auto probe = [&m] {
    CUmemGenericAllocationHandle h = 0;
    if (m.api.mem_create(&h, m.granule, &m.prop, 0) != CUDA_SUCCESS) return false;
    m.api.mem_release(h);
    return true;
  };
  if (cuda::device_attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                             device)) {
    m.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    m.exportable = probe();
    if (!m.exportable) m.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  }
  if (cuda::device_attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device)) {
    m.prop.allocFlags.gpuDirectRDMACapable = 1;
    if (!probe()) m.prop.allocFlags.gpuDirectRDMACapable = 0;
  }
  std::size_t free_bytes = 0, total_bytes = 0;
  cuda::mem_info(device, free_bytes, total_bytes, m.context);
  m.capacity = capacity ? capacity : total_bytes;
}

CudaVmmBackend::~CudaVmmBackend() {
  DeviceGuard guard(impl_->device, impl_->context);
  for (auto& [h, fd] : impl_->exported) ::close(fd);
  for (auto& [id, c] : impl_->chunks) {  // the core releases its chunks; this is a backstop
    for (auto h : c.handles) impl_->api.mem_release(h);
  }
}

std::size_t CudaVmmBackend::granularity() const { return impl_->granule; }
std::size_t CudaVmmBackend::capacity() const { return impl_->capacity; }
int CudaVmmBackend::device() const { return impl_->device; }
std::size_t CudaVmmBackend::driver_calls() const { return impl_->log.calls(); }
bool CudaVmmBackend::rdma_capable() const {
  return impl_->prop.allocFlags.gpuDirectRDMACapable != 0;
}
std::map<std::string, double> CudaVmmBackend::driver_us() const { return impl_->log.us(); }

DevicePtr CudaVmmBackend::reserve_address(std::size_t bytes) {
  CUdeviceptr ptr = 0;
  const CUresult r = impl_->log("cuMemAddressReserve", [&] {
    return impl_->api.address_reserve(&ptr, bytes, impl_->granule, 0, 0);
  });
  if (r != CUDA_SUCCESS) {
    throw BackendError(
        impl_->api.describe(r, "cuMemAddressReserve(" + std::to_string(bytes) + " bytes)"));
  }
  return DevicePtr(ptr);
}

void CudaVmmBackend::release_address(DevicePtr va, std::size_t bytes) {
  cuda::check(impl_->log("cuMemAddressFree",
                         [&] { return impl_->api.address_free(CUdeviceptr(va), bytes); }),
              "cuMemAddressFree");
}

PhysHandle CudaVmmBackend::create_physical(std::size_t bytes) {
  Impl& m = *impl_;
  if (m.created + bytes > m.capacity) return 0;
  Impl::Chunk c;
  c.bytes = bytes;
  c.handles.reserve(bytes / m.granule);
  for (std::size_t done = 0; done < bytes; done += m.granule) {
    CUresult r = CUDA_SUCCESS;
    const CUmemGenericAllocationHandle h = m.create(m.granule, r);
    if (r != CUDA_SUCCESS) {
      for (auto made : c.handles) m.api.mem_release(made);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
      throw BackendError(m.api.describe(r, "cuMemCreate(" + std::to_string(m.granule) + " bytes)"));
    }
    c.handles.push_back(h);
  }
  m.created += bytes;
  const PhysHandle id = m.next_chunk++;
  m.chunks.emplace(id, std::move(c));
  return id;
}

PhysHandle CudaVmmBackend::create_whole_physical(std::size_t bytes) {
  Impl& m = *impl_;
  if (m.created + bytes > m.capacity) return 0;
  CUresult r = CUDA_SUCCESS;
  const CUmemGenericAllocationHandle h = m.create(bytes, r);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
  if (r != CUDA_SUCCESS)
    throw BackendError(m.api.describe(r, "cuMemCreate(" + std::to_string(bytes) + " bytes)"));
  m.created += bytes;
  const PhysHandle id = m.next_chunk++;
  m.chunks.emplace(id, Impl::Chunk{{h}, true, bytes});
  return id;
}

void CudaVmmBackend::release_physical(PhysHandle chunk) {
  Impl& m = *impl_;
  auto it = m.chunks.find(chunk);
  if (it == m.chunks.end()) throw BackendError("cuarena: release_physical of an unknown chunk");
  for (auto h : it->second.handles) {
    if (auto e = m.exported.find(h); e != m.exported.end()) {
      ::close(e->second);
      m.exported.erase(e);
    }
    cuda::check(m.log("cuMemRelease", [&] { return m.api.mem_release(h); }), "cuMemRelease");
  }
  m.created -= it->second.bytes;
  m.chunks.erase(it);
}

void CudaVmmBackend::map(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) {
  map_runs(va, bytes, chunk, offset, true);
}

void CudaVmmBackend::map_no_access(DevicePtr va, std::size_t bytes, PhysHandle chunk,
                                   std::size_t offset) {
  map_runs(va, bytes, chunk, offset, false);
}

void CudaVmmBackend::set_access(DevicePtr va, std::size_t bytes) {
  Impl& m = *impl_;
  const CUresult r = m.log(
      "cuMemSetAccess", [&] { return m.api.mem_set_access(CUdeviceptr(va), bytes, &m.access, 1); });
  if (r != CUDA_SUCCESS)
    throw BackendError(m.api.describe(r, "cuMemSetAccess(" + std::to_string(bytes) + " bytes)"));
}

void CudaVmmBackend::map_runs(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset,
                              bool access) {
  Impl& m = *impl_;
  const std::size_t g = m.granule;
  const Impl::Chunk& c = m.chunks.at(chunk);
  const auto& handles = c.handles;
  if (c.whole) {
    if (offset != 0 || bytes != c.bytes)
      throw BackendError("cuarena: map of part of a whole chunk (the driver maps handles whole)");
    cuda::check(m.log("cuMemMap",
                      [&] { return m.api.mem_map(CUdeviceptr(va), bytes, 0, handles.front(), 0); }),
                "cuMemMap");
    m.whole_maps.emplace(va, bytes);
    if (!access) return;
    const CUresult r = m.log("cuMemSetAccess", [&] {
      return m.api.mem_set_access(CUdeviceptr(va), bytes, &m.access, 1);
    });
    if (r != CUDA_SUCCESS) {
      m.api.mem_unmap(CUdeviceptr(va), bytes);
      m.whole_maps.erase(va);
      throw BackendError(m.api.describe(r, "cuMemSetAccess(" + std::to_string(bytes) + " bytes)"));
    }
    return;
  }
  std::size_t done = 0;
  for (; done < bytes; done += g) {
    const CUresult r = m.log("cuMemMap", [&] {
      return m.api.mem_map(CUdeviceptr(va + done), g, 0, handles.at((offset + done) / g), 0);
    });
    if (r != CUDA_SUCCESS) {
      for (std::size_t u = 0; u < done; u += g) m.api.mem_unmap(CUdeviceptr(va + u), g);
      throw BackendError(m.api.describe(r, "cuMemMap(" + std::to_string(g) + " bytes)"));
    }
  }
  if (!access) return;
  const CUresult r = m.log(
      "cuMemSetAccess", [&] { return m.api.mem_set_access(CUdeviceptr(va), bytes, &m.access, 1); });
  if (r != CUDA_SUCCESS) {
    for (std::size_t u = 0; u < bytes; u += g) m.api.mem_unmap(CUdeviceptr(va + u), g);
    throw BackendError(m.api.describe(r, "cuMemSetAccess(" + std::to_string(bytes) + " bytes)"));
  }
}

void CudaVmmBackend::unmap(DevicePtr va, std::size_t bytes) {
  Impl& m = *impl_;
  // One cuMemUnmap may span several whole mappings (far cheaper than one call each:
  // docs/results.md), but must not cut one: check that no whole chunk's mapping sticks out, then
  // unmap the range at once.
  for (std::size_t done = 0; done < bytes;) {
    std::size_t len = m.granule;
    if (auto it = m.whole_maps.find(va + done); it != m.whole_maps.end()) {
      len = it->second;
      if (done + len > bytes)
        throw BackendError("cuarena: unmap of part of a whole chunk's mapping");
    }
    done += len;
  }
  cuda::check(m.log("cuMemUnmap", [&] { return m.api.mem_unmap(CUdeviceptr(va), bytes); }),
              "cuMemUnmap");
  for (auto it = m.whole_maps.lower_bound(va); it != m.whole_maps.end() && it->first < va + bytes;)
    it = m.whole_maps.erase(it);
}

std::vector<CudaBackend::ExportPiece> CudaVmmBackend::export_range(DevicePtr va,
                                                                   std::size_t bytes) {
  Impl& m = *impl_;
  if (!m.exportable) {
    throw BackendError("cuarena: device " + std::to_string(m.device) +
                       " cannot export memory as file descriptors, so it cannot be shared with "
                       "another process (CUDA IPC)");
  }
  DeviceGuard guard(m.device, m.context);
  std::vector<ExportPiece> out;
  for (std::size_t done = 0; done < bytes;) {
    const DevicePtr at = va + done;
    // The mapping holding `at`: a whole chunk's (possibly starting below va), or one granule.
    std::size_t map_base = at, map_bytes = m.granule;
    if (auto it = m.whole_maps.upper_bound(at); it != m.whole_maps.begin()) {
      --it;
      if (at < it->first + it->second) map_base = it->first, map_bytes = it->second;
    }
    // cuMemRetainAllocationHandle returns the handle cuMemCreate gave, with one more reference.
    CUmemGenericAllocationHandle h = 0;
    cuda::check(m.api.retain_handle(&h, reinterpret_cast<void*>(at)),
                "cuMemRetainAllocationHandle");
    m.api.mem_release(h);
    auto e = m.exported.find(h);
    if (e == m.exported.end()) {
      int fd = -1;
      cuda::check(m.api.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                  "cuMemExportToShareableHandle");
      e = m.exported.emplace(h, fd).first;
    }
    const std::size_t len = std::min(map_base + map_bytes - at, bytes - done);
    out.push_back({done, len, at - map_base, e->second});
    done += len;
  }
  return out;
}

EventId CudaVmmBackend::record_event(StreamId stream) { return impl_->events.record(stream); }
bool CudaVmmBackend::event_completed(EventId event) { return impl_->events.completed(event); }
void CudaVmmBackend::wait_event(EventId event) { impl_->events.wait(event); }
void CudaVmmBackend::release_event(EventId event) { impl_->events.release(event); }
bool CudaVmmBackend::stream_wait_event(StreamId stream, EventId event) {
  impl_->events.stream_wait(stream, event);
  return true;
}
bool CudaVmmBackend::stream_capturing(StreamId stream) { return impl_->events.capturing(stream); }

}  // namespace cuarena
