#include "serve.hpp"

#include <algorithm>

#include "cuarena/errors.hpp"
#include "real_driver.hpp"
#include "shim.hpp"

namespace cuarena::shim {

namespace {
/// Without a driver (libcuda.so.1 absent) every call is the runtime's or driver's to answer.
bool have_driver() { return RealDriver::get().ctx_get_current != nullptr; }

/// Whether `stream` (as the call names it) captures a graph. Any answer but "no" counts as yes:
/// serving then could hand a graph memory it does not own.
bool capturing(CUstream stream, Ordering ordering) {
  if (stream == nullptr && ordering == Ordering::kAsyncPerThread) stream = CU_STREAM_PER_THREAD;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const RealDriver& d = RealDriver::get();
  return d.stream_is_capturing(stream, &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/// The stream a free is ordered on, as cuarena's events see it: the legacy stream is 0, and a
/// per-thread default stream its explicit handle (an event recorded on it at free time, by the
/// freeing thread, is on that thread's stream).
StreamId free_stream(CUstream stream, Ordering ordering) {
  if (stream == CU_STREAM_PER_THREAD ||
      (stream == nullptr && ordering == Ordering::kAsyncPerThread))
    return reinterpret_cast<StreamId>(CU_STREAM_PER_THREAD);
  if (stream == CU_STREAM_LEGACY) return 0;
  return reinterpret_cast<StreamId>(stream);
}

/// The stream an allocation is ordered on. Per-thread default streams synchronise with the
/// legacy stream, so their allocations live there (two threads' per-thread streams do not
/// synchronise with each other, so a block must never pass between them without an event).
StreamId alloc_stream(CUstream stream, Ordering ordering) {
  if (ordering == Ordering::kSync) return 0;
  const StreamId s = free_stream(stream, ordering);
  return s == reinterpret_cast<StreamId>(CU_STREAM_PER_THREAD) ? 0 : s;
}
}  // namespace

std::optional<CUresult> serve_alloc(CUdeviceptr* ptr, std::size_t bytes, CUstream stream,
                                    Ordering ordering, std::size_t alignment) {
  SpentTimer timer(Shim::Part::kAlloc);
  Shim& shim = Shim::get();
  if (ptr == nullptr || bytes == 0 || !have_driver())
    return std::nullopt;  // the driver's own answer
  if (ordering != Ordering::kSync && capturing(stream, ordering)) {
    shim.log("alloc of %zu B on capturing stream %p passed to the driver", bytes,
             static_cast<void*>(stream));
    return std::nullopt;
  }
  bool no_context = false;
  DeviceState* s = shim.current(&no_context);
  if (no_context) return CUDA_ERROR_INVALID_CONTEXT;
  if (s == nullptr) return std::nullopt;
  if (ordering == Ordering::kSync && s->any_capturing()) {
    shim.log("alloc of %zu B during a graph capture passed to the driver", bytes);
    return std::nullopt;
  }
  const StreamId sid = alloc_stream(stream, ordering);
  try {
    if (sid != 0) s->add_stream(stream, true);
    void* p = s->allocate(bytes, sid, std::max(alignment, kMinBlockSize));
    *ptr = reinterpret_cast<CUdeviceptr>(p);
    shim.served();
    if (TraceRecorder* t = shim.trace())
      t->record(cuat::Action::kAlloc, s->device(), sid, DevicePtr(p), bytes);
    if (shim.logging())
      shim.log("alloc %p %zu B stream %#llx device %d", p, bytes,
               static_cast<unsigned long long>(sid), s->device());
    return CUDA_SUCCESS;
  } catch (const OutOfMemoryError& e) {
    shim.served();
    if (TraceRecorder* t = shim.trace()) t->record(cuat::Action::kOom, s->device(), sid, 0, bytes);
    shim.log("out of memory: %s", e.what());
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    shim.log("alloc of %zu B failed: %s", bytes, e.what());
    return CUDA_ERROR_UNKNOWN;
  }
}

std::optional<CUresult> serve_free(CUdeviceptr ptr, CUstream stream, Ordering ordering) {
  SpentTimer timer(Shim::Part::kFree);
  Shim& shim = Shim::get();
  if (ptr == 0 || !have_driver()) return std::nullopt;
  Allocator::BlockInfo block{};
  DeviceState* s = shim.owner(DevicePtr(ptr), block);
  if (s == nullptr) {
    if (shim.holder(DevicePtr(ptr)) == nullptr) return std::nullopt;  // not cuarena's
    shim.log("free of %#llx: not a live allocation (freed twice, or not its start)",
             static_cast<unsigned long long>(ptr));
    return CUDA_ERROR_INVALID_VALUE;
  }
  try {
    if (ordering == Ordering::kSync) {
      // During a capture the fence is not recorded (StreamRegistry::record_fence): the block
      // waits until a fence after the capture, as close as a pool can come to CUDA's free.
      if (!s->free_sync(DevicePtr(ptr), block)) return CUDA_ERROR_INVALID_VALUE;
      if (TraceRecorder* t = shim.trace())
        t->record(cuat::Action::kFreeRequested, s->device(), block.stream, DevicePtr(ptr),
                  block.requested);
    } else {
      if (capturing(stream, ordering))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // not graph memory
      s->free_async(DevicePtr(ptr), block, free_stream(stream, ordering));
    }
    shim.served();
    if (shim.logging())
      shim.log("free %#llx %zu B device %d", static_cast<unsigned long long>(ptr), block.requested,
               s->device());
    return CUDA_SUCCESS;
  } catch (const std::exception& e) {
    shim.log("free of %#llx failed: %s", static_cast<unsigned long long>(ptr), e.what());
    return CUDA_ERROR_INVALID_VALUE;
  }
}

std::optional<CUresult> serve_mem_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  Shim& shim = Shim::get();
  DeviceState* s = have_driver() ? shim.current() : nullptr;
  if (s == nullptr) return std::nullopt;
  try {
    std::size_t f = 0, t = 0;
    s->mem_info(f, t);
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    shim.served();
    return CUDA_SUCCESS;
  } catch (const std::exception& e) {
    shim.log("memory info: %s", e.what());
    return std::nullopt;
  }
}

}  // namespace cuarena::shim
