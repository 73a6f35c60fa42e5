#include "large/stream_sweeps.hpp"

#include "tuning.hpp"

namespace cuarena::detail {

StreamSweeps::~StreamSweeps() {
  for (Stream* s : sweeping_) {
    for (auto& [event, seq] : s->events) backend_.release_event(event);
  }
}

void StreamSweeps::record(Stream& s) {
  if (!s.events.empty() && s.events.back().second == s.seq) return;  // nothing new to cover
  if (s.events.size() >= tuning::kMaxSweepsPerStream) {
    // Full: the newest sweep is superseded by one that also covers the latest frees (the
    // older ones in flight still complete first).
    backend_.release_event(s.events.back().first);
    s.events.pop_back();
    --in_flight_;
  }
  s.events.emplace_back(backend_.record_event(s.id), s.seq);
  if (!s.sweeping) {
    s.sweeping = true;
    sweeping_.push_back(&s);
  }
  ++in_flight_;
  ++stats_.events_recorded;
}

void StreamSweeps::wait_all() {
  for (Stream* s : sweeping_) {
    for (auto& [event, seq] : s->events) backend_.wait_event(event);
  }
}

}  // namespace cuarena::detail
