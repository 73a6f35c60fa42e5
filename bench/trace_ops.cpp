#include "trace_ops.hpp"

#include <algorithm>
#include <unordered_map>

#include "cuarena/replay/replay_loop.hpp"

namespace cuarena::bench {

FlatTrace flatten_trace(const std::vector<replay::Event>& events) {
  FlatTrace out;
  struct Hooks : replay::TraceHooks<std::uint32_t> {
    FlatTrace& out;
    std::vector<FlatOp> allocs;  // by block: its alloc op
    std::uint32_t on_alloc(std::size_t, const replay::Event& e) {
      const std::uint32_t b = out.blocks++;
      allocs.push_back({true, b, e.stream, e.size});
      out.ops.push_back(allocs.back());
      return b;
    }
    void on_free(std::size_t, const replay::Event&, std::uint32_t& b) {
      out.ops.push_back({false, b, allocs[b].stream, allocs[b].size});
    }
    void on_end(const std::unordered_map<std::uint64_t, std::uint32_t>& live) {
      for (const auto& [addr, b] : live) out.live_at_end.push_back(b);
      std::sort(out.live_at_end.begin(), out.live_at_end.end());  // deterministic
    }
  } hooks{{}, out, {}};
  replay::run_trace<std::uint32_t>(events, hooks);
  return out;
}

TraceOps compile_trace_ops(const std::vector<replay::Event>& events) {
  const FlatTrace flat = flatten_trace(events);
  TraceOps out;
  std::vector<std::uint32_t> slot(flat.blocks), stream(flat.blocks);  // by block
  std::vector<std::uint64_t> size(flat.blocks);
  std::unordered_map<std::uint64_t, std::uint32_t> stream_index;
  std::vector<std::uint32_t> free_slots;
  auto emit_free = [&](std::uint32_t b) {
    out.ops.push_back({false, slot[b], stream[b], size[b]});
    free_slots.push_back(slot[b]);
  };
  for (const FlatOp& op : flat.ops) {
    if (!op.alloc) {
      emit_free(op.block);
      continue;
    }
    const auto [it, inserted] =
        stream_index.try_emplace(op.stream, static_cast<std::uint32_t>(stream_index.size()));
    if (inserted) out.stream_handles.push_back(op.stream);
    if (!free_slots.empty()) {
      slot[op.block] = free_slots.back();
      free_slots.pop_back();
    } else {
      slot[op.block] = static_cast<std::uint32_t>(out.slots++);
    }
    stream[op.block] = it->second;
    size[op.block] = op.size;
    out.ops.push_back({true, slot[op.block], stream[op.block], op.size});
  }
  std::vector<std::uint32_t> leftovers = flat.live_at_end;
  std::sort(leftovers.begin(), leftovers.end(),
            [&](std::uint32_t a, std::uint32_t b) { return slot[a] < slot[b]; });  // deterministic
  for (std::uint32_t b : leftovers) emit_free(b);
  return out;
}

}  // namespace cuarena::bench
