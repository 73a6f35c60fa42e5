// PyTorch's CUDA caching allocator (libc10_cuda of the installed torch) for cuarena_gpu_bench,
// built only with -DCUARENA_WITH_TORCH=ON. torch_adapter.cpp is the one translation unit that
// includes torch's headers (compiled with torch's _GLIBCXX_USE_CXX11_ABI); this interface passes
// only built-in types, so nothing whose layout depends on that ABI crosses it.
//
// The calls are those of tools/replay/src/torch_replay.cpp: cca::init(device_count) once, then
// raw_alloc_with_stream / raw_delete. PYTORCH_CUDA_ALLOC_CONF, read by torch when the library
// loads, selects the mode; unset (or empty) is torch's native caching allocator.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuarena::bench::torch_native {

/// Calls cca::init(device count) the first time; later calls do nothing. false on failure
/// (message in last_error()).
bool init();

enum class AllocStatus { kOk, kOutOfMemory, kError };

/// cca::raw_alloc_with_stream(bytes, stream). kOutOfMemory for c10::OutOfMemoryError; kError
/// (message in last_error()) for any other exception.
AllocStatus allocate(std::size_t bytes, void* stream, void** out);

/// cca::raw_delete(ptr). false on failure (message in last_error()).
bool deallocate(void* ptr);

/// cca::emptyCache(): returns every cached, unused block to the device. false on failure.
bool empty_cache();

struct Stats {
  std::int64_t reserved_bytes = 0;     ///< reserved_bytes[aggregate].current
  std::int64_t num_device_alloc = 0;   ///< cudaMalloc calls so far
  std::int64_t num_device_free = 0;    ///< cudaFree calls so far
  std::int64_t num_alloc_retries = 0;  ///< allocations that had to free the cache and retry
};
/// cca::getDeviceStats(device). false on failure (message in last_error()).
bool stats(int device, Stats* out);

/// The calling thread's last failure message ("" if none).
const char* last_error();

}  // namespace cuarena::bench::torch_native
