// CPU models of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.11),
// for replaying traces without a GPU: the native mode (cudaMalloc segments) and
// expandable_segments:True (one growing virtual segment per stream and pool). Each rule cites the
// PyTorch function it follows; the code is written from the behaviour, not copied.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cuarena/config_table.hpp"
#include "cuarena/replay/replay.hpp"

namespace cuarena::replay {

/// The PYTORCH_CUDA_ALLOC_CONF keys that change the caching allocator's decisions
/// (c10/core/AllocatorConfig.cpp). Syntax: `key:value,key:value`, lists in `[...]`.
struct TorchConf {
  static constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();
  /// Intervals of roundup_power2_divisions: [1 MiB * 2^i, 1 MiB * 2^(i+1)), the last open.
  static constexpr std::size_t kIntervals = 16;

  using Divisions = std::array<std::uint64_t, kIntervals>;

  std::uint64_t max_split_size = kNoLimit;             ///< max_split_size_mb, in bytes
  std::uint64_t max_non_split_rounding = 20ull << 20;  ///< max_non_split_rounding_mb, in bytes
  Divisions roundup_power2_divisions{};                ///< 0: plain 512 B rounding
  double garbage_collection_threshold = 0;             ///< 0: off
  std::optional<bool> expandable_segments;             ///< set when the string names it

  bool operator==(const TorchConf&) const = default;

  /// The keys of PYTORCH_CUDA_ALLOC_CONF the models read. A setting that is off by being absent
  /// (no garbage collection, no divisions, expandable_segments not named) is left out of
  /// config_string(), as PyTorch's syntax cannot write it.
  static const ConfigTable<TorchConf>& table();
  /// Parses `text` (PyTorch's syntax; whitespace inside values is dropped, as PyTorch does).
  /// Throws ConfigError, one line naming the key and its position: an unknown key, a bad value.
  static TorchConf parse(const std::string& text);
  /// AcceleratorAllocatorConfig::roundup_power2_divisions(size).
  std::uint64_t divisions_for(std::uint64_t size) const;
};

/// DeviceCachingAllocator::round_size: at least 512 B, then 512 B multiples or, where
/// roundup_power2_divisions applies, the next of that many steps between two powers of two.
std::uint64_t torch_round_size(std::uint64_t size, const TorchConf& conf);
/// DeviceCachingAllocator::get_allocation_size: the segment cudaMalloc'd for a rounded request.
std::uint64_t torch_allocation_size(std::uint64_t rounded);

/// One device of PyTorch's caching allocator, on simulated memory. Not thread-safe.
class TorchCachingSim {
 public:
  using Handle = std::uint64_t;  ///< one allocation; never reused
  /// A memory pool: kDefaultPool (large_blocks / small_blocks), or a CUDA graph's private pool
  /// (PrivatePool in graph_pools), made on its first request.
  using PoolId = std::uint32_t;
  static constexpr PoolId kDefaultPool = 0;

  struct Options {
    TorchConf conf;
    bool expandable = false;                       ///< expandable_segments:True
    std::uint64_t device_bytes = 143771ull << 20;  ///< totalGlobalMem (the recorded H200)
    /// setMemoryFraction's allowed maximum (set_fraction in PyTorch); it also turns on
    /// garbage_collection_threshold, which PyTorch applies only under a memory fraction.
    std::optional<std::uint64_t> memory_limit;
  };

  struct Stats {
    std::int64_t num_device_alloc = 0;  ///< cudaMalloc calls / segment maps
    std::int64_t num_device_free = 0;   ///< cudaFree calls / segment unmaps
    std::int64_t num_alloc_retries = 0;
    std::int64_t num_ooms = 0;
    std::int64_t num_sync_all_streams = 0;
  };

  struct FreeInfo {
    std::uint64_t free_bytes = 0;  ///< reserved (mapped) but not allocated
    std::uint64_t largest_free = 0;
    std::uint64_t free_blocks = 0;
  };

