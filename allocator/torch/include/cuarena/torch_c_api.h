/* The C entry points of libcuarena_torch.so (the PyTorch drop-in).
 *
 * Two ways in:
 *  1. cuarena_torch_install(): installs cuarena as PyTorch's CUDA allocator (a full
 *     c10::cuda::CUDACachingAllocator::CUDAAllocator, so statistics, snapshots, CUDA graphs and
 *     torch.compile keep working). The Python package `cuarena` calls it through ctypes.
 *  2. The pluggable ABI (cuarena_malloc / cuarena_free and the optional hooks), for
 *     torch.cuda.memory.CUDAPluggableAllocator(path, "cuarena_malloc", "cuarena_free"). That mode
 *     loses what PyTorch's pluggable wrapper does not forward (statistics, snapshots).
 *
 * Thread semantics: every function may be called from any thread. Errors: functions returning
 * int return 0 on success and non-zero on failure, with a one-line message written to `err`
 * (NUL-terminated, truncated to `errlen` bytes) when `err` is not NULL.
 */
#ifndef CUARENA_TORCH_C_API_H
#define CUARENA_TORCH_C_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* cuarena_stream_t; /* a cudaStream_t */

/* Installs cuarena as the current CUDA allocator, in both of c10's registries. `config` is a
 * cuarena configuration string (`key:value,...`; NULL or "" for the defaults). Fails when CUDA
 * is already initialised (the allocator in place has served memory), when `config` is bad, or
 * when cuarena is installed already with a different configuration (the same one is a no-op). */
int cuarena_torch_install(const char* config, char* err, size_t errlen);

/* 1 when cuarena is PyTorch's current CUDA allocator, else 0. */
int cuarena_torch_is_installed(void);

/* The torch version this library was built against ("2.11.0+cu130"); the loader refuses a
 * torch of another minor version before calling anything else. */
const char* cuarena_torch_built_for(void);

/* Parses `config` without installing anything: 0 when valid. */
int cuarena_config_check(const char* config, char* err, size_t errlen);

/* cuarena's configuration keys, comma-separated (static storage). */
const char* cuarena_config_keys(void);

/* Bytes a new allocation on `device` could get now: the device's free memory plus what cuarena
 * caches and could release or reuse, less cache pinned by frees still waiting on events, and
 * within per_process_memory_fraction. -1 on error (message in err). Does not initialise CUDA
 * on a device cuarena has not used yet beyond cudaMemGetInfo. */
int64_t cuarena_memory_available(int device, char* err, size_t errlen);

/* cuarena's own statistics of `device`'s allocator (Stats::to_map: PyTorch's keys and the
 * `cuarena.*` ones: driver calls, granules moved, memory_first, loop_plans, ...), as lines
 * "key value\n" (decimal int64), NUL-terminated, written to `buf` when `buflen` holds them all.
 * Returns the length of the text (without the NUL) whether or not it fit, so a caller can
 * retry with a larger buffer; -1 on error (message in err). */
int64_t cuarena_stats(int device, char* buf, size_t buflen, char* err, size_t errlen);

/* --- The pluggable ABI (torch.cuda.memory.CUDAPluggableAllocator) ------------------------- */

/* `size` bytes on `device`, stream-ordered on `stream`. On out of memory, after cuarena's full
 * reclaim path, returns NULL and logs one line to stderr saying why. */
void* cuarena_malloc(ssize_t size, int device, cuarena_stream_t stream);
/* Frees a pointer from cuarena_malloc (on the device that allocated it, whatever `device`). */
void cuarena_free(void* ptr, ssize_t size, int device, cuarena_stream_t stream);
/* Optional hooks (CUDAPluggableAllocator::set_*_fn). */
void cuarena_init(int device_count);
void cuarena_reset(void); /* releases cached memory (emptyCache) */
void cuarena_set_memory_fraction(double fraction, int device);
void* cuarena_base_alloc(void* ptr, size_t* size);
void cuarena_record_stream(void* ptr, cuarena_stream_t stream);
/* Pool hooks: the pool ids are c10's MempoolId_t pair. begin_allocate_to_pool's C++ form (it
 * takes a std::function filter) is cuarena::pluggable::begin_allocate_to_pool in
 * cuarena/torch_allocator.hpp. */
void cuarena_end_allocate_to_pool(int device, unsigned long long id_first,
                                  unsigned long long id_second);
void cuarena_release_pool(int device, unsigned long long id_first, unsigned long long id_second);

#ifdef __cplusplus
}
#endif

#endif /* CUARENA_TORCH_C_API_H */
