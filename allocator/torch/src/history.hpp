// History: the allocation trace PyTorch's memory snapshots carry (torch.cuda.memory.
// _record_memory_history), and the trace trackers NCCL's buffer registration attaches.
//
// Entries go to a ring buffer per device of at most `max_entries` (PyTorch's
// alloc_trace_max_entries), so a long job keeps its latest events, as PyTorch does. Times are
// stored as c10's approximate clock and converted to Unix microseconds when a snapshot is taken.
//
// Thread semantics: every member is safe to call concurrently (one mutex). Trackers are called
// with that mutex released, in the allocating thread, and must not call back into the allocator.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "torch_compat.hpp"

namespace cuarena::torch_adapter {

class History {
 public:
  using Action = CDA::TraceEntry::Action;

  /// torch.cuda.memory._record_memory_history(enabled, context, max_entries, ...).
  void configure(bool enabled, CDA::CreateContextFn recorder, std::size_t max_entries,
                 CDA::RecordContext when, bool clear, const std::vector<std::string>& skip);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  /// True when record() has anyone to tell: recording is on or a tracker is attached.
  bool wanted() const { return wanted_.load(std::memory_order_relaxed); }

  void attach_tracker(CDA::AllocatorTraceTracker tracker);

  /// Records one event (and tells the trackers). `addr` is the address (for OOM: the device's
  /// free bytes), `size` bytes. Cheap no-op unless wanted().
  void record(Action action, c10::DeviceIndex device, std::size_t addr, std::size_t size,
              void* stream, c10::MempoolId_t pool);

  /// Records a change of the physical memory cuarena holds (Allocator::ReservationChange) as a
  /// SEGMENT_MAP (bytes > 0) or SEGMENT_UNMAP entry, so a snapshot's timeline shows reserved
  /// memory. Only into the history: trace trackers (NCCL's buffer registration) are not told,
  /// since cuarena's physical memory moves between addresses. Called under the allocator's
  /// device lock; takes no stack. A no-op unless enabled().
  void record_reservation(c10::DeviceIndex device, std::size_t addr, std::int64_t bytes);

  /// The stack context for a live allocation (RecordContext STATE or above), or nullptr.
  std::shared_ptr<c10::GatheredContext> context_of(std::size_t addr) const;
  /// Forgets the context of a freed allocation.
  void forget(std::size_t addr);

  /// Copies the trace of every device in `devices`, oldest first, times as Unix microseconds.
  std::vector<std::vector<CDA::TraceEntry>> traces(int devices) const;

  void annotate(const std::vector<std::pair<std::string, std::string>>& md,
                c10::DeviceIndex device);
  /// torch.cuda.memory._annotate_tensor: an "annotate" entry for the live allocation at `addr`
  /// (`size` bytes) carrying `metadata`, with the stack where RecordContext keeps alloc stacks.
  /// Torch 2.14 and later (earlier minors have no such action); a no-op unless enabled().
  void annotate_allocation(c10::DeviceIndex device, std::size_t addr, std::size_t size,
                           void* stream, const std::string& metadata);

  /// The calling thread's metadata, stamped on every entry it records
  /// (torch.cuda.memory._set_memory_metadata; thread-local, as in PyTorch).
  static void set_thread_metadata(const std::string& metadata);
  static std::string thread_metadata();
  std::vector<CDA::AnnotationEntry> annotations() const;

 private:
  struct Ring {
    std::vector<CDA::TraceEntry> entries;
    std::size_t next = 0;  // where the next entry goes once the ring is full
  };
  bool skipped(Action action) const;
  /// The stack recorder and when it applies, read under the lock (called without it).
  std::pair<CDA::CreateContextFn, CDA::RecordContext> stack_settings() const;
  void push(c10::DeviceIndex device, const CDA::TraceEntry& te);  // into its ring; under mu_

  std::atomic<bool> enabled_{false};
  std::atomic<bool> wanted_{false};
  mutable std::mutex mu_;
  CDA::CreateContextFn recorder_ = nullptr;
  CDA::RecordContext when_ = CDA::RecordContext::NEVER;
  std::size_t max_entries_ = 0;
  std::unordered_set<int> skip_;  // actions not recorded
  std::vector<Ring> rings_;       // by device
  std::unordered_map<std::size_t, std::shared_ptr<c10::GatheredContext>> contexts_;  // live
  std::vector<CDA::AllocatorTraceTracker> trackers_;
  std::vector<CDA::AnnotationEntry> annotations_;
  mutable c10::ApproximateClockToUnixTimeConverter clock_;
};

}  // namespace cuarena::torch_adapter