  explicit TorchCachingSim(Options options);
  ~TorchCachingSim();
  TorchCachingSim(const TorchCachingSim&) = delete;
  TorchCachingSim& operator=(const TorchCachingSim&) = delete;

  /// DeviceCachingAllocator::malloc; std::nullopt where PyTorch raises OutOfMemoryError. A
  /// private `pool` serves the request as get_pool does while its capture is under way
  /// (beginAllocateToPool): from that pool's own cached blocks and segments, and without the
  /// release of every cached segment on the way to out-of-memory.
  std::optional<Handle> malloc(std::uint64_t size, std::uint64_t stream,
                               PoolId pool = kDefaultPool);
  /// The program dropped the block (free_requested); it stays in use until free_completed,
  /// except that release_cached_blocks() synchronizes and frees it, as PyTorch's does.
  void free_requested(Handle h);
  /// The block is free (free_completed). A handle already freed is ignored.
  void free_completed(Handle h);
  /// emptyCache(): release_cached_blocks: the default pools and every released private pool.
  void empty_cache();
  /// releasePool: the graphs using the private pool are gone, so the next release returns its
  /// whole free segments too. A later request to the pool takes it up again.
  void release_pool(PoolId pool);

  std::uint64_t address(Handle h) const;     ///< the block's simulated address
  std::uint64_t block_size(Handle h) const;  ///< the block's (rounded) size
  std::uint64_t reserved_bytes() const { return reserved_; }
  std::uint64_t peak_reserved_bytes() const { return peak_reserved_; }
  /// The most reserved bytes since the last call (or since construction), which a series
  /// needs: one call can reserve and release (garbage collection, release and retry).
  std::uint64_t take_interval_peak() {
    const std::uint64_t p = interval_peak_;
    interval_peak_ = reserved_;
    return p;
  }
  std::uint64_t allocated_bytes() const { return allocated_; }
  std::uint64_t requested_bytes() const { return requested_; }
  std::size_t segment_count() const;  ///< cudaMalloc segments / expandable segments held
  FreeInfo free_info() const;         ///< over every pool, private ones included
  const Stats& stats() const { return stats_; }

 private:
  struct Block;
  struct Pool;
  struct PrivatePool;
  struct Segment;
  struct Request;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct ByAddress {
    bool operator()(const Block* a, const Block* b) const;
  };

  // Allocation path (malloc's order).
  Request make_request(std::uint64_t size, std::uint64_t stream, PoolId pool);
  Pool& get_pool(std::uint64_t size, PoolId pool);
  bool get_free_block(Request& r);
  bool alloc_block(Request& r, bool is_retry);
  bool release_available_cached_blocks(const Request& r);
  bool release_cached_blocks();
  void garbage_collect_cached_blocks();
  bool should_split(const Block* block, std::uint64_t size) const;
  Block* alloc_found_block(Request& r, std::uint64_t requested, bool split);

  // Freeing and merging.
  void free_block(Block* block);
  std::uint64_t try_merge_blocks(Block* dst, Block* src);
  void synchronize_and_free_events();
  void release_blocks(Pool& pool);
  void release_block(Block* block);

  // Expandable segments.
  Block* try_allocate_expandable_block(const Request& r);
  Block* find_expandable_block(std::uint64_t stream, Pool& pool, std::uint64_t size);
  bool map_block(Block* to_map, std::uint64_t size);
  void unmap_block(Block* block);
  void release_expandable_segment(Block* block);

  // Simulated device memory.
  std::uint64_t reserve_address(std::uint64_t size);
  void release_address(std::uint64_t addr, std::uint64_t size);
  bool device_has(std::uint64_t bytes) const;
  void add_reserved(std::int64_t bytes);
  bool gc_enabled() const;
  Block* new_block();
  void delete_block(Block* block);
  void insert_free(Block* block);

