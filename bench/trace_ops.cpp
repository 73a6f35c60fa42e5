#include "trace_ops.hpp"

#include <algorithm>
#include <unordered_map>

#include "cuarena/replay/replay_loop.hpp"

namespace cuarena::bench {

TraceOps compile_trace_ops(const std::vector<replay::Event>& events) {
  TraceOps out;
  struct Live {
    std::uint32_t slot, stream;
    std::uint64_t size;
  };
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
  // The replayer's loop (replay_loop.hpp) decides which frees happen.
  struct Hooks : replay::TraceHooks<Live> {
    TraceOps& out;
    std::unordered_map<std::uint64_t, std::uint32_t>& stream_index;
    decltype(take_slot)& take;
    decltype(emit_free)& emit;
    Live on_alloc(std::size_t, const replay::Event& e) {
      const auto [it, inserted] =
          stream_index.try_emplace(e.stream, static_cast<std::uint32_t>(stream_index.size()));
      if (inserted) out.stream_handles.push_back(e.stream);
      const Live b{take(), it->second, e.size};
      out.ops.push_back({true, b.slot, b.stream, b.size});
      return b;
    }
    void on_free(std::size_t, const replay::Event&, Live& b) { emit(b); }
    void on_end(const std::unordered_map<std::uint64_t, Live>& live) {
      std::vector<Live> leftovers;
      for (const auto& [addr, b] : live) leftovers.push_back(b);
      std::sort(leftovers.begin(), leftovers.end(),
                [](const Live& a, const Live& b) { return a.slot < b.slot; });  // deterministic
      for (const Live& b : leftovers) emit(b);
    }
  } hooks{{}, out, stream_index, take_slot, emit_free};
  replay::run_trace<Live>(events, hooks);
  return out;
}

}  // namespace cuarena::bench
