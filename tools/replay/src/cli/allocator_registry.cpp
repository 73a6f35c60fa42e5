#include "cuarena/replay/allocator_registry.hpp"

#include <algorithm>

#include "cuarena/errors.hpp"

namespace cuarena::replay {

const std::vector<AllocatorEntry>& allocator_registry() {
  static const std::vector<AllocatorEntry> table = {
      {"recorded",
       "the recording allocator's reserved bytes, rebuilt from the trace's segment "
       "events (none in RMM logs)",
       recorded_row},
      {"cuarena", "cuarena (on the GPU over the configured upstream)", nullptr, cuarena_sim_row,
       gpu_row},
      {"cuarena-async", "cuarena over upstream async", nullptr, nullptr, gpu_row},
      {"cuarena-malloc", "cuarena over upstream malloc", nullptr, nullptr, gpu_row},
      {"torch-native", "PyTorch's allocator, if built with it", nullptr, nullptr, torch_gpu_row},
      {"torch-expandable", "the same with expandable_segments:True", nullptr, nullptr,
       torch_gpu_row},
      {"torch-async", "the same with backend:cudaMallocAsync", nullptr, nullptr, torch_gpu_row},
      {"cuda-malloc", "cudaMalloc / cudaFree per block", nullptr, nullptr, gpu_row},
      {"cuda-async", "cudaMallocFromPoolAsync on a private pool", nullptr, nullptr, gpu_row},
      {"cub", "CUB's CachingDeviceAllocator", nullptr, nullptr, gpu_row},
      {"rmm-pool", "RMM's pool, if built with RMM", nullptr, nullptr, gpu_row, true,
       rmm_rows_unavailable},
      {"rmm-arena", "RMM's arena, if built with RMM", nullptr, nullptr, gpu_row, true,
       rmm_rows_unavailable},
      {"torch-native-sim", "a CPU model of PyTorch's allocator", nullptr, torch_sim_row, nullptr,
       false},
      {"torch-expandable-sim", "the same with expandable segments", nullptr, torch_sim_row, nullptr,
       false},
  };
  return table;
}

const AllocatorEntry* find_allocator(const std::string& name) {
  const auto& table = allocator_registry();
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const AllocatorEntry& e) { return name == e.name; });
  return it == table.end() ? nullptr : &*it;
}

std::vector<std::string> allocator_names() {
  std::vector<std::string> out;
  for (const AllocatorEntry& e : allocator_registry()) out.emplace_back(e.name);
  return out;
}

std::string allocator_help() {
  std::string out =
      "Allocators, each with its backends (default: every one that applies to "
      "--backend, but those marked 'when named'):";
  const char* sep = " ";
  for (const AllocatorEntry& e : allocator_registry()) {
    const char* where = e.trace           ? "any backend"
                        : e.sim && e.cuda ? "sim, cuda"
                        : e.sim           ? "sim"
                                          : "cuda";
    out += sep + std::string(e.name) + " (" + where + (e.by_default ? "" : ", when named") +
           "): " + e.description;
    sep = "; ";
  }
  return out;
}

std::vector<std::string> default_allocators(bool on_sim, bool on_cuda) {
  std::vector<std::string> out;
  for (const AllocatorEntry& e : allocator_registry())
    if (e.by_default && (e.trace || (e.sim && on_sim) || (e.cuda && on_cuda)))
      out.emplace_back(e.name);
  return out;
}

void check_allocators(const std::vector<std::string>& names, bool on_sim, bool on_cuda) {
  for (const std::string& name : names) {
    const AllocatorEntry* e = find_allocator(name);
    if (!e) throw ConfigError("--allocator " + name + ": no such allocator");
    if (e->trace || (e->sim && on_sim) || (e->cuda && on_cuda)) continue;
    throw ConfigError("--allocator " + name + " needs --backend " + (e->sim ? "sim" : "cuda"));
  }
}

std::vector<std::string> available_on_gpu(const std::vector<std::string>& names, bool asked_for,
                                          std::ostream& notes) {
  std::vector<std::string> kept;
  std::vector<std::pair<std::string, std::vector<std::string>>> dropped;  // why -> names
  for (const std::string& name : names) {
    const AllocatorEntry* e = find_allocator(name);
    const std::string why = e && e->unavailable ? e->unavailable() : "";
    if (why.empty()) {
      kept.push_back(name);
      continue;
    }
    if (asked_for) throw ConfigError("--allocator " + name + ": " + why);
    auto it =
        std::find_if(dropped.begin(), dropped.end(), [&](const auto& d) { return d.first == why; });
    if (it == dropped.end()) it = dropped.insert(dropped.end(), {why, {}});
    it->second.push_back(name);
  }
  for (const auto& [why, which] : dropped) {
    notes << "cuarena replay: " << which[0];
    for (std::size_t i = 1; i < which.size(); ++i) notes << ", " << which[i];
    notes << ": skipped: " << why << '\n';
  }
  return kept;
}

}  // namespace cuarena::replay
