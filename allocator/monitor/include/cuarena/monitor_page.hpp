// The monitor page: how a cuarena process shows its memory to `cuarena top`.
//
// Each process that runs cuarena (the PyTorch drop-in, the LD_PRELOAD shim, or the replayer
// with --publish) keeps one page per device it uses, a POSIX shared-memory object named
//
//     /dev/shm/cuarena.<uid>.<pid>.<device>        (shm_open name "/cuarena.<uid>.<pid>.<device>")
//
// (uid: the effective user id, decimal; device: the `device` field) created with mode 0600
// (readable by the same user only), exactly kMonitorPageBytes long (the bytes past the struct
// are zero), and removed when its publisher stops or the process exits normally (exit(), return
// from main). CUARENA_MONITOR=0 in the environment turns the drop-in's and the shim's pages off.
// A background thread rewrites it every 250 ms (MonitorPublisher, monitor_publisher.hpp), never
// on an allocation's path. A reader needs no CUDA context and makes no call into the process: it
// maps the file read-only and copies the page under the sequence lock below. Until its first
// figures are written a new page has `seq` odd (or is all zero): readers skip it. A page whose
// process is gone (kill(pid, 0) fails with ESRCH: killed, or left by _exit) or whose process
// started after `start_ns` (the pid was reused) is stale: readers ignore it, and may remove it.
//
// Layout: the struct below, little-endian, naturally aligned, no padding (static_asserts keep
// it so). Readers in other languages (allocator/torch/python/cuarena/_monitor_page.py) follow the
// offsets given; a reader refuses a page whose magic or version it does not know.
//
// Sequence lock: `seq` is odd while the writer changes the page. A reader copies the page, and
// keeps the copy only if `seq` was even and equal before and after the copy (else it retries).
// The writer stores each 8-byte field with one aligned store, the header's fields and strings
// once before the first even `seq`. `seq` grows by 2 with every rewrite.
//
// Units: bytes for *_bytes, nanoseconds since the Unix epoch (CLOCK_REALTIME) for *_ns, counts
// otherwise (cumulative since the process started, unless named current or peak).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuarena::monitor {

inline constexpr char kMonitorMagic[8] = {'C', 'U', 'A', 'R', 'E', 'N', 'A', 'M'};
inline constexpr std::uint32_t kMonitorVersion = 1;
inline constexpr std::size_t kMonitorPageBytes = 4096;

/// Who publishes the page.
enum class PageKind : std::uint32_t {
  kTorch = 1,     ///< the PyTorch drop-in
  kShim = 2,      ///< the LD_PRELOAD shim
  kReplayer = 3,  ///< `cuarena replay --publish` (a simulated device)
};

struct MonitorPage {
  char magic[8];             ///<   0: kMonitorMagic
  std::uint32_t version;     ///<   8: kMonitorVersion
  std::uint32_t page_bytes;  ///<  12: sizeof(MonitorPage)
  std::uint64_t seq;         ///<  16: sequence lock: odd while being written
  std::int64_t pid;          ///<  24: the publishing process
  std::int32_t device;       ///<  32: its CUDA device ordinal (as the process numbers devices)
  std::uint32_t kind;        ///<  36: PageKind
  /// 40: when this page was created. A process that started later (/proc/<pid>/stat) did not
  /// write it: the pid was reused.
  std::uint64_t start_ns;
  std::uint64_t update_ns;  ///<  48: last rewrite
  char device_uuid[48];     ///<  56: "GPU-..." as NVML reports it, NUL-padded ("" simulated)
  char command[256];        ///< 104: the process's command line, spaces between arguments,
                            ///<      NUL-padded, cut to fit
  // Memory, as PyTorch's memory_stats() defines each (all pools):
  std::int64_t reserved_bytes;        ///< 360: current
  std::int64_t reserved_peak_bytes;   ///< 368
  std::int64_t allocated_bytes;       ///< 376: current
  std::int64_t allocated_peak_bytes;  ///< 384
  std::int64_t requested_bytes;       ///< 392: current
  std::int64_t requested_peak_bytes;  ///< 400
  std::int64_t active_bytes;          ///< 408: current
  /// 416: reserved memory not under a live allocation that cuarena can reuse or release
  /// (Allocator::MemoryBreakdown: owned + shared cached + idle + free slab slots + blocks parked
  /// in stream caches). This and largest_free_bytes come from a walk of the pool, which the
  /// publisher spaces out on a large pool (at most 0.2% of the time): they may be older than
  /// update_ns, by seconds on a pool of tens of thousands of blocks.
  std::int64_t reclaimable_bytes;
  /// 424: the largest contiguous free range inside mapped memory: the largest block it can hand
  /// out with no driver call.
  std::int64_t largest_free_bytes;
  std::int64_t limit_bytes;  ///< 432: memory limit (per_process_memory_fraction)
  /// 440: what a new allocation could get now (cuarena.memory_available()): the device's free
  /// memory plus the cache a request can be backed by (owned + shared cached + idle; free slab
  /// slots and parked blocks are not), and at most limit - reserved + that cache; -1 where the
  /// publisher cannot tell.
  std::int64_t available_bytes;
  /// 448: the device's memory (simulated: its capacity); -1 where the publisher cannot tell.
  std::int64_t device_total_bytes;
  // Counters, cumulative:
  std::int64_t driver_calls;       ///< 456: map + unmap + set-access + create + release
  std::int64_t num_ooms;           ///< 464: out-of-memory errors raised
  std::int64_t num_alloc_retries;  ///< 472: allocations that needed the reclaim path
  std::int64_t allocations;        ///< 480: allocations served (failed ones not counted)
  std::int64_t memory_first;       ///< 488: 1 while the pool places memory-first
  std::int64_t spare[75];          ///< 496: zero; room for fields of later versions
};

static_assert(sizeof(MonitorPage) == 1096, "the page layout is a file format: keep offsets");
static_assert(offsetof(MonitorPage, reserved_bytes) == 360);
static_assert(offsetof(MonitorPage, memory_first) == 488);
static_assert(sizeof(MonitorPage) <= kMonitorPageBytes);

}  // namespace cuarena::monitor
