// Mappings: the physical memory, where it is mapped, and every memory call to the device.
//
// This layer owns the physical pool (PhysicalMemory: chunks, idle granules, who maps what) and
// makes every backend call that reserves or releases address space, creates, maps, unmaps or
// releases physical memory, or allocates and frees a segment; it records each mapping in the
// Arena it lies in. It never sees a block: BlockPool decides which granules of which arena to
// back or to free, and asks here by arena and granule number.
//
// A request's backing (Backing) is found in steps BlockPool::ensure_mapped orders; the steps
// that need no block live here: idle whole chunks for the runs they fit (pack_whole), idle and
// fresh granules for the rest (fill), then one map call per run and one access grant over
// several (map).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "front/context.hpp"
#include "physical/arena.hpp"
#include "physical/physical_memory.hpp"

namespace cuarena::detail {

/// The physical granules found for one request's holes, step by step.
///
/// holes.size() == supply.size() once pack_whole() ran; every hole i with supply[i] valid is
/// backed by that physical granule; aliases are lent only to holes inside [inner_first,
/// inner_last): granules wholly inside the request, and (edge) the top granule sticking out of
/// it when its free rest is to become the request's stream's (BlockPool::claim_edge;
/// unclaimed, other streams could use that rest at once).
struct Backing {
  std::vector<std::size_t> holes;     ///< unmapped granules of the request's range, ascending
  std::vector<PhysRef> supply;        ///< per hole: its physical granule, invalid until found
  std::vector<std::uint32_t> wholes;  ///< idle whole chunks taken (given back on refusal)
  std::vector<PhysRef> aliases;       ///< the stream's own granules its retired blocks lend
  std::size_t inner_first = 0, inner_last = 0;
  bool edge = false;               ///< the inside range covers the top edge granule too
  std::size_t packed = 0;          ///< holes backed by whole chunks, idle or aliased
  std::size_t aliased_whole = 0;   ///< of which aliased
  std::size_t reclaimed_idle = 0;  ///< granules steal() made idle for this request
  std::size_t idle_taken = 0;      ///< idle single granules fill() took
  bool inside(std::size_t g) const { return g >= inner_first && g < inner_last; }
};

class Mappings {
 public:
  explicit Mappings(Context& ctx) : ctx_(ctx), phys_(ctx) {}
  Mappings(const Mappings&) = delete;
  Mappings& operator=(const Mappings&) = delete;

  const PhysicalMemory& phys() const { return phys_; }

  // --- Address space and segments ---------------------------------------------------------

  /// A fresh arena of `bytes` (a granule multiple) of address space with nothing mapped.
  /// Throws BackendError when the address space is exhausted.
  std::unique_ptr<Arena> reserve(std::size_t bytes);
  /// A segment arena of `bytes` (a granule multiple), backed whole, counted as reserved; nullptr
  /// when the upstream is out of memory. Throws BackendError.
  std::unique_ptr<Arena> allocate_segment(std::size_t bytes, StreamId stream);
  /// Frees segment arena `a` (nothing may use it any more). Throws BackendError.
  void free_segment(const Arena& a);
  /// Bytes of all segments (segment mode's reserved bytes).
  std::size_t segment_bytes() const { return segment_bytes_; }
  /// Returns what the upstream itself caches (segment mode).
  void trim() { ctx_.backend.trim(); }
  /// Unmaps everything mapped in `a` and releases its address space (frees it, for a
  /// segment). For the pool's destructor: backend errors are swallowed.
  void release(Arena& a) noexcept;

  // --- Mapping state -----------------------------------------------------------------------

  /// The virtual granules [first, first+count) of the mapping that puts physical granule p at
  /// virtual granule g: g alone, or all of p's whole chunk.
  struct Extent {
    std::size_t first, count;
  };
  Extent extent(PhysRef p, std::size_t g) const {
    if (!phys_.whole(p.chunk)) return {g, 1};
    return {g - p.offset, phys_.granules(p.chunk)};
  }
  /// p (all of its chunk, if whole) is mapped actively nowhere and not taken.
  bool idle(PhysRef p) const {
    return phys_.whole(p.chunk) ? phys_.is_idle_whole(p.chunk) : phys_.is_idle(p);
  }
  /// Idle granules, counting whole chunks.
  std::size_t idle_granules() const { return phys_.idle_granules() + phys_.idle_whole_granules(); }

  // --- Changing mappings -------------------------------------------------------------------

  /// Unmaps granules [first, first+count) of `a`, active or dormant, in one backend call.
  void unmap(Arena& a, std::size_t first, std::size_t count);
  /// Retires the active mapping at granule g (its physical granule is no longer used there):
  /// dormant if dormant_maps allows, evicting the granule's oldest dormant mapping past the cap.
  /// A whole chunk's mapping changes state as one piece.
  void make_dormant(Arena& a, std::size_t g);
  /// Takes back, with no driver call, the holes whose dormant physical granule is idle, and
  /// removes them from `holes`. A whole chunk comes back whole, possibly past the holes: then
  /// `spilled` is set. Returns the granules taken back.
  std::size_t reactivate(Arena& a, std::vector<std::size_t>& holes, bool& spilled);
  /// Unmaps every dormant mapping in `a` (release_cached: they keep chunks from going back).
  void unmap_all_dormant(Arena& a);
  /// Releases every chunk whose granules are all idle. Returns bytes released.
  std::size_t release_idle_chunks() { return phys_.release_idle_chunks(); }

  // --- Backing a request (see Backing) -----------------------------------------------------

  /// Assigns idle whole chunks to the runs of consecutive holes they fit (largest first),
  /// filling r.supply (sized to the holes) and r.wholes; adds the granules so backed to
  /// r.packed.
  void pack_whole(Backing& r);
  /// Fills every hole r.supply still lacks: aliases (inside holes only), idle granules, then
  /// fresh chunks (whole chunks for long runs of holes). Idle whole chunks that fit no hole
  /// are released first when growing would pass `soft` bytes reserved. False, with the whole
  /// and idle chunks it took given back, when the limit or the device refuses.
  bool fill(Backing& r, std::size_t soft);
  /// From now on, fresh memory comes as movable single granules only (memory first).
  void stop_whole_chunks() { singles_only_ = true; }
  /// Whole chunks again, where whole_chunk_min says (the pool left memory first).
  void resume_whole_chunks() { singles_only_ = false; }
  /// Maps r's holes in `a` (unmapping their dormant mappings first), granting access once per
  /// nearby runs. Precondition: fill(r) returned true.
  void map(Arena& a, const Backing& r);

 private:
  /// Creates physical memory for holes[unfilled[i]] into supply: whole chunks for long runs.
  /// False (nothing created) when the limit or the device refuses.
  bool create_fresh(const std::vector<std::size_t>& holes, const std::vector<std::size_t>& unfilled,
                    std::vector<PhysRef>& supply);
  /// Unmaps every dormant mapping of an idle whole chunk and releases it.
  void release_idle_whole(std::uint32_t chunk);
  /// Unmaps the dormant mappings among `holes` (their granules are busy elsewhere).
  void unmap_dormant(Arena& a, const std::vector<std::size_t>& holes);
  void map_granules(Arena& a, const std::vector<std::size_t>& granules,
                    const std::vector<PhysRef>& phys);

  Context& ctx_;
  PhysicalMemory phys_;
  std::size_t segment_bytes_ = 0;
  bool singles_only_ = false;  // stop_whole_chunks()
};

}  // namespace cuarena::detail
