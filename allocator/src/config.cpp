#include "cuarena/config.hpp"
#include "cuarena/types.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>

#include "cuarena/errors.hpp"

namespace cuarena {

namespace {

struct Entry {
  std::string_view key;
  std::string_view value;
  std::size_t position;  // of the key, 0-based
};

std::string trim_copy(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// A piece of the config text as a message quotes it: at most 200 characters, then "…" and the
// length, so a huge value (a pasted file, a runaway script) leaves a one-line message.
std::string quoted(std::string_view s) {
  if (s.size() <= 200) return std::string(s);
  return std::string(s.substr(0, 200)) + "\u2026 (" + std::to_string(s.size()) + " characters)";
}

std::string valid_keys() {
  std::string out;
  for (const auto& k : Config::keys()) out += (out.empty() ? "" : ", ") + k;
  return out;
}

// Splits `key:value,key:value`, where a value may be a bracketed list containing commas.
std::vector<Entry> split_entries(std::string_view text) {
  std::vector<Entry> out;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    int depth = 0;
    while (i < text.size() && (text[i] != ',' || depth > 0)) {
      if (text[i] == '[') ++depth;
      if (text[i] == ']' && --depth < 0) break;
      ++i;
    }
    if (depth != 0) {
      throw ConfigError("cuarena config: unbalanced '[' or ']' at position " +
                        std::to_string(i) + " in \"" + quoted(text) + "\"");
    }
    std::string_view item = text.substr(start, i - start);
    if (i < text.size()) ++i;  // the comma
    std::size_t lead = 0;
    while (lead < item.size() && std::isspace(static_cast<unsigned char>(item[lead]))) ++lead;
    item.remove_prefix(lead);
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      throw ConfigError("cuarena config: expected key:value at position " +
                        std::to_string(start + lead) + ", got \"" + quoted(item) +
                        "\"; valid keys: " + valid_keys());
    }
    out.push_back({item.substr(0, colon), item.substr(colon + 1), start + lead});
  }
  return out;
}

[[noreturn]] void bad_value(const Entry& e, std::string_view expected) {
  throw ConfigError("cuarena config: bad value \"" + quoted(trim_copy(e.value)) + "\" for key '" +
                    quoted(trim_copy(e.key)) + "' at position " + std::to_string(e.position) +
                    ": expected " + std::string(expected));
}

double parse_double(const Entry& e, double lo, double hi, bool lo_open) {
  const std::string v = trim_copy(e.value);
  char* end = nullptr;
  const double d = v.empty() ? NAN : std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(d) || d > hi || d < lo || (lo_open && d == lo)) {
    std::ostringstream want;
    want << "a number in " << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
    bad_value(e, want.str());
  }
  return d;
}

std::uint64_t parse_uint(const Entry& e, std::uint64_t lo, std::uint64_t hi) {
  const std::string v = trim_copy(e.value);
  char* end = nullptr;
  const bool digits = !v.empty() && std::isdigit(static_cast<unsigned char>(v[0]));
  const unsigned long long n = digits ? std::strtoull(v.c_str(), &end, 10) : 0;
  if (!digits || *end != '\0' || n < lo || n > hi) {
    bad_value(e, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return n;
}

std::size_t parse_size_entry(const Entry& e) {
  try {
    return parse_size(trim_copy(e.value), trim_copy(e.key));
  } catch (const ConfigError&) {
    bad_value(e, "a size in bytes such as 1048576, 512KiB, 2MiB or 80GiB");
  }
}

using Setter = std::function<void(Config&, const Entry&)>;

const std::vector<std::pair<std::string, Setter>>& setters() {
  static const std::vector<std::pair<std::string, Setter>> table = {
      {"small_limit", [](Config& c, const Entry& e) { c.small_limit = parse_size_entry(e); }},
      {"size_classes_per_doubling",
       [](Config& c, const Entry& e) { c.size_classes_per_doubling = unsigned(parse_uint(e, 1, 64)); }},
      {"slab_size", [](Config& c, const Entry& e) { c.slab_size = parse_size_entry(e); }},
      {"defrag_threshold",
       [](Config& c, const Entry& e) { c.defrag_threshold = parse_double(e, 0.0, 1.0, false); }},
      {"cache_slack",
       [](Config& c, const Entry& e) { c.cache_slack = parse_double(e, 0.0, 10.0, false); }},
      {"whole_chunk_min", [](Config& c, const Entry& e) { c.whole_chunk_min = parse_size_entry(e); }},
      {"whole_chunk_max", [](Config& c, const Entry& e) { c.whole_chunk_max = parse_size_entry(e); }},
      {"whole_chunk_fraction",
       [](Config& c, const Entry& e) { c.whole_chunk_fraction = parse_double(e, 0.0, 1.0, false); }},
      {"dormant_maps",
       [](Config& c, const Entry& e) { c.dormant_maps = unsigned(parse_uint(e, 0, 64)); }},
      {"per_process_memory_fraction",
       [](Config& c, const Entry& e) {
         c.per_process_memory_fraction = parse_double(e, 0.0, 1.0, true);
       }},
      {"stream_alias",
       [](Config& c, const Entry& e) {
         const std::string v = trim_copy(e.value);
         if (v == "True" || v == "true") c.stream_alias = true;
         else if (v == "False" || v == "false") c.stream_alias = false;
         else bad_value(e, "True or False");
       }},
      {"stream_cache_bytes",
       [](Config& c, const Entry& e) { c.stream_cache_bytes = parse_size_entry(e); }},
      {"sweep_interval",
       [](Config& c, const Entry& e) { c.sweep_interval = std::uint32_t(parse_uint(e, 1, 1u << 20)); }},
      {"va_reserve",
       [](Config& c, const Entry& e) {
         c.va_reserve = parse_size_entry(e);
         if (c.va_reserve > 4 * kMaxDeviceBytes) bad_value(e, "at most 64TiB of address space");
       }},
      {"upstream",
       [](Config& c, const Entry& e) {
         const std::string v = trim_copy(e.value);
         if (v == "vmm") c.upstream = Upstream::kVmm;
         else if (v == "async") c.upstream = Upstream::kAsync;
         else if (v == "malloc") c.upstream = Upstream::kMalloc;
         else bad_value(e, "one of vmm, async, malloc");
       }},
      {"sim_event_latency",
       [](Config& c, const Entry& e) { c.sim_event_latency = parse_uint(e, 0, 1u << 30); }},
      {"sim_capacity",
       [](Config& c, const Entry& e) {
         c.sim_capacity = parse_size_entry(e);
         if (c.sim_capacity > kMaxDeviceBytes) bad_value(e, "a device size of at most 16TiB");
       }},
      {"sim_granularity",
       [](Config& c, const Entry& e) {
         // Devices map in granules of 64 KiB (older GPUs) to 2 MiB; smaller ones would make the
         // simulator's per-granule tables huge for nothing.
         const std::size_t g = parse_size_entry(e);
         if (g < 64 * KiB || g > 1 * GiB || (g & (g - 1)) != 0)
           bad_value(e, "a power of two from 64KiB to 1GiB");
         c.sim_granularity = g;
       }},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& Config::keys() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, setter] : setters()) out.push_back(name);
    return out;
  }();
  return names;
}

