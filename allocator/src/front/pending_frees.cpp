#include "front/pending_frees.hpp"

#include <algorithm>

namespace cuarena::detail {

PendingFrees::~PendingFrees() {
  for (Entry& p : entries_) {
    for (EventId e : p.events) backend_.release_event(e);
  }
}

std::size_t PendingFrees::backings() const {
  return std::size_t(
      std::count_if(entries_.begin(), entries_.end(), [](const Entry& p) { return p.backing; }));
}

}  // namespace cuarena::detail
