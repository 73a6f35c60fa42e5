// PhysicalMemory: the physical memory cuarena holds (reserved_bytes), in chunks of granules.
//
// A chunk is created for a shortfall of n granules in one backend call. Each of its granules is
// actively mapped at zero or more virtual granules (more than one while an alias made for
// same-stream reuse waits for its old address to be unmapped). Granules actively mapped nowhere
// are idle: they sit in the idle list and back the next request before any new chunk is
// created. A granule may also keep dormant mappings, oldest first: addresses it backed before
// it moved, which can take it back with no driver call while it is idle. A chunk whose
// granules are all idle and have no dormant mapping can be released to the device.
//
// A *whole* chunk (several granules, one backend allocation) is mapped, made dormant, taken back
// and unmapped only as a whole, at consecutive virtual granules in order. It moves as one piece:
// when no mapping of it is active it is idle (in `idle_whole_`, by size), and may back a run of
// at least its size in another request; it is never aliased.
//
// Invariants kept here: for every granule, `active` lists exactly the virtual granules mapping it
// actively and `dormant` those mapping it dormant, at most config dormant_maps of them; a
// granule of a chunk that is not whole is in `idle_` (at idle_pos) iff no active mapping and it
// is not taken; a whole chunk is in `idle_whole_` iff no granule of it is active and it is not
// taken, and idle_whole_granules_ sums their sizes; chunk.idle == its granules with no active
// mapping and not taken; each mapping of a whole chunk, active or dormant, covers all its
// granules, in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "front/context.hpp"
#include "physical/arena.hpp"

namespace cuarena::detail {

class PhysicalMemory {
 public:
  explicit PhysicalMemory(Context& ctx) : ctx_(ctx) {}
  ~PhysicalMemory();  // releases every chunk; callers unmap first
  PhysicalMemory(const PhysicalMemory&) = delete;
  PhysicalMemory& operator=(const PhysicalMemory&) = delete;

  /// A virtual granule that maps a physical one.
  struct Mapping {
    const Arena* arena = nullptr;
    std::size_t granule = 0;
    bool operator==(const Mapping&) const = default;
  };

  std::size_t idle_granules() const { return idle_.size(); }
  bool is_idle(PhysRef p) const {
    const Chunk& c = chunks_.at(p.chunk);
    return c.idle_pos[p.offset] != kNotIdle;
  }
  /// Takes an idle granule (the caller maps it at once), or gives one back unused.
  PhysRef take_idle();
  /// Takes the idle granule `p` in particular. O(1).
  void take(PhysRef p);
  void put_idle(PhysRef p);
  /// Creates a chunk of `granules` and marks them all taken. Returns the first granule, or an
  /// invalid ref when the limit or the device refuses. `whole`: see above.
  PhysRef create(std::size_t granules, bool whole = false);
  /// Releases a chunk that is mapped nowhere and has no granule in the idle list (one create()
  /// just made that a later step could not use, or one leaving via release_idle_chunks()).
  void discard(std::uint32_t chunk);
  /// Idle whole chunks: taken as a whole (the caller maps it at once), or made idle when the
  /// caller chose not to use a chunk it took.
  void take_whole(std::uint32_t chunk);
  void put_idle_whole(std::uint32_t chunk);
  /// The largest idle whole chunk of at most `max_granules` granules, or 0.
  std::uint32_t largest_idle_whole(std::size_t max_granules) const;
  bool idle_whole_empty() const { return idle_whole_.empty(); }
  bool is_idle_whole(std::uint32_t chunk) const {
    const Chunk& c = chunks_.at(chunk);
    return c.whole && idle_whole_.count({c.granules, chunk}) == 1;
  }
  std::size_t idle_whole_granules() const { return idle_whole_granules_; }
  /// Idle whole chunks by size, smallest first: (granules, chunk).
  const std::set<std::pair<std::size_t, std::uint32_t>>& idle_whole() const { return idle_whole_; }
  bool whole(std::uint32_t chunk) const { return chunks_.at(chunk).whole; }
  std::size_t granules(std::uint32_t chunk) const { return chunks_.at(chunk).granules; }

  /// Bookkeeping for one active virtual mapping `m` of `p` made or removed (dormant or
  /// unmapped). A granule with no other active mapping becomes idle.
  void mapped(PhysRef p, Mapping m);
  void unmapped(PhysRef p, Mapping m);
  /// The active mappings of `p` (one, or two while an alias waits for its sweep).
  const std::vector<Mapping>& active(PhysRef p) const {
    return chunks_.at(p.chunk).active[p.offset];
  }
  /// Bookkeeping for a dormant mapping of `p` at `m` made or removed (the active-map count is
  /// the caller's to change through mapped()/unmapped()).
  void add_dormant(PhysRef p, Mapping m);
  void remove_dormant(PhysRef p, Mapping m);
  /// The dormant mappings of `p`, oldest first.
  const std::vector<Mapping>& dormant(PhysRef p) const;
  PhysHandle handle(std::uint32_t chunk) const { return chunks_.at(chunk).handle; }

  /// Releases every chunk whose granules are all idle. Returns bytes released.
  std::size_t release_idle_chunks();

  /// Checks the invariants against the mapped arenas' mappings, and that the chunks hold
  /// `expected_bytes`; throws std::logic_error.
  void check_invariants(const std::vector<const Arena*>& arenas, std::size_t expected_bytes) const;

 private:
  static constexpr std::uint32_t kNotIdle = UINT32_MAX;
  struct Chunk {
    PhysHandle handle = 0;
    std::size_t granules = 0;
    std::vector<std::uint32_t> idle_pos;        // per granule: index in idle_, or kNotIdle
    std::vector<std::vector<Mapping>> dormant;  // per granule, oldest first
    std::vector<std::vector<Mapping>> active;   // per granule (kept for whole chunks too)
    std::size_t idle = 0;
    bool whole = false;
    /// Where the chunk was first mapped (0: never): the address its reservation is reported at.
    DevicePtr home = 0;
  };
  Context& ctx_;
  std::unordered_map<std::uint32_t, Chunk> chunks_;
  std::vector<PhysRef> idle_;
  std::set<std::pair<std::size_t, std::uint32_t>> idle_whole_;  // (granules, chunk)
  std::size_t idle_whole_granules_ = 0;
  // Every change to idle_whole_ goes through these two, which keep idle_whole_granules_.
  void add_idle_whole(std::uint32_t chunk);
  bool drop_idle_whole(std::uint32_t chunk);  // false if it was not idle
  std::uint32_t next_chunk_ = 1;
};

}  // namespace cuarena::detail
