#include "shim_config.hpp"

#include <cstdlib>
#include <utility>

#include "cuarena/errors.hpp"

namespace cuarena::shim {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
bool on(const std::string& v) { return !v.empty() && v != "0" && v != "False" && v != "false"; }
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
  };
  return rows;
}

ShimConfig ShimConfig::parse(const std::string& conf) {
  // One string, two tables: the core's keys and the shim's (an unknown key lists both).
  ShimConfig c;
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
  const std::string log = env("CUARENA_LOG");
  if (on(log)) c.log_path = (log == "1" || log == "stderr") ? "-" : log;
  c.summary = on(env("CUARENA_SUMMARY"));
  c.trace_path = env("CUARENA_TRACE");
  c.keep_torch_cache = on(env("CUARENA_KEEP_TORCH_CACHE"));
  return c;
}

}  // namespace cuarena::shim