  Options options_;
  std::unique_ptr<Pool> small_;
  std::unique_ptr<Pool> large_;
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_pools_;  ///< graph_pools
  std::deque<Block> storage_;
  std::vector<Block*> spare_;
  std::unordered_map<Handle, Block*> live_;
  std::unordered_set<Handle> pending_;  ///< free_requested, not yet free_completed
  std::deque<std::unique_ptr<Segment>> expandable_segments_;
  std::map<std::uint64_t, std::uint64_t> free_addresses_;  ///< virtual address ranges: start -> end
  std::uint64_t address_top_;
  Handle next_handle_ = 1;
  std::uint64_t reserved_ = 0, peak_reserved_ = 0, allocated_ = 0, requested_ = 0;
  std::uint64_t interval_peak_ = 0;  ///< take_interval_peak()
  std::size_t native_segments_ = 0;
  Stats stats_;
};

/// The CUDA graphs' private pools of a recording made under the native allocator, as far as its
/// events show them. A snapshot's events name no pool, so they are inferred from what PyTorch's
/// release_cached_blocks does: at a release (emptyCache, or malloc's way to out-of-memory) it
/// frees every whole cached segment of the default pools, but none of a private pool whose graphs
/// live. A stream that had whole free segments kept at a release, and none released there, holds
/// a private pool (a capture stream, as torch.compile's CUDA-graph trees use): from the first
/// such segment on, every segment the stream gets is that pool's (a block lies in a segment of
/// its own pool), until the recording releases one of them (the pool was released, releasePool).
/// A graph whose pool sees no release stays in the default pools, where only a release would have
/// told it apart. Recordings with expandable segments (segment_map) are not read.
struct TorchGraphPools {
  using PoolId = TorchCachingSim::PoolId;
  /// Per event, the pool the allocation came from; empty when all came from the default pools.
  std::vector<PoolId> alloc_pool;
  /// (event, pool), by event: the release at that event also returns that pool's free segments.
  std::vector<std::pair<std::size_t, PoolId>> released;
  PoolId pools = 0;  ///< private pools found, numbered from 1

  PoolId pool_of(std::size_t event) const {
    return alloc_pool.empty() ? TorchCachingSim::kDefaultPool : alloc_pool[event];
  }
};

TorchGraphPools infer_graph_pools(const std::vector<Event>& events);

struct TorchSimOptions {
  TorchConf conf;
  bool expandable = false;
  std::uint64_t capacity = 0;  ///< 0: the recorded H200's 143771 MiB and no memory fraction
  bool series = false;  ///< fill Result::series (replay_torch_sim; the capacity search never)
};

/// Replays events (alloc, free_requested, free_completed) through TorchCachingSim. The row is
/// "torch-expandable-sim" when options.expandable, else "torch-native-sim".
Result replay_torch_sim(const std::vector<Event>& events, const TorchSimOptions& options);

/// Smallest capacity (a 2 MiB multiple) under which replay_torch_sim has no out-of-memory.
std::optional<std::uint64_t> torch_sim_min_capacity(const std::vector<Event>& events,
                                                    const TorchSimOptions& options,
                                                    std::uint64_t known_good);

// ---- The replayer's rows ----

/// torch-native-sim or torch-expandable-sim.
bool is_torch_sim(const std::string& allocator);
/// Checks --torch-conf: its keys and values, and that an expandable_segments setting agrees with
/// the torch-*-sim rows asked for. Throws ConfigError naming the problem.
void check_torch_conf(const std::string& torch_conf, const std::vector<std::string>& allocators);
/// One torch-*-sim row: the settings from options.torch_conf, the device limit from
/// options.capacity or device.capacity (0: the H200, no memory fraction); with
/// `min_capacity`, also its smallest capacity.
Result replay_torch_sim_row(const std::string& allocator, const std::vector<Event>& events,
                            const SimOptions& options, bool min_capacity);

}  // namespace cuarena::replay
