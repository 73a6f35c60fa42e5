#include "cuarena/config.hpp"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cuarena/errors.hpp"
#include "cuarena/types.hpp"
#include "tuning.hpp"

namespace cuarena {

namespace {

std::string trim_copy(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::string_view trim_view(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string valid_keys(const std::vector<ConfigTarget>& targets) {
  std::string out;
  for (const ConfigTarget& t : targets) {
    for (const std::string& k : t.keys) out += (out.empty() ? "" : ", ") + k;
  }
  return out;
}

// Splits `key:value,key:value`, where a value may be a bracketed list containing commas.
std::vector<ConfigItem> split_items(std::string_view text,
                                    const std::vector<ConfigTarget>& targets) {
  std::vector<ConfigItem> out;
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
      throw ConfigError("cuarena config: unbalanced '[' or ']' at position " + std::to_string(i) +
                        " in \"" + clip(text) + "\"");
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
                        std::to_string(start + lead) + ", got \"" + clip(item) +
                        "\"; valid keys: " + valid_keys(targets));
    }
    out.push_back({trim_view(item.substr(0, colon)), item.substr(colon + 1), start + lead});
  }
  return out;
}

}  // namespace

std::string ConfigItem::text() const { return trim_copy(value); }

void ConfigItem::bad(std::string_view expected) const {
  throw ConfigError("cuarena config: bad value \"" + clip(text()) + "\" for key '" + clip(key) +
                    "' at position " + std::to_string(position) + ": expected " +
                    std::string(expected));
}

void parse_config(std::string_view text, const std::vector<ConfigTarget>& targets) {
  for (const ConfigItem& item : split_items(text, targets)) {
    bool found = false;
    for (const ConfigTarget& t : targets) {
      if ((found = t.set(item))) break;
    }
    if (!found) {
      throw ConfigError("cuarena config: unknown key '" + clip(item.key) + "' at position " +
                        std::to_string(item.position) + "; valid keys: " + valid_keys(targets));
    }
  }
}

std::size_t read_size(const ConfigItem& item, std::size_t lo, std::size_t hi, bool pow2) {
  std::size_t n = 0;
  try {
    n = parse_size(item.text(), item.key);
  } catch (const ConfigError&) {
    item.bad(size_values(lo, hi, pow2) + " (bytes, or with a unit: 512KiB, 2MiB, 80GiB, 80GB)");
  }
  if (n < lo || n > hi || (pow2 && (n & (n - 1)) != 0)) item.bad(size_values(lo, hi, pow2));
  return n;
}

std::uint64_t read_uint(const ConfigItem& item, std::uint64_t lo, std::uint64_t hi) {
  const std::string v = item.text();
  char* end = nullptr;
  const bool digits = !v.empty() && std::isdigit(static_cast<unsigned char>(v[0]));
  errno = 0;
  const unsigned long long n = digits ? std::strtoull(v.c_str(), &end, 10) : 0;
  if (!digits || *end != '\0' || errno == ERANGE || n < lo || n > hi)
    item.bad("an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return n;
}

double read_real(const ConfigItem& item, double lo, double hi, bool lo_open) {
  const std::string v = item.text();
  char* end = nullptr;
  const double d = v.empty() ? NAN : std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(d) || d > hi || d < lo || (lo_open && d == lo)) {
    item.bad("a number in " + std::string(lo_open ? "(" : "[") + real_text(lo) + ", " +
             real_text(hi) + "]");
  }
  return d;
}

bool read_bool(const ConfigItem& item) {
  const std::string v = item.text();
  if (v == "True" || v == "true") return true;
  if (v == "False" || v == "false") return false;
  item.bad("True or False");
}

