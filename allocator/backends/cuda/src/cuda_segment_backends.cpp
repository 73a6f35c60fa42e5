#include "cuarena/cuda_segment_backends.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "context.hpp"
#include "cuarena/errors.hpp"
#include "events.hpp"
#include "runtime_check.hpp"

namespace cuarena {

using cuda::check_rt;
using cuda::DeviceGuard;

struct CudaSegmentBackend::Impl {
  explicit Impl(int d) : device(d), events(d, log) {}
  int device;
  std::size_t capacity = 0;
  cuda::CallLog log;  // before events, which time into it
  cuda::EventPool events;
  cudaMemPool_t pool = nullptr;  // CudaAsyncBackend only
};

namespace {
[[noreturn]] void no_mapping(const char* call) {
  throw std::logic_error(std::string("cuarena: ") + call +
                         " called on a segment backend (upstream malloc/async cannot map)");
}

// Out of memory is an answer, not an error: clear it so it does not stick to the next call.
bool out_of_memory(cudaError_t err) {
  if (err != cudaErrorMemoryAllocation) return false;
  cudaGetLastError();
  return true;
}
}  // namespace

CudaSegmentBackend::CudaSegmentBackend(int device, std::size_t capacity)
    : impl_(std::make_unique<Impl>(device)) {
  DeviceGuard guard(device);  // initialises the driver and the primary context
  std::size_t free_bytes = 0, total_bytes = 0;
  cuda::mem_info(device, free_bytes, total_bytes);
  impl_->capacity = capacity ? capacity : total_bytes;
}

CudaSegmentBackend::~CudaSegmentBackend() = default;

std::size_t CudaSegmentBackend::capacity() const { return impl_->capacity; }
int CudaSegmentBackend::device() const { return impl_->device; }
std::size_t CudaSegmentBackend::driver_calls() const { return impl_->log.calls(); }
std::map<std::string, double> CudaSegmentBackend::driver_us() const { return impl_->log.us(); }

EventId CudaSegmentBackend::record_event(StreamId stream) { return impl_->events.record(stream); }
bool CudaSegmentBackend::event_completed(EventId event) { return impl_->events.completed(event); }
void CudaSegmentBackend::wait_event(EventId event) { impl_->events.wait(event); }
void CudaSegmentBackend::release_event(EventId event) { impl_->events.release(event); }
bool CudaSegmentBackend::stream_wait_event(StreamId stream, EventId event) {
  impl_->events.stream_wait(stream, event);
  return true;
}
bool CudaSegmentBackend::stream_capturing(StreamId stream) {
  return impl_->events.capturing(stream);
}

DevicePtr CudaSegmentBackend::reserve_address(std::size_t) { no_mapping("reserve_address"); }
void CudaSegmentBackend::release_address(DevicePtr, std::size_t) { no_mapping("release_address"); }
PhysHandle CudaSegmentBackend::create_physical(std::size_t) { no_mapping("create_physical"); }
void CudaSegmentBackend::release_physical(PhysHandle) { no_mapping("release_physical"); }
void CudaSegmentBackend::map(DevicePtr, std::size_t, PhysHandle, std::size_t) { no_mapping("map"); }
void CudaSegmentBackend::unmap(DevicePtr, std::size_t) { no_mapping("unmap"); }

// --- cudaMalloc ---------------------------------------------------------------------------------

CudaMallocBackend::CudaMallocBackend(int device, std::size_t capacity)
    : CudaSegmentBackend(device, capacity) {}

DevicePtr CudaMallocBackend::allocate_segment(std::size_t bytes, StreamId) {
  DeviceGuard guard(impl_->device);
  void* p = nullptr;
  const cudaError_t err = impl_->log("cudaMalloc", [&] { return cudaMalloc(&p, bytes); });
  if (out_of_memory(err)) return 0;
  check_rt(err, ("cudaMalloc(" + std::to_string(bytes) + " bytes)").c_str());
  return reinterpret_cast<DevicePtr>(p);
}

void CudaMallocBackend::free_segment(DevicePtr ptr, std::size_t) {
  DeviceGuard guard(impl_->device);
  check_rt(impl_->log("cudaFree", [&] { return cudaFree(reinterpret_cast<void*>(ptr)); }),
           "cudaFree");
}

// --- cudaMallocAsync ----------------------------------------------------------------------------

CudaAsyncBackend::CudaAsyncBackend(int device, std::size_t capacity)
    : CudaSegmentBackend(device, capacity) {
  DeviceGuard guard(device);
  int supported = 0;
  check_rt(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device),
           "cudaDeviceGetAttribute(MemoryPoolsSupported)");
  if (!supported) {
    throw BackendError("cuarena: device " + std::to_string(device) +
                       " does not support memory pools (cudaMallocAsync); use upstream:malloc");
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  check_rt(cudaMemPoolCreate(&impl_->pool, &props), "cudaMemPoolCreate");
  // Keep freed memory in the pool across synchronizations; trim() is the only release.
  std::uint64_t threshold = UINT64_MAX;
  check_rt(cudaMemPoolSetAttribute(impl_->pool, cudaMemPoolAttrReleaseThreshold, &threshold),
           "cudaMemPoolSetAttribute(ReleaseThreshold)");
}

CudaAsyncBackend::~CudaAsyncBackend() {
  // The allocator (destroyed first) freed every segment; wait for those frees, then drop the pool.
  DeviceGuard guard(impl_->device);
  cudaStreamSynchronize(nullptr);
  cudaMemPoolDestroy(impl_->pool);
}

DevicePtr CudaAsyncBackend::allocate_segment(std::size_t bytes, StreamId stream) {
  DeviceGuard guard(impl_->device);
  void* p = nullptr;
  const cudaError_t err = impl_->log("cudaMallocFromPoolAsync", [&] {
    return cudaMallocFromPoolAsync(&p, bytes, impl_->pool, reinterpret_cast<cudaStream_t>(stream));
  });
  if (out_of_memory(err)) return 0;
  check_rt(err, ("cudaMallocFromPoolAsync(" + std::to_string(bytes) + " bytes)").c_str());
  return reinterpret_cast<DevicePtr>(p);
}

void CudaAsyncBackend::free_segment(DevicePtr ptr, std::size_t) {
  DeviceGuard guard(impl_->device);
  // Every use has completed (the core saw their events), so no stream needs to order the free.
  check_rt(impl_->log("cudaFreeAsync",
                      [&] { return cudaFreeAsync(reinterpret_cast<void*>(ptr), nullptr); }),
           "cudaFreeAsync");
}

void CudaAsyncBackend::trim() {
  DeviceGuard guard(impl_->device);
  // The frees just queued must have run before the pool can give their memory back.
  check_rt(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
  check_rt(impl_->log("cudaMemPoolTrimTo", [&] { return cudaMemPoolTrimTo(impl_->pool, 0); }),
           "cudaMemPoolTrimTo");
}

}  // namespace cuarena
