// Placement: which free block serves a request, and which shared neighbours a free block takes
// in. One implementation per `placement` config value (placement.cpp):
//   * unified (the default, and always when memory-first): an owned block absorbs the shared
//     neighbours its stream used last, so its free space stays in one piece whenever its sweeps
//     complete, and placement is one best fit over the stream's own and the shared blocks. Owned
//     blocks may then lack granules, are addressed, stamped, and defragmented once finished
//     (FreeIndex::unified(), Arena::FreeStamp). Less memory, steadier across device lags.
//   * own_first: owned blocks stay fully mapped and are tried first, for fewer instructions.
// The pool holds one of each and uses the one its mode says (it turns unified when it turns
// memory-first); neither knows the other's mode.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "cuarena/config.hpp"
#include "large/free_index.hpp"

namespace cuarena::detail {

class BlockPlacement {
 public:
  /// Granules of [b->addr, b->addr+size) neither mapped nor coming back with no driver call,
  /// counted up to `limit`; `unmapped`, when given, gets the granules not active there
  /// (BlockPool::missing_granules).
  using MissingGranules = std::function<std::size_t(const Block* b, std::size_t size,
                                                    std::size_t limit, std::size_t* unmapped)>;
  /// The placement for `kind`, over `index`'s blocks. Both outlive it.
  static std::unique_ptr<BlockPlacement> make(cuarena::Placement kind, const FreeIndex& index,
                                              MissingGranules missing);
  virtual ~BlockPlacement() = default;

  /// The free block to serve `size` bytes from, among `sp`'s own and the shared ones, or
  /// nullptr. Sets `mapped` when the block's first `size` bytes need nothing backed (every
  /// granule active). O(log n + candidates x granules).
  virtual Block* place(const StreamFreeLists& sp, std::size_t size, bool& mapped) const = 0;
  /// Coalescing owned free block `owned` takes in its free shared neighbour `n`.
  virtual bool absorbs(const Block& owned, const Block& n) const = 0;
};

}  // namespace cuarena::detail
