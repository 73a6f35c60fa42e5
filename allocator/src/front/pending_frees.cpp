#include "front/pending_frees.hpp"

#include <algorithm>

namespace cuarena::detail {

PendingFrees::~PendingFrees() {
  for (Entry& p : entries_) {
    for (EventId e : p.events) backend_.release_event(e);
  }
}

void PendingFrees::push(Entry&& e, const std::vector<StreamId>& streams) {
  e.unrecorded = streams;
  record(e);
  entries_.push_back(std::move(e));
}

bool PendingFrees::record(Entry& e) {
  std::erase_if(e.unrecorded, [&](StreamId s) {
    if (backend_.stream_capturing(s)) return false;
    e.events.push_back(backend_.record_event(s));
    ++recorded_;
    return true;
  });
  return e.unrecorded.empty();
}

std::size_t PendingFrees::backings() const {
  return std::size_t(
      std::count_if(entries_.begin(), entries_.end(), [](const Entry& p) { return p.backing; }));
}

}  // namespace cuarena::detail
