#include "cuarena/replay/replay_loop.hpp"

namespace cuarena::replay {

std::vector<bool> deferred_frees(const std::vector<Event>& events) {
  std::vector<bool> deferred(events.size(), false);
  std::unordered_map<std::uint64_t, std::size_t> requested;  // address -> its free_requested
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.action == Action::kAlloc) {
      requested.erase(e.addr);  // allocated again before any free_completed
    } else if (e.action == Action::kFreeRequested) {
      requested[e.addr] = i;  // a later free_requested supersedes an earlier one
    } else if (e.action == Action::kFreeCompleted) {
      if (auto it = requested.find(e.addr); it != requested.end()) {
        if (i > it->second + 1) deferred[it->second] = true;
        requested.erase(it);
      }
    }
  }
  return deferred;
}

}  // namespace cuarena::replay
