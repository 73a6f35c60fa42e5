#include "cuarena/stats.hpp"

namespace cuarena {

std::map<std::string, std::int64_t> Stats::to_map() const {
  std::map<std::string, std::int64_t> out;
  static const char* pools[] = {"all", "small_pool", "large_pool"};
  auto put_array = [&](const char* name, const StatArray& a) {
    for (int p = 0; p < 3; ++p) {
      const std::string prefix = std::string(name) + "." + pools[p] + ".";
      out[prefix + "current"] = a[p].current;
      out[prefix + "peak"] = a[p].peak;
      out[prefix + "allocated"] = a[p].allocated;
      out[prefix + "freed"] = a[p].freed;
    }
  };
  put_array("allocation", allocation);
  put_array("segment", segment);
  put_array("active", active);
  put_array("inactive_split", inactive_split);
  put_array("allocated_bytes", allocated_bytes);
  put_array("reserved_bytes", reserved_bytes);
  put_array("active_bytes", active_bytes);
  put_array("inactive_split_bytes", inactive_split_bytes);
  put_array("requested_bytes", requested_bytes);
  for (const auto& [name, s] : {std::pair{"oversize_allocations", &oversize_allocations},
                                std::pair{"oversize_segments", &oversize_segments}}) {
    out[std::string(name) + ".current"] = s->current;
    out[std::string(name) + ".peak"] = s->peak;
    out[std::string(name) + ".allocated"] = s->allocated;
    out[std::string(name) + ".freed"] = s->freed;
  }
  out["num_alloc_retries"] = num_alloc_retries;
  out["num_ooms"] = num_ooms;
  out["num_sync_all_streams"] = num_sync_all_streams;
  out["num_device_alloc"] = num_device_alloc;
  out["num_device_free"] = num_device_free;
  out["max_split_size"] = max_split_size;
  out["cuarena.map_calls"] = map_calls;
  out["cuarena.unmap_calls"] = unmap_calls;
  out["cuarena.access_calls"] = access_calls;
  out["cuarena.granules_aliased"] = granules_aliased;
  out["cuarena.granules_reactivated"] = granules_reactivated;
  out["cuarena.granules_mapped"] = granules_mapped;
  out["cuarena.granules_unmapped"] = granules_unmapped;
  out["cuarena.granules_stolen"] = granules_stolen;
  out["cuarena.defrag_passes"] = defrag_passes;
  out["cuarena.stitched_ranges"] = stitched_ranges;
  out["cuarena.slabs_created"] = slabs_created;
  out["cuarena.slabs_released"] = slabs_released;
  out["cuarena.events_recorded"] = events_recorded;
  out["cuarena.sweep_polls"] = sweep_polls;
  out["cuarena.sweep_polls_pending"] = sweep_polls_pending;
  out["cuarena.cross_stream_reuses"] = cross_stream_reuses;
  out["cuarena.grow_waits"] = grow_waits;
  out["cuarena.grow_stream_waits"] = grow_stream_waits;
  out["cuarena.pending_frees"] = pending_frees;
  out["cuarena.stream_cache_hits"] = stream_cache_hits;
  out["cuarena.stream_cached_bytes"] = stream_cached_bytes;
  out["cuarena.loop_plans"] = loop_plans;
  out["cuarena.memory_first"] = memory_first;
  out["cuarena.planned_allocations"] = planned_allocations;
  out["cuarena.stream_waits"] = stream_waits;
  out["cuarena.plans_refused"] = plans_refused;
  return out;
}

}  // namespace cuarena
