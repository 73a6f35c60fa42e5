// MonitorPublisher: keeps one allocator's monitor page (monitor_page.hpp) up to date, for
// `cuarena top`. The PyTorch drop-in and the LD_PRELOAD shim make one per device's main
// allocator; `cuarena replay --publish` one for the simulated device it replays on.
//
// A background thread rewrites the page every `interval` (250 ms) from Allocator::stats(),
// memory_limit() and the callable's device memory; the pool walks behind reclaimable_bytes and
// largest_free_bytes (memory_breakdown(), fragmentation(): O(blocks + granules) under the
// device lock) are spaced so that they hold the lock at most 0.2% of the time. Nothing runs on
// an allocation's path.
//
// Lifetime: the owner destroys the publisher before the allocator (declare it after). At
// process exit (exit(), return from main) every publisher still alive stops and removes its
// page, in an atexit handler registered when the first one is created (so before any static
// owner made earlier is destroyed). _exit() and signals leave the page: readers see its pid
// gone. fork() waits while a publisher reads its allocator (the child must not inherit the
// device lock held); the child neither writes nor removes its parent's pages, and may make its
// own. A publisher it inherited is inert, and destroying it touches nothing of the parent's.
//
// Errors: none reach the caller. When the page cannot be made (no /dev/shm, EACCES, ENOSPC) or
// the thread cannot start, the publisher is inert (publishing() is false) and says why once,
// through Options::log when given.
//
// Thread semantics: construct and destroy from any thread; publishing() and page_name() are
// constant after construction. The allocator's reads are thread-safe (allocator.hpp); the
// device_memory callable runs on the publisher's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cuarena/allocator.hpp"
#include "cuarena/monitor_page.hpp"
#include "cuarena/stats.hpp"

namespace cuarena::monitor {

/// The device's memory as its driver (or the simulator) reports it, in bytes; -1 where unknown.
struct DeviceMemory {
  std::int64_t free_bytes = -1;   ///< free on the device, all processes together
  std::int64_t total_bytes = -1;  ///< the device's memory
};

/// Asked once per rewrite, on the publisher's thread, with the statistics just read (a
/// simulated device has one user: its free memory is its capacity less reserved bytes). May
/// throw: the page then says -1 for both.
using DeviceMemoryFn = std::function<DeviceMemory(const Stats&)>;

class MonitorPublisher {
 public:
  struct Options {
    PageKind kind = PageKind::kTorch;
    int device = 0;                           ///< the CUDA ordinal, as the process numbers devices
    std::string device_uuid;                  ///< format_gpu_uuid(); "" for a simulated device
    DeviceMemoryFn device_memory;             ///< nullptr: available and total are -1
    std::chrono::milliseconds interval{250};  ///< between rewrites (at least 1 ms)
    /// Where the one line saying why there is no page goes (nullptr: nowhere).
    std::function<void(const std::string&)> log;
    /// The shm_open name; "" for page_name(geteuid(), getpid(), device). For tests.
    std::string name;
  };

  /// Creates the page (replacing a stale one of this pid: a page of this name that no live
  /// publisher of this process holds) and starts the thread. Never throws but std::bad_alloc.
  MonitorPublisher(const Allocator& allocator, Options options);
  /// Stops the thread and removes the page (in a fork child: neither).
  ~MonitorPublisher();
  MonitorPublisher(const MonitorPublisher&) = delete;
  MonitorPublisher& operator=(const MonitorPublisher&) = delete;

  /// True when the page exists and the thread runs.
  bool publishing() const { return publishing_; }
  /// The page's shm_open name ("/cuarena.<uid>.<pid>.<device>").
  const std::string& page_name() const { return name_; }

  /// "/cuarena.<uid>.<pid>.<device>": the name monitor_page.hpp gives a page.
  static std::string page_name(unsigned uid, long pid, int device);

  class State;  // the thread's (monitor_publisher.cpp); public for the exit and fork handlers

 private:
  std::string name_;
  bool publishing_ = false;
  std::unique_ptr<State> state_;
};

/// False when CUARENA_MONITOR is 0, false or off (any case): the drop-in and the shim then make
/// no page. Unset or anything else: on.
bool monitor_enabled();

/// Cached memory a request can be backed by (moved by remapping): owned and shared cached free
/// blocks, retired memory and idle physical granules. Free slab slots and parked blocks are in use
/// until they return. Bytes.
std::int64_t reusable_bytes(const Allocator::MemoryBreakdown& b);

/// What a new allocation could get now (cuarena.memory_available()): the device's free memory
/// plus reusable_bytes(), and within `limit_bytes` at most limit - reserved + reusable. Bytes;
/// -1 when `device_free_bytes` is unknown (negative).
std::int64_t available_bytes(std::int64_t device_free_bytes, const Allocator::MemoryBreakdown& b,
                             std::int64_t reserved_bytes, std::int64_t limit_bytes);

/// The 16 bytes of a CUDA device UUID (cudaDeviceProp::uuid, CUuuid) as NVML writes them:
/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hex.
std::string format_gpu_uuid(const char (&bytes)[16]);

}  // namespace cuarena::monitor
