// DeviceBackend: the only door from the policy core to a device.
//
// The main model is CUDA's virtual memory management: the core reserves virtual address ranges,
// creates physical memory in chunks of whole granules, maps any granule-aligned part of a chunk
// at any granule-aligned virtual address (the same physical memory may be mapped at several
// addresses at once), unmaps, and releases chunks. It records and queries events to learn when
// a stream has finished with memory. A backend never makes policy decisions.
//
// Upstreams without virtual memory management (cudaMalloc, cudaMallocAsync) answer false to
// supports_mapping(): the core then never reserves, creates or maps, and takes memory only in
// whole segments (allocate_segment/free_segment) that it splits and caches, as PyTorch does.
//
// Implementations: SimBackend (CPU simulation, target `cuarena_sim`) and the CUDA backends
// (separate targets).
//
// Thread semantics: the core calls a backend with its own lock held, so one Allocator never
// calls its backend concurrently. A backend shared by several allocators must lock itself.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuarena/types.hpp"

namespace cuarena {

/// A backend's handle for a chunk of physical memory; 0 is never a valid handle.
using PhysHandle = std::uint64_t;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  /// Physical mapping granularity in bytes (a power of two; 2 MiB on an H200).
  virtual std::size_t granularity() const = 0;

  /// Bytes of physical memory this device can supply in total.
  virtual std::size_t capacity() const = 0;

  /// Reserves `bytes` (a multiple of granularity()) of virtual address space, aligned to the
  /// granularity, with nothing mapped. Throws BackendError when the address space is exhausted.
  virtual DevicePtr reserve_address(std::size_t bytes) = 0;

  /// Returns a range from reserve_address(); nothing in it may still be mapped.
  virtual void release_address(DevicePtr va, std::size_t bytes) = 0;

  /// Creates `bytes` (a granule multiple) of physical memory. Returns 0 when the device is out
  /// of memory; throws BackendError for any other failure.
  virtual PhysHandle create_physical(std::size_t bytes) = 0;

  /// Creates `bytes` (a granule multiple) of physical memory that the core will only ever map
  /// whole (offset 0, all bytes, at one address per mapping) and unmap whole, so a backend may
  /// back it with one allocation (one cuMemCreate handle). Same errors as create_physical().
  virtual PhysHandle create_whole_physical(std::size_t bytes) { return create_physical(bytes); }

  /// Releases a chunk from create_physical() or create_whole_physical(); no part of it may still
  /// be mapped.
  virtual void release_physical(PhysHandle chunk) = 0;

  /// Maps `bytes` of `chunk` starting `offset` bytes into it at [va, va+bytes), readable and
  /// writable by the device. All granule multiples; the virtual range must be reserved and
  /// unmapped. Throws BackendError on failure, with nothing mapped.
  virtual void map(DevicePtr va, std::size_t bytes, PhysHandle chunk, std::size_t offset) = 0;

  /// As map(), but the range is not yet accessible: the caller grants access with set_access()
  /// before handing it out, so one grant can cover several runs (cuMemSetAccess costs the same
  /// whatever the size: docs/results.md). The default maps with access (set_access is then a
  /// no-op).
  virtual void map_no_access(DevicePtr va, std::size_t bytes, PhysHandle chunk,
                             std::size_t offset) {
    map(va, bytes, chunk, offset);
  }

  /// Grants the device read/write access to [va, va+bytes) (granule multiples). Every granule in
  /// it is mapped, and every mapping that overlaps it lies wholly inside it; parts may already
  /// be accessible. Throws BackendError on failure (the runs stay mapped, without access).
  virtual void set_access(DevicePtr va, std::size_t bytes) {
    (void)va;
    (void)bytes;
  }

  /// Unmaps [va, va+bytes). The caller guarantees no pending device work uses the range through
  /// these addresses. The physical memory stays alive until released. The core unmaps any
  /// granule-aligned sub-range of what it mapped, so a backend over cuMemMap (whose cuMemUnmap
  /// cannot unmap part of one mapping) maps each granule with its own cuMemMap and may grant
  /// access to a whole run with one cuMemSetAccess.
  virtual void unmap(DevicePtr va, std::size_t bytes) = 0;

  /// Records an event on `stream` that completes when all work submitted to it so far has
  /// finished. Non-blocking.
  virtual EventId record_event(StreamId stream) = 0;

  /// True once the event has completed. Non-blocking.
  virtual bool event_completed(EventId event) = 0;

  /// Blocks the host until the event completes (used only on the out-of-memory path and by
  /// release_cached()).
  virtual void wait_event(EventId event) = 0;

  /// Returns the event to the backend; the id may be reused.
  virtual void release_event(EventId event) = 0;

  /// True when stream_wait_event() can order streams on the device. The default: false.
  virtual bool supports_stream_waits() const { return false; }

  /// Makes work submitted to `stream` from now on wait on the device until `event` (recorded on
  /// another stream) completes (cuStreamWaitEvent); the host does not block. Returns false when
  /// it cannot for this event (or at all: supports_stream_waits() false); the caller then waits
  /// for event_completed() instead. Throws BackendError on failure. The default: false.
  virtual bool stream_wait_event(StreamId stream, EventId event) {
    (void)stream;
    (void)event;
    return false;
  }

  /// True while `stream` is being captured into a CUDA graph (cuStreamIsCapturing). The core
  /// then records no event on it and makes it wait for none of its own accord: captured work runs
  /// only at replay, and an event recorded outside a capture cannot order work inside it.
  /// Non-blocking. Throws BackendError on failure. The default: false.
  virtual bool stream_capturing(StreamId stream) {
    (void)stream;
    return false;
  }

  // --- Segment upstreams (supports_mapping() == false) ---------------------------------------

  /// True for a mapping (VMM) backend: the calls above are used. False for a segment backend:
  /// only the calls below and the events are.
  virtual bool supports_mapping() const { return true; }

  /// Allocates a segment of `bytes` (a granule multiple) of device memory, usable on `stream`
  /// at once and on any stream once work already queued on `stream` has finished. Returns 0 when
  /// the device is out of memory; throws BackendError for any other failure. A mapping backend
  /// throws std::logic_error.
  virtual DevicePtr allocate_segment(std::size_t bytes, StreamId stream);

  /// Frees a segment from allocate_segment(). The caller guarantees no pending device work uses
  /// it. Throws BackendError on failure.
  virtual void free_segment(DevicePtr ptr, std::size_t bytes);

  /// Returns memory the upstream itself caches to the device (cudaMemPoolTrimTo for a memory
  /// pool); called after the core released what it cached. The default does nothing.
  virtual void trim() {}
};

}  // namespace cuarena
