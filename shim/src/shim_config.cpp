#include "shim_config.hpp"

#include <cctype>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

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
  std::vector<std::pair<std::size_t, std::size_t>> starts;  // each item's start in rest, in conf
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
      const std::size_t bytes =
          parse_size(value, key + " (at position " + std::to_string(pos) + ")");
      if (bytes > kMaxDeviceBytes)
        throw ConfigError("cuarena config: " + key + " " + value + " is larger than any device");
      (key == "memory_limit" ? c.memory_limit : c.pending_free_bytes) = bytes;
    } else if (!item.empty()) {
      if (!rest.empty()) rest += ",";
      starts.emplace_back(rest.size(), pos);
      rest += item;
    }
    pos = end + 1;
  }
  try {
    c.core = Config::parse(rest);
  } catch (const ConfigError& e) {
    // The core counts positions in its part of the string: say them in the user's.
    std::string what = e.what();
    const std::string marker = "position ";
    if (const std::size_t at = what.find(marker); at != std::string::npos) {
      const std::size_t digits = at + marker.size();
      std::size_t end = digits;
      while (end < what.size() && std::isdigit(static_cast<unsigned char>(what[end]))) ++end;
      if (end > digits) {
        const std::size_t in_rest = std::stoul(what.substr(digits, end - digits));
        std::size_t in_conf = in_rest;
        for (const auto& [r, o] : starts)
          if (r <= in_rest) in_conf = o + (in_rest - r);
        what.replace(digits, end - digits, std::to_string(in_conf));
      }
    }
    throw ConfigError(what + "; the shim's own keys: memory_limit, pending_free_bytes");
  }
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
