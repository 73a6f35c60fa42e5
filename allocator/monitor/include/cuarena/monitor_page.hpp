// The monitor page: how a cuarena process shows its memory to `cuarena top`.
//
// Each process that runs cuarena (the PyTorch drop-in, the LD_PRELOAD shim, or the replayer
// with --publish) keeps one page per device it uses, a POSIX shared-memory object named
//
//     /dev/shm/cuarena.<uid>.<pid>.<device>        (shm_open name "/cuarena.<uid>.<pid>.<device>")
//
// created with mode 0600 (readable by the same user only), exactly kMonitorPageBytes long, and
// removed at exit. A background thread rewrites it a few times a second (MonitorPublisher),
// never on an allocation's path. A reader needs no CUDA context and makes no call into the
// process: it maps the file read-only and copies the page under the sequence lock below. A
// page whose process is gone (kill(pid, 0) fails with ESRCH, or its start time differs: the pid
// was reused) is stale: readers ignore it, and may remove it.
//
// Layout: the struct below, little-endian, naturally aligned, no padding (static_asserts keep
// it so). Readers in other languages (allocator/torch/python/cuarena/monitor.py) follow the
// offsets given; a reader refuses a page whose magic or version it does not know.
//
// Sequence lock: `seq` is odd while the writer changes the page. A reader copies the page, and
// keeps the copy only if `seq` was even and equal before and after the copy (else it retries).
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
  std::uint64_t start_ns;    ///<  40: when the process started publishing (tells a reused pid)
  std::uint64_t update_ns;   ///<  48: last rewrite
  char device_uuid[48];      ///<  56: "GPU-..." as NVML reports it, NUL-padded ("" simulated)
  char command[256];         ///< 104: the process's command line, spaces between arguments,
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
  /// (Allocator::MemoryBreakdown: owned + shared cached + idle + free slab slots).
  std::int64_t reclaimable_bytes;
  /// 424: the largest contiguous free range inside mapped memory: the largest block it can hand
  /// out with no driver call.
  std::int64_t largest_free_bytes;
  std::int64_t limit_bytes;  ///< 432: memory limit (per_process_memory_fraction)
  /// 440: what a new allocation could get now: the device's free memory plus reclaimable,
  /// within the limit (cuarena.memory_available()); -1 where the publisher cannot tell.
  std::int64_t available_bytes;
  std::int64_t device_total_bytes;  ///< 448: the device's memory (simulated: its capacity)
  // Counters, cumulative:
  std::int64_t driver_calls;       ///< 456: map + unmap + set-access + create + release
  std::int64_t num_ooms;           ///< 464: out-of-memory errors raised
  std::int64_t num_alloc_retries;  ///< 472: allocations that needed the reclaim path
  std::int64_t allocations;        ///< 480: allocations served
  std::int64_t memory_first;       ///< 488: 1 while the pool places memory-first
  std::int64_t spare[75];          ///< 496: zero; room for fields of later versions
};

static_assert(sizeof(MonitorPage) == 1096, "the page layout is a file format: keep offsets");
static_assert(offsetof(MonitorPage, reserved_bytes) == 360);
static_assert(offsetof(MonitorPage, memory_first) == 488);
static_assert(sizeof(MonitorPage) <= kMonitorPageBytes);

}  // namespace cuarena::monitor
