// The operations the driver and runtime hooks share. Each returns the CUresult of a call the
// shim served, or nullopt when the call is not the shim's to serve and goes to the real function
// (a pointer cuarena did not allocate, an allocation on a capturing stream, a context cuarena
// cannot serve). They never throw.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <optional>

namespace cuarena::shim {

/// How a call names its stream: synchronous (no stream), stream-ordered with legacy default-stream
/// semantics (stream 0 is the legacy stream), or the `_ptsz` variants (stream 0 is the calling
/// thread's per-thread default stream).
enum class Ordering { kSync, kAsync, kAsyncPerThread };

/// `alignment`: a power of two the block's address is a multiple of (cuMemAddressReserve's).
std::optional<CUresult> serve_alloc(CUdeviceptr* ptr, std::size_t bytes, CUstream stream,
                                    Ordering ordering, std::size_t alignment = 512);
std::optional<CUresult> serve_free(CUdeviceptr ptr, CUstream stream, Ordering ordering);
std::optional<CUresult> serve_mem_info(std::size_t* free_bytes, std::size_t* total_bytes);

/// The shim's hook for the driver entry point `fn` the driver returned for `symbol`, or `fn`
/// itself when the shim serves no such entry point (logged with CUARENA_LOG for memory calls).
void* substitute(const char* symbol, void* fn);

}  // namespace cuarena::shim
