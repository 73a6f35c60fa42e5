// DeviceBackend: the only door from the policy core to a device.
//
// The core reserves virtual address ranges, maps and unmaps physical memory inside them in whole
// granules, and records/queries events to learn when a stream has finished with a block. A
// backend never makes policy decisions. Implementations: SimBackend (CPU simulation, this
// repository's `cuarena_sim` target) and the CUDA backends (separate targets).
//
// Thread semantics: the core calls a backend with its own lock held, so a backend is never
// called concurrently by one Allocator. Backends shared between allocators must lock themselves.
#pragma once

#include <cstddef>

#include "cuarena/types.hpp"

namespace cuarena {

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

  /// Creates physical memory for [va, va+bytes) and maps it there, readable and writable by the
  /// device. `va` and `bytes` are granule multiples inside a reserved range, none of it mapped.
  /// Returns false, with nothing mapped, when the device is out of physical memory; throws
  /// BackendError for any other failure.
  virtual bool map(DevicePtr va, std::size_t bytes) = 0;

  /// Unmaps [va, va+bytes) and releases its physical memory. The caller guarantees no pending
  /// device work touches the range. Does not block on other streams.
  virtual void unmap(DevicePtr va, std::size_t bytes) = 0;

  /// Records an event on `stream` that completes when all work submitted to it so far has
  /// finished. Non-blocking.
  virtual EventId record_event(StreamId stream) = 0;

  /// True once the event has completed. Non-blocking.
  virtual bool event_completed(EventId event) = 0;

  /// Blocks the host until the event completes (used only on the out-of-memory path).
  virtual void wait_event(EventId event) = 0;

  /// Returns the event to the backend; the id may be reused.
  virtual void release_event(EventId event) = 0;
};

}  // namespace cuarena
