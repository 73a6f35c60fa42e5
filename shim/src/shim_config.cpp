#include "shim_config.hpp"

#include <cstdlib>
#include <string_view>

#include "cuarena/errors.hpp"

namespace cuarena::shim {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
bool on(const std::string& v) { return !v.empty() && v != "0" && v != "False" && v != "false"; }
}  // namespace

ShimConfig ShimConfig::parse(const std::string& conf) {
  // The shim's keys are taken out; everything else goes to the core's parser, which names an
  // unknown key among the valid ones.
  ShimConfig c;
  std::string rest;
  std::size_t pos = 0;
  while (pos <= conf.size()) {
    std::size_t end = conf.find(',', pos);
    if (end == std::string::npos) end = conf.size();
    const std::string item = conf.substr(pos, end - pos);
    const std::size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    const std::string value = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (key == "memory_limit" || key == "pending_free_bytes") {
      if (colon == std::string::npos || value.empty())
        throw ConfigError("cuarena config: '" + key + "' needs a size (e.g. " + key +
                          ":16GiB), at position " + std::to_string(pos));
      const std::size_t bytes = parse_size(value, key);
      if (bytes > kMaxDeviceBytes)
        throw ConfigError("cuarena config: " + key + " " + value + " is larger than any device");
      (key == "memory_limit" ? c.memory_limit : c.pending_free_bytes) = bytes;
    } else if (!item.empty()) {
      rest += (rest.empty() ? "" : ",") + item;
    }
    pos = end + 1;
  }
  c.core = Config::parse(rest);
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
