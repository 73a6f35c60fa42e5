// PendingFrees: freed blocks whose memory waits on events before it may be reused: allocations
// other streams used (record_stream), and pieces of a retired planned arena's backing.
//
// An event is recorded on each stream the entry waits for when it is pushed; on a stream then
// under graph capture (an event there would join the capture) only once the capture is over,
// as PyTorch defers such frees' events.
//
// Invariant: every entry's events are recorded and not yet released, and its `unrecorded`
// streams have none yet; an entry leaves (its events released) only through process(), once
// it has no unrecorded stream, or the destructor.
//
// Locks: the allocator's device lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuarena/device_backend.hpp"
#include "front/live_table.hpp"

namespace cuarena::detail {

class PendingFrees {
 public:
  struct Entry {
    DevicePtr ptr;
    LiveBlock live;
    std::vector<EventId> events;
    bool backing = false;  ///< a retired planned arena's block, never counted as allocated
    std::vector<StreamId> unrecorded;  ///< streams under capture when pushed: no event yet
  };

  /// `recorded` counts the events recorded (Stats::events_recorded).
  PendingFrees(DeviceBackend& backend, std::int64_t& recorded)
      : backend_(backend), recorded_(recorded) {}
  /// Releases the events of the entries still waiting (their memory goes with the pool).
  ~PendingFrees();
  PendingFrees(const PendingFrees&) = delete;
  PendingFrees& operator=(const PendingFrees&) = delete;

  /// Queues `e` (no events yet) to wait for the work queued so far on each of `streams`.
  void push(Entry&& e, const std::vector<StreamId>& streams);

  /// Calls finish(entry) for each entry whose events have all completed (waiting for each event
  /// first when `wait`), after releasing those events, and removes it. An entry still waiting
  /// for a capture to end (of a stream it waits for, or of its own stream) stays, `wait` or
  /// not. finish may push(): an entry pushed meanwhile is visited in the same pass; the entry
  /// passed is invalid once it has.
  template <class Finish>
  void process(bool wait, Finish&& finish) {
    for (std::size_t i = 0; i < entries_.size();) {
      if (!entries_[i].unrecorded.empty() && !record(entries_[i])) {
        ++i;
        continue;
      }
      bool done = true;
      for (EventId e : entries_[i].events) {
        if (wait) backend_.wait_event(e);
        if (!backend_.event_completed(e)) {
          done = false;
          break;
        }
      }
      // Finishing a free may record on its own stream (a sweep, a plan's fence): not while
      // that stream is captured.
      if (!done || backend_.stream_capturing(entries_[i].live.stream)) {
        ++i;
        continue;
      }
      for (EventId e : entries_[i].events) backend_.release_event(e);
      entries_[i].events.clear();  // released: not again should finish throw
      finish(entries_[i]);
      entries_[i] = std::move(entries_.back());
      entries_.pop_back();
    }
  }

  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  /// Entries that are a planned arena's backing.
  std::size_t backings() const;
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  /// Records an event on each of e's unrecorded streams no longer under capture; true when
  /// none is left.
  bool record(Entry& e);

  DeviceBackend& backend_;
  std::int64_t& recorded_;
  std::vector<Entry> entries_;
};

}  // namespace cuarena::detail