std::string size_text(std::size_t bytes) {
  static const std::pair<std::size_t, const char*> units[] = {
      {std::size_t{1} << 40, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}};
  for (const auto& [unit, name] : units) {
    if (bytes != 0 && bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

std::string real_text(double value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc{} ? std::string(buf, end) : std::to_string(value);
}

std::string size_values(std::size_t lo, std::size_t hi, bool pow2) {
  const std::string what = pow2 ? "a power of two" : "a size";
  if (hi == kNoSizeLimit) return lo == 0 ? what : what + " of at least " + size_text(lo);
  if (lo == 0) return what + " up to " + size_text(hi);
  return what + " from " + size_text(lo) + " to " + size_text(hi);
}

const ConfigTable<Config>& Config::table() {
  using C = Config;
  static const ConfigTable<Config> rows = {
      size_key("small_limit", &C::small_limit, kMinBlockSize, 256 * MiB,
               "requests up to this size come from size-class slabs"),
      uint_key("size_classes_per_doubling", &C::size_classes_per_doubling, 1, 64,
               "size classes per power of two (512 B multiples)"),
      size_key("slab_size", &C::slab_size, 0, 1 * GiB,
               "target bytes per slab (slabs share granules with their neighbours)"),
      real_key("defrag_threshold", &C::defrag_threshold, 0.0, 1.0, false,
               "fraction of the limit below which a miss takes new memory; above it, cached "
               "granules are reused first (0: always reuse first)"),
      real_key("cache_slack", &C::cache_slack, 0.0, 10.0, false,
               "cached memory allowed above the peak of allocated bytes before cached granules "
               "are moved instead of growing: trades memory for time (placing whole chunks, "
               "at least " +
                   std::to_string(int(detail::tuning::kWholeChunkCacheSlack * 100)) + "%)"),
      real_key("per_process_memory_fraction", &C::per_process_memory_fraction, 0.0, 1.0, true,
               "fraction of the device cuarena may hold"),
      bool_key("stream_alias", &C::stream_alias,
               "let a stream reuse its own freed granules at once by mapping them at the new "
               "address too"),
      bool_key("wait_before_grow", &C::wait_before_grow,
               "before creating memory while other streams hold freed blocks the device has not "
               "reached yet, wait for those frees on the host and try again"),
      bool_key("internal_dependencies", &C::internal_dependencies,
               "before creating memory while other streams hold freed blocks the device has not "
               "reached yet, take the best fit of those blocks, the requesting stream waiting on "
               "the device for its owner (no host wait), as cudaMallocAsync's internal "
               "dependencies"),
      size_key("stream_cache_bytes", &C::stream_cache_bytes, 0, kNoSizeLimit,
               "most bytes each stream's cache may hold: a free that finds the device lock taken "
               "by another thread parks its block there, and that stream's next allocation of "
               "the same size takes it without the lock (0: no caches; none under loop_plan, "
               "whose planner must see every free; peaks may under-read by at most this much "
               "per stream while threads contend)"),
      uint_key("sweep_interval", &C::sweep_interval, 1, std::uint64_t{1} << 20,
               "frees on a stream between checks of its sweep event"),
      size_key("va_reserve", &C::va_reserve, 0, 4 * kMaxDeviceBytes,
               "virtual bytes per arena (0: " + std::to_string(detail::tuning::kVaReserveFactor) +
                   "x the device)"),
      size_key("whole_chunk_min", &C::whole_chunk_min, 0, kNoSizeLimit,
               "0 (default): memory first, every 2 MiB granule its own driver allocation, "
               "moved singly wherever it is needed (least memory); otherwise fresh runs of at "
               "least this many bytes become whole chunks: one driver allocation each, moved "
               "only whole (fewer driver calls outside loop plans, more memory; see Results)"),
      size_key("whole_chunk_max", &C::whole_chunk_max, 0, kNoSizeLimit,
               "largest whole chunk (also at most 1/" +
                   std::to_string(detail::tuning::kWholeChunkReservedShare) +
                   " of the memory already reserved, when that is over " +
                   size_text(detail::tuning::kWholeChunkMinCap) +
                   "); longer runs are cut into equal chunks (0: only the 1/" +
                   std::to_string(detail::tuning::kWholeChunkReservedShare) + " rule)"),
      real_key("whole_chunk_fraction", &C::whole_chunk_fraction, 0.0, 1.0, false,
               "with whole chunks: when reserved memory is to pass this fraction of the limit, "
               "the pool turns memory first (as whole_chunk_min:0: single granules that can "
               "move, best fit over every block) until an empty_cache() leaves it below half "
               "that: fewer bytes for more driver calls; 1: never"),
      uint_key("dormant_maps", &C::dormant_maps, 0, 64,
               "old mappings a moved granule keeps (dormant), so its old address takes it back "
               "with no driver call; 0: unmap at once"),
      bool_key("loop_plan", &C::loop_plan,
               "learn a loop that repeats exactly and serve each of its requests at an offset "
               "planned for the whole iteration, in one range mapped as the loop first uses it: "
               "no driver calls from about the sixth iteration for what repeats exactly, at "
               "memory first's footprint; what the plan does not foresee is served as usual"),
      bool_key("plan_stream_waits", &C::plan_stream_waits,
               "under loop_plan, let a planned block reuse bytes another stream just freed by "
               "making its stream wait on the device for that free (no host wait), so plans pack "
               "several streams' blocks as tightly as one's; false: such blocks are planned apart "
               "and one the device has not reached is served by the pool"),
      choice_key("placement", &C::placement,
                 {{"unified", Placement::kUnified}, {"own_first", Placement::kOwnFirst}},
                 "where a large request goes: `unified` (one best fit over the stream's own "
                 "and the shared free blocks, a freed block absorbing the shared neighbours its "
                 "stream used last: less memory, steady across device lags) or `own_first` (the "
                 "stream's own blocks first: fewer instructions per call, more memory); memory "
                 "first always places unified"),
      choice_key(
          "upstream", &C::upstream,
          {{"vmm", Upstream::kVmm}, {"async", Upstream::kAsync}, {"malloc", Upstream::kMalloc}},
          "physical memory source: `vmm` (mapping, default), `async` (`cudaMallocAsync` "
          "segments from a private pool), `malloc` (`cudaMalloc` segments); the simulator "
          "models `async`/`malloc` as segments"),
  };
  return rows;
}

const std::vector<std::string>& Config::keys() {
  static const std::vector<std::string> names = ConfigTarget::key_names(table());
  return names;
}

Config Config::parse(std::string_view text) {
  Config c;
  parse_config(text, {ConfigTarget(table(), c)});
  return c;
}

Config Config::from_env() {
  const char* text = std::getenv("CUARENA_CONF");
  return text ? parse(text) : Config{};
}

std::string Config::to_string() const { return config_string(table(), *this); }

std::size_t parse_size(std::string_view text, std::string_view what) {
  const std::string v = trim_copy(text);
  auto fail = [&](const std::string& why) -> std::size_t {
    throw ConfigError("bad size \"" + clip(v) + "\" for " + clip(what) + ": " + why);
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
  static const std::vector<std::pair<std::string, double>> units = {{"", 1.0},
                                                                    {"B", 1.0},
                                                                    {"KB", 1e3},
                                                                    {"MB", 1e6},
                                                                    {"GB", 1e9},
                                                                    {"TB", 1e12},
                                                                    {"KiB", 1024.0},
                                                                    {"MiB", 1048576.0},
                                                                    {"GiB", 1073741824.0},
                                                                    {"TiB", 1099511627776.0}};
  double scale = 0;
  for (const auto& [name, factor] : units) {
    if (name == unit) scale = factor;
  }
  if (scale == 0)
    return fail("unknown unit \"" + clip(unit) +
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

std::string clip(std::string_view text, std::size_t max) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    // C1 controls (U+0080-U+009F) are two bytes in UTF-8; some terminals act on them too.
    const bool c1 = c == 0xC2 && i + 1 < text.size() &&
                    (static_cast<unsigned char>(text[i + 1]) & 0xE0) == 0x80;
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    } else if (c1) {
      const auto d = static_cast<unsigned char>(text[++i]);
      out += std::string("\\u00") + hex[d >> 4] + hex[d & 15];
    } else {
      // Cut before a UTF-8 sequence that would not fit whole.
      std::size_t n = 1;
      while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
      if (n > 1 && out.size() + n > max) break;
      out.append(text.substr(i, n));
      i += n - 1;
    }
  }
  if (i < text.size()) out += "\u2026 (" + std::to_string(text.size()) + " characters)";
  return out;
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
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace cuarena