Config Config::parse(std::string_view text) {
  Config c;
  for (const Entry& e : split_entries(text)) {
    const std::string key = trim_copy(e.key);
    bool found = false;
    for (const auto& [name, setter] : setters()) {
      if (name == key) {
        setter(c, e);
        found = true;
        break;
      }
    }
    if (!found) {
      throw ConfigError("cuarena config: unknown key '" + quoted(key) + "' at position " +
                        std::to_string(e.position) + "; valid keys: " + valid_keys());
    }
  }
  if (c.small_limit < 512 || c.small_limit > (std::size_t{256} << 20)) {
    throw ConfigError("cuarena config: small_limit must be between 512 bytes and 256 MiB");
  }
  if (c.slab_size > (std::size_t{1} << 30)) {
    throw ConfigError("cuarena config: slab_size must be at most 1 GiB");
  }
  return c;
}

Config Config::from_env() {
  const char* text = std::getenv("CUARENA_CONF");
  return text ? parse(text) : Config{};
}

std::string Config::to_string() const {
  std::ostringstream out;
  out.precision(17);
  out << "small_limit:" << small_limit << ",size_classes_per_doubling:" << size_classes_per_doubling
      << ",slab_size:" << slab_size << ",defrag_threshold:" << defrag_threshold
      << ",cache_slack:" << cache_slack << ",whole_chunk_min:" << whole_chunk_min
      << ",whole_chunk_max:" << whole_chunk_max << ",whole_chunk_fraction:" << whole_chunk_fraction
      << ",dormant_maps:" << dormant_maps
      << ",per_process_memory_fraction:" << per_process_memory_fraction
      << ",stream_alias:" << (stream_alias ? "True" : "False")
      << ",stream_cache_bytes:" << stream_cache_bytes
      << ",sweep_interval:" << sweep_interval << ",va_reserve:" << va_reserve << ",upstream:" << cuarena::to_string(upstream)
      << ",sim_event_latency:" << sim_event_latency << ",sim_capacity:" << sim_capacity
      << ",sim_granularity:" << sim_granularity;
  return out.str();
}

std::size_t parse_size(std::string_view text, std::string_view what) {
  const std::string v = trim_copy(text);
  auto fail = [&](const std::string& why) -> std::size_t {
    throw ConfigError("bad size \"" + quoted(v) + "\" for " + quoted(what) + ": " + why);
  };
  if (v.empty()) return fail("empty");
  if (v[0] == '-') return fail("negative");
  std::size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) ++i;
  if (i == 0) return fail("expected a number");
  const std::string number = v.substr(0, i);
  const std::string unit = trim_copy(std::string_view(v).substr(i));
  // SI units are powers of 1000 (80GB = 80e9 bytes), IEC units powers of 1024 (80GiB = 80 *
  // 2^30), as storage vendors and nvidia-smi use them; anything else is refused rather than
  // guessed (a lower-case or one-letter unit is ambiguous).
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1.0},     {"B", 1.0},      {"KB", 1e3},           {"MB", 1e6},
      {"GB", 1e9},   {"TB", 1e12},    {"KiB", 1024.0},       {"MiB", 1048576.0},
      {"GiB", 1073741824.0},          {"TiB", 1099511627776.0}};
  double scale = 0;
  for (const auto& [name, factor] : units) {
    if (name == unit) scale = factor;
  }
  if (scale == 0)
    return fail("unknown unit \"" + quoted(unit) +
                "\": use bytes, or B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB "
                "(powers of 1024), e.g. 80GB or 80GiB");
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (*end != '\0') return fail("expected a number");
  const double bytes = value * scale;
  if (!(bytes < 1.8e19)) return fail("too large");
  if (bytes != std::floor(bytes)) return fail("not a whole number of bytes");
  return static_cast<std::size_t>(bytes);
}

std::string format_bytes(std::size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace cuarena
