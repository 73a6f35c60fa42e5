#include "shim_config.hpp"

#include <cctype>
#include <cstdlib>
#include <optional>
#include <utility>

#include "cuarena/errors.hpp"

namespace cuarena::shim {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The switch words, as the Python package reads CUARENA (cuarena/_conf.py): case and
// surrounding whitespace ignored; nullopt for any other word.
std::optional<bool> switch_word(const std::string& text) {
  const auto b = text.find_first_not_of(" \t"), e = text.find_last_not_of(" \t");
  std::string w = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  for (char& ch : w) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* off : {"", "0", "false", "no", "off"})
    if (w == off) return false;
  for (const char* on : {"1", "true", "yes", "on"})
    if (w == on) return true;
  return std::nullopt;
}

// A variable that is only a switch: another word is an error naming it (the job has not
// started, so stopping loses nothing).
bool switch_env(const char* name) {
  const std::string v = env(name);
  if (const auto w = switch_word(v)) return *w;
  throw ConfigError(std::string(name) + "=" + clip(v) +
                    ": expected 1, true, yes or on, or 0, false, no or off");
}
}  // namespace

namespace {
// A size up to the largest device; more is refused as a mistake rather than read as "no limit".
ConfigKey<ShimConfig> device_size_key(std::string key, std::size_t ShimConfig::*member,
                                      std::string doc) {
  return {key, "a size up to " + size_text(kMaxDeviceBytes), std::move(doc),
          [key, member](ShimConfig& c, const ConfigItem& item) {
            const std::size_t bytes = read_size(item, 0, kNoSizeLimit);
            if (bytes > kMaxDeviceBytes)
              throw ConfigError("cuarena config: " + key + " " + item.text() + " at position " +
                                std::to_string(item.position) + " is larger than any device");
            c.*member = bytes;
          },
          [member](const ShimConfig& c) { return size_text(c.*member); }};
}
}  // namespace

const ConfigTable<ShimConfig>& ShimConfig::table() {
  static const ConfigTable<ShimConfig> rows = {
      device_size_key("memory_limit", &ShimConfig::memory_limit,
                      "most physical memory held per device (0: the whole device)"),
      device_size_key("pending_free_bytes", &ShimConfig::pending_free_bytes,
                      "freed bytes that may wait for the device before an allocation waits for "
                      "them"),
      uint_key("snug_factor", &ShimConfig::snug_factor, 0, 1024,
               "while frees are held, a cached block more than this many times a request is "
               "split for it only if no held block fits within that (0: any cached block)"),
      bool_key("serve_shareable", &ShimConfig::serve_shareable,
               "cuMemCreate asking for a POSIX file-descriptor handle (XLA asks on every "
               "buffer) is served unless NCCL or NVSHMEM asks; exporting it then fails "
               "(False: such memory stays the driver's)"),
  };
  return rows;
}

ShimConfig ShimConfig::parse(const std::string& conf) {
  // One string, two tables: the core's keys and the shim's (an unknown key lists both).
  ShimConfig c;
  // The programs the shim serves free on several streams far ahead of the device (cudaFreeAsync
  // on worker streams); their memory waits for those frees rather than grow by them.
  c.core.wait_before_grow = true;
  // Host waits, not device ones: on the churn trace the latter order busy streams behind each
  // other (1.59 alone, 1.096 with host waits beside, against 1.072 with host waits only).
  c.core.internal_dependencies = false;
  // Nor do they keep one size for long (no framework cache above cuarena): whole chunks of
  // 128 MiB strand more of the memory under such mixes (the churn trace, tests/data/traces/shim:
  // 1.155 at 128 MiB, 1.082 at 32 MiB), at a few more map calls a training step.
  c.core.whole_chunk_max = std::size_t{32} << 20;
  // Whole chunks and no loop plan, unlike the core's default (memory first under a loop plan):
  // the shim's figures (shim/README.md) were measured so, and every tensor of a PyTorch job under
  // the shim is a cudaMalloc, where memory first's per-granule driver calls were not measured.
  c.core.whole_chunk_min = std::size_t{4} << 20;
  c.core.loop_plan = false;
  parse_config(conf, {ConfigTarget(Config::table(), c.core), ConfigTarget(table(), c)});
  return c;
}

ShimConfig ShimConfig::from_env() {
  ShimConfig c;
  try {
    c = parse(env("CUARENA_CONF"));
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("CUARENA_CONF: ") + e.what());
  }
  // CUARENA_LOG: a switch word, "stderr" (or "-"), or a path; off writes no file named "off".
  const std::string log = env("CUARENA_LOG");
  const auto w = switch_word(log);
  const bool to_stderr = w ? *w : log == "stderr" || log == "-";
  c.log_path = to_stderr ? std::string("-") : w ? std::string() : log;
  c.summary = switch_env("CUARENA_SUMMARY");
  c.trace_path = env("CUARENA_TRACE");
  c.keep_torch_cache = switch_env("CUARENA_KEEP_TORCH_CACHE");
  return c;
}

}  // namespace cuarena::shim
