#include "large/placement.hpp"

#include "tuning.hpp"

namespace cuarena::detail {

namespace {

/// The few smallest fits, by size over the stream's own blocks and the shared ones merged (its
/// own first on equal sizes), as one index would give them: the first that needs no driver call
/// wins, else the one missing fewest granules. A loop that found its mappings in place finds them
/// there again, and whether a block is still owned or already shared changes nothing.
Block* best_fit(const SizeIndex& own_index, const SizeIndex& shared_index, std::size_t size,
                const BlockPlacement::MissingGranules& missing_granules, bool& mapped) {
  const int candidates = tuning::kBackedFitCandidates;
  auto own = own_index.lower_bound(size);
  auto shared = shared_index.lower_bound(size);
  Block* best = nullptr;
  std::size_t best_missing = SIZE_MAX;
  mapped = false;
  for (int seen = 0; seen < candidates; ++seen) {
    const bool own_left = own != own_index.end(), shared_left = shared != shared_index.end();
    if (!own_left && !shared_left) break;
    Block* c = nullptr;
    // Equal sizes: the stream's own block first (it needs no event to be reused).
    if (own_left && (!shared_left || (*own)->size <= (*shared)->size))
      c = *own++;
    else
      c = *shared++;
    std::size_t unmapped = 0;
    const std::size_t missing = missing_granules(c, size, best_missing, &unmapped);
    if (missing < best_missing) {  // the scan ran to the end: unmapped is exact
      best = c;
      best_missing = missing;
      mapped = unmapped == 0;
      if (missing == 0) break;
    }
  }
  return best;
}

class UnifiedPlacement final : public BlockPlacement {
 public:
  UnifiedPlacement(const FreeIndex& index, MissingGranules missing)
      : index_(index), missing_(std::move(missing)) {}
  Block* place(const StreamFreeLists& sp, std::size_t size, bool& mapped) const override {
    return best_fit(sp.free, index_.shared(), size, missing_, mapped);
  }
  bool absorbs(const Block& owned, const Block& n) const override {
    // Any stream may use shared memory, so absorbing it is safe (the merged block stays owned,
    // and becomes shared again at its stream's next sweep). Only neighbours this stream used
    // last: its free space then stays in one piece whenever its sweeps complete (the free
    // ranges best fit sees do not depend on the device's progress), while space it never used
    // stays open to other streams.
    return n.used && n.stream == owned.stream;
  }

 private:
  const FreeIndex& index_;
  MissingGranules missing_;
};

class OwnFirstPlacement final : public BlockPlacement {
 public:
  OwnFirstPlacement(const FreeIndex& index, MissingGranules missing)
      : index_(index), missing_(std::move(missing)) {}
  /// The stream's own best fit, unless a tighter shared block needs no new memory; on a miss,
  /// the shared fit missing fewest granules among the few smallest.
  Block* place(const StreamFreeLists& sp, std::size_t size, bool& mapped) const override {
    auto own = sp.free.lower_bound(size);
    Block* b = own == sp.free.end() ? nullptr : *own;
    mapped = b != nullptr && !b->lazy;  // owned blocks are fully mapped here
    if (b != nullptr && b->size > size) {
      // A tighter shared block that needs no new memory beats a looser owned one, as one best
      // fit over both would choose (PyTorch's single best fit): splitting a looser block than
      // needed costs memory (docs/results.md).
      auto it = index_.shared().lower_bound(size);
      if (it != index_.shared().end() && (*it)->size < b->size &&
          missing_(*it, size, 1, nullptr) == 0) {
        b = *it;
        mapped = false;
      }
    }
    if (b != nullptr) return b;
    // No own block fits, so best fit sees only the shared ones: among the few smallest, the one
    // missing fewest granules (best fit by size alone would often pick a block whose granules
    // were taken by defragmentation over a slightly larger one still backed, and defragmenting
    // for it moves memory every iteration).
    return best_fit(sp.free, index_.shared(), size, missing_, mapped);
  }
  /// Owned blocks stay fully mapped: they take in no shared (possibly unmapped) memory.
  bool absorbs(const Block&, const Block&) const override { return false; }

 private:
  const FreeIndex& index_;
  MissingGranules missing_;
};

}  // namespace

std::unique_ptr<BlockPlacement> BlockPlacement::make(cuarena::Placement kind,
                                                     const FreeIndex& index,
                                                     MissingGranules missing) {
  if (kind == cuarena::Placement::kUnified)
    return std::make_unique<UnifiedPlacement>(index, std::move(missing));
  return std::make_unique<OwnFirstPlacement>(index, std::move(missing));
}

}  // namespace cuarena::detail
