// PhysicalPool: the physical memory cuarena holds (reserved_bytes), in chunks of granules.
//
// A chunk is created for a shortfall of n granules in one backend call. Each of its granules is
// mapped at zero or more virtual granules (more than one while an alias made for same-stream
// reuse waits for its old address to be unmapped). Granules mapped nowhere are idle: they sit
// in the idle list and back the next request before any new chunk is created. A chunk whose
// granules are all idle can be released to the device.
//
// A *whole* chunk (several granules, one backend allocation) is mapped only as a whole, at
// consecutive virtual granules in order, and unmapped as a whole: it backs a large request where
// it was created and is never stolen or aliased. It is released when it is mapped nowhere.
//
// Invariants kept here: for every granule, maps == number of virtual granules mapping it; a
// granule of a chunk that is not whole is in `idle_` iff maps == 0; chunk.idle == its granules
// with maps == 0; each mapping of a whole chunk covers all its granules, in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "arena.hpp"
#include "context.hpp"

namespace cuarena::detail {

class PhysicalPool {
 public:
  explicit PhysicalPool(Context& ctx) : ctx_(ctx) {}
  ~PhysicalPool();  // releases every chunk; callers unmap first
  PhysicalPool(const PhysicalPool&) = delete;
  PhysicalPool& operator=(const PhysicalPool&) = delete;

  std::size_t idle_granules() const { return idle_.size(); }
  /// Takes an idle granule (the caller maps it at once), or gives one back unused.
  PhysRef take_idle();
  void put_idle(PhysRef p);
  /// Creates a chunk of `granules` and marks them all taken. Returns the first granule, or an
  /// invalid ref when the limit or the device refuses. `whole`: see above.
  PhysRef create(std::size_t granules, bool whole = false);
  /// Releases a chunk that is mapped nowhere and has no granule in the idle list (one create()
  /// just made that a later step could not use, or one leaving via release_idle_chunks()).
  void discard(std::uint32_t chunk);
  /// Releases a whole chunk that is mapped nowhere (stolen: its bytes are created anew in the
  /// shape the next request needs, which costs a few calls rather than one per granule).
  void release_if_idle(std::uint32_t chunk);
  bool whole(std::uint32_t chunk) const { return chunks_.at(chunk).whole; }
  std::size_t granules(std::uint32_t chunk) const { return chunks_.at(chunk).maps.size(); }

  /// Bookkeeping for one virtual mapping of `p` made or removed. An unmapped granule with no
  /// other mapping becomes idle.
  void mapped(PhysRef p);
  void unmapped(PhysRef p);
  PhysHandle handle(std::uint32_t chunk) const { return chunks_.at(chunk).handle; }

  /// Releases every chunk whose granules are all idle. Returns bytes released.
  std::size_t release_idle_chunks();

  /// Checks the invariants against the mapped arenas' mappings, and that the chunks hold
  /// `expected_bytes`; throws std::logic_error.
  void check_invariants(const std::vector<const Arena*>& arenas, std::size_t expected_bytes) const;

 private:
  struct Chunk {
    PhysHandle handle = 0;
    std::vector<std::uint32_t> maps;  // per granule
    std::size_t idle = 0;
    bool whole = false;
  };
  Context& ctx_;
  std::unordered_map<std::uint32_t, Chunk> chunks_;
  std::vector<PhysRef> idle_;
  std::uint32_t next_chunk_ = 1;
};

}  // namespace cuarena::detail
