// VmmTokens: the bookkeeping behind serving the driver's virtual memory calls (hooks_vmm.cpp).
//
// XLA's VMM allocator (2026), like NCCL's buffers, makes every buffer its own physical
// allocation, address range and mapping: cuMemCreate(size), cuMemAddressReserve(size),
// cuMemMap(range, handle), cuMemSetAccess; and unmaps, frees the range and releases the handle
// to free it. The shim serves the three as one cuarena block:
//   create(size)        a token stands for the handle; no memory yet. It becomes the calling
//                       thread's pending token.
//   reserve(size)       the thread's pending token of that size (within a granule) is bound to
//                       a cuarena block the caller allocated (bind()); the block is the range.
//   map(range, token)   the token's own block: nothing to map (kBound).
//   unmap, free the range, release the token: in any order; once the range is freed and every
//                       reference to the token released, the block goes back to cuarena.
// A pending token mapped into a served range whose own token is not mapped yet (two creates,
// then two reserves) takes that range's block; the other token is pending again. A token mapped
// anywhere else while pending (programs that reserve first and map handles into
// it, such as PyTorch's expandable segments) is materialized: the caller creates the real
// physical memory then (kMaterialize, set_real()), and the token stands for that handle from
// then on. A bound token mapped into another range would alias the block: refused (kAlias).
//
// Invariants (check()):
//   token t: exactly one of pending (block == 0 && real == 0), bound (block != 0), real
//            (real != 0); refs >= 1 while in tokens_
//   ranges_[b] == t  <=>  t bound to block b and the program has not freed the range
//   a bound token's block is freed (by the caller) exactly once: when its range is freed and
//            its last reference released, whichever comes last
// Thread-safe: one mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "cuarena/types.hpp"

namespace cuarena::shim {

class VmmTokens {
 public:
  using Handle = std::uint64_t;  // CUmemGenericAllocationHandle

  /// What the program asked of the memory beyond its size, reported back for the handle and
  /// given to the driver if the token is materialized.
  struct Traits {
    int handle_types = 0;  ///< CUmemAllocationHandleType bits (0: none)
    bool rdma = false;     ///< allocFlags.gpuDirectRDMACapable
    bool operator==(const Traits&) const = default;
  };

  struct Token {
    std::size_t size = 0;  ///< bytes the program created
    int device = -1;
    Traits traits;
    DevicePtr block = 0;  ///< bound: the cuarena block that is its range
    Handle real = 0;      ///< materialized: the driver's handle
    int refs = 1;         ///< create and retains, less releases
    bool mapped = false;  ///< bound: the program's map has not been undone by an unmap
  };

  /// A new pending token for `size` bytes on `device`, the calling thread's pending one.
  Handle create(std::size_t size, int device, Traits traits);
  Handle create(std::size_t size, int device) { return create(size, device, Traits()); }
  /// The calling thread's pending token if a reservation of `size` bytes fits it: its size
  /// minus less than `granularity` up to its size. Not taken: bind() takes it.
  std::optional<Handle> pending_for(std::size_t size, std::size_t granularity) const;
  /// Binds pending token `h` to `block` (`h`'s size bytes, allocated by the caller).
  void bind(Handle h, DevicePtr block);
  /// Materializes pending token `h` as the driver's handle `real`.
  void set_real(Handle h, Handle real);

  bool is_token(Handle h) const;
  std::optional<Token> get(Handle h) const;

  enum class Map { kBound, kMaterialize, kAlias, kReal };
  /// What a map of [va, va + size) at `offset` to token `h` means (h must be a token).
  Map map(DevicePtr va, std::size_t size, std::size_t offset, Handle h);

  /// The bound token whose block starts at `va` and spans `size` bytes (its own size, or the
  /// reservation's within a granule), if the program holds that range.
  std::optional<Token> range(DevicePtr va) const;
  /// Unmaps a served range; false if [va, ...) is not one.
  bool unmap(DevicePtr va);

  /// What a release or a range free leaves the caller to do.
  struct Freed {
    bool ours = false;    ///< the handle or range was the shim's
    DevicePtr block = 0;  ///< non-zero: free this cuarena block now
    Handle real = 0;      ///< non-zero: release this driver handle now
  };
  /// The program frees the range starting at `va`.
  Freed free_range(DevicePtr va);
  /// One reference to token `h` released.
  Freed release(Handle h);
  /// One more reference to the token bound to the range at `va` (cuMemRetainAllocationHandle).
  std::optional<Handle> retain(DevicePtr va);

  std::size_t tokens() const;
  /// Asserts the invariants above (CUARENA_ASSERT); for tests.
  void check() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<Handle, Token> tokens_;
  std::map<DevicePtr, Handle> ranges_;  // bound blocks the program holds as ranges
  Handle next_ = 0;
};

}  // namespace cuarena::shim
