// StreamSweeps: how far each stream's device work has got past the frees made on it.
//
// Every free (or retirement) on a stream takes the stream's next sequence number. A sweep is an
// event recorded on the stream that covers every number taken so far; once it completes, the
// stream's work up to those frees is done on the device and their memory may go to any stream:
// the stream's `done` rises to the sweep's number. At most tuning::kMaxSweepsPerStream sweeps
// are in flight per stream (a new one past that replaces the newest, covering more). Polling
// and recording visit only the streams with work, so their cost follows the streams in use, not
// every stream ever seen (a job may create hundreds of thousands).
//
// One-way dependency: this knows streams, numbers and events, never blocks. Its user (BlockPool)
// derives its per-stream state from Stream, says when a stream has frees to cover, and learns
// through a callback how far each completed sweep reached.
//
// Invariants kept here: a stream's events are in recording order, covering increasing numbers
// up to seq; every stream with an event in flight is in sweeping_; in_flight_ counts the events
// of all streams; a stream is in unswept_ iff its `unswept` flag is set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "cuarena/device_backend.hpp"
#include "cuarena/stats.hpp"

namespace cuarena::detail {

class StreamSweeps {
 public:
  struct Stream {
    StreamId id = 0;
    std::uint64_t seq = 0;   ///< number of the stream's latest free
    std::uint64_t done = 0;  ///< frees up to this number are finished on the device
    /// Sweep events in flight, oldest first: (event, last number it covers).
    std::deque<std::pair<EventId, std::uint64_t>> events;
    bool sweeping = false;  ///< listed in sweeping_
    bool unswept = false;   ///< listed in unswept_
  };

  StreamSweeps(DeviceBackend& backend, Stats& stats) : backend_(backend), stats_(stats) {}
  ~StreamSweeps();  // releases the events in flight
  StreamSweeps(const StreamSweeps&) = delete;
  StreamSweeps& operator=(const StreamSweeps&) = delete;

  /// A free or retirement on `s`: its number. The stream is listed for the next record_all().
  std::uint64_t note_free(Stream& s) {
    if (!s.unswept) {
      s.unswept = true;
      unswept_.push_back(&s);
    }
    return ++s.seq;
  }
  /// Records a sweep on `s` unless its newest already covers every free. Non-blocking. `s` may
  /// not be under graph capture: a free's own stream is not (the caller defers such frees).
  void record(Stream& s);
  /// Calls record_if(Stream&) on every stream listed by note_free() since the last call; it
  /// decides whether there is anything to share and records. A stream under graph capture
  /// (DeviceBackend::stream_capturing: an event there would join the capture) stays listed for
  /// a later call.
  template <class Fn>
  void record_all(Fn&& record_if) {
    std::vector<Stream*> listed;
    listed.swap(unswept_);
    for (Stream* s : listed) {
      if (backend_.stream_capturing(s->id)) {
        unswept_.push_back(s);  // still flagged unswept
        continue;
      }
      s->unswept = false;
      record_if(*s);
    }
  }
  /// Retires s's completed sweeps, oldest first (at most `most` of them), raising s.done and
  /// calling on_done(covered) after each. Non-blocking. Counts the poll (Stats::sweep_polls), and
  /// whether its oldest sweep was still running (Stats::sweep_polls_pending: how far the device
  /// runs behind).
  template <class Fn>
  void poll(Stream& s, Fn&& on_done, std::size_t most = SIZE_MAX) {
    if (s.events.empty() || most == 0) return;
    ++stats_.sweep_polls;
    if (!backend_.event_completed(s.events.front().first)) {
      ++stats_.sweep_polls_pending;
      return;
    }
    do {
      const auto [event, covered] = s.events.front();
      s.events.pop_front();
      backend_.release_event(event);
      --in_flight_;
      s.done = covered;
      on_done(covered);
    } while (--most > 0 && !s.events.empty() && backend_.event_completed(s.events.front().first));
  }
  /// poll() on every stream with sweeps in flight, on_done(Stream&, covered).
  template <class Fn>
  void poll_all(Fn&& on_done) {
    if (in_flight_ == 0) return;
    // Index loop: on_done never records a sweep, but keep no iterator across it anyway.
    std::size_t kept = 0;
    for (std::size_t i = 0; i < sweeping_.size(); ++i) {
      Stream* s = sweeping_[i];
      poll(*s, [&](std::uint64_t covered) { on_done(*s, covered); });
      if (s->events.empty())
        s->sweeping = false;
      else
        sweeping_[kept++] = s;
    }
    sweeping_.resize(kept);
  }
  /// Blocks until every sweep in flight has completed (they still need poll_all()).
  void wait_all();

 private:
  DeviceBackend& backend_;
  Stats& stats_;
  std::vector<Stream*> sweeping_;  // streams with sweeps in flight (and a few done)
  std::vector<Stream*> unswept_;   // streams whose latest frees no sweep covers yet
  std::size_t in_flight_ = 0;
};

}  // namespace cuarena::detail
