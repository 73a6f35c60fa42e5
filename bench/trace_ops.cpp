#include "trace_ops.hpp"

#include <algorithm>
#include <unordered_map>

namespace cuarena::bench {

TraceOps compile_trace_ops(const std::vector<replay::Event>& events) {
  TraceOps out;
  struct Live {
    std::uint32_t slot, stream;
    std::uint64_t size;
  };
  std::unordered_map<std::uint64_t, Live> live;  // trace address -> block
  std::unordered_map<std::uint64_t, std::uint32_t> stream_index;
  std::vector<std::uint32_t> free_slots;
  auto take_slot = [&]() -> std::uint32_t {
    if (!free_slots.empty()) {
      const std::uint32_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return static_cast<std::uint32_t>(out.slots++);
  };
  auto emit_free = [&](const Live& b) {
    out.ops.push_back({false, b.slot, b.stream, b.size});
    free_slots.push_back(b.slot);
  };
  for (const replay::Event& e : events) {
    if (e.action == replay::Action::kAlloc) {
      if (auto old = live.find(e.addr); old != live.end()) {
        emit_free(old->second);
        live.erase(old);
      }
      const auto [it, inserted] =
          stream_index.try_emplace(e.stream, static_cast<std::uint32_t>(stream_index.size()));
      if (inserted) out.stream_handles.push_back(e.stream);
      const Live b{take_slot(), it->second, e.size};
      live.emplace(e.addr, b);
      out.ops.push_back({true, b.slot, b.stream, b.size});
    } else if (e.action == replay::Action::kFreeCompleted) {
      if (auto it = live.find(e.addr); it != live.end()) {
        emit_free(it->second);
        live.erase(it);
      }
    }
  }
  std::vector<Live> leftovers;
  for (const auto& [addr, b] : live) leftovers.push_back(b);
  std::sort(leftovers.begin(), leftovers.end(),
            [](const Live& a, const Live& b) { return a.slot < b.slot; });  // deterministic
  for (const Live& b : leftovers) emit_free(b);
  return out;
}

}  // namespace cuarena::bench
