#include "cuarena/config.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

#include "cuarena/errors.hpp"
#include "cuarena/sim_backend.hpp"
#include "cuarena/types.hpp"

using namespace cuarena;

namespace {

// Parses as the replayer does: the core's keys and the simulator's.
std::pair<Config, SimConfig> parse_both(const std::string& text) {
  std::pair<Config, SimConfig> out;
  parse_config(text, {ConfigTarget(Config::table(), out.first),
                      ConfigTarget(SimConfig::table(), out.second)});
  return out;
}

std::string error_of(const std::string& text) {
  try {
    parse_both(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsMatchTheDesign) {
  const Config c;
  EXPECT_EQ(c.small_limit, 1 * MiB);
  EXPECT_GE(c.size_classes_per_doubling, 4u);
  EXPECT_EQ(c.upstream, Upstream::kVmm);
  EXPECT_EQ(c.slab_size, 1 * MiB);
  EXPECT_EQ(Config::parse(""), c);
}

TEST(Config, ParsesEveryKindOfValue) {
  const auto [c, sim] = parse_both(
      "small_limit:64KiB, size_classes_per_doubling:8,slab_size:4MiB,defrag_threshold:0.5,"
      "per_process_memory_fraction:0.25,upstream:async,sim_event_latency:3,sim_capacity:80GiB,"
      "sim_granularity:64KiB,va_reserve:1TiB,sweep_interval:7,stream_alias:False,cache_slack:0.05");
  EXPECT_EQ(c.small_limit, 64 * KiB);
  EXPECT_EQ(c.size_classes_per_doubling, 8u);
  EXPECT_EQ(c.slab_size, 4 * MiB);
  EXPECT_DOUBLE_EQ(c.defrag_threshold, 0.5);
  EXPECT_DOUBLE_EQ(c.per_process_memory_fraction, 0.25);
  EXPECT_EQ(c.upstream, Upstream::kAsync);
  EXPECT_EQ(sim.event_latency, 3u);
  EXPECT_EQ(sim.capacity, 80 * GiB);
  EXPECT_EQ(sim.granularity, 64 * KiB);
  EXPECT_EQ(c.va_reserve, std::size_t{1} << 40);
  EXPECT_EQ(c.sweep_interval, 7u);
  EXPECT_FALSE(c.stream_alias);
  EXPECT_DOUBLE_EQ(c.cache_slack, 0.05);
}

TEST(Config, RoundTripsThroughToString) {
  Config c = Config::parse("small_limit:4096,defrag_threshold:0.125,upstream:malloc");
  EXPECT_EQ(Config::parse(c.to_string()), c);
  c = Config::parse("cache_slack:0.1,small_limit:1536,whole_chunk_max:3GiB,stream_alias:False");
  EXPECT_EQ(Config::parse(c.to_string()), c);
  EXPECT_NE(c.to_string().find("cache_slack:0.1,"), std::string::npos) << c.to_string();
  const SimConfig sim = parse_both("sim_capacity:80GiB,sim_event_latency:9").second;
  EXPECT_EQ(parse_both(config_string(SimConfig::table(), sim)).second, sim);
}

// The simulator's keys belong to the replayer, not to the allocator.
TEST(Config, SimulatorKeysAreNotTheCores) {
  const std::string msg = [] {
    try {
      Config::parse("sim_capacity:80GiB");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(msg.find("unknown key 'sim_capacity' at position 0"), std::string::npos) << msg;
  for (const auto& key : Config::keys()) EXPECT_EQ(key.rfind("sim_", 0), std::string::npos) << key;
}

// Each row's default, as the table prints it, reads back as the default.
TEST(Config, TableDefaultsReadBack) {
  for (const auto& k : Config::table()) {
    Config c = Config::parse(k.key + ":" + k.get(Config{}));
    EXPECT_EQ(c, Config{}) << k.key;
  }
  EXPECT_EQ(Config{}.to_string().substr(0, 18), "small_limit:1MiB,s");
}

TEST(Config, UnknownKeyNamesKeyPositionAndValidKeys) {
  const std::string msg = error_of("small_limit:1MiB,bogus_key:3");
  EXPECT_NE(msg.find("'bogus_key'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position 17"), std::string::npos) << msg;
  for (const auto& key : Config::keys()) EXPECT_NE(msg.find(key), std::string::npos) << key;
  for (const auto& k : SimConfig::table()) EXPECT_NE(msg.find(k.key), std::string::npos) << k.key;
}

TEST(Config, MalformedValuesNameTheKey) {
  for (const char* bad :
       {"small_limit:-1", "small_limit:12XB", "small_limit:", "defrag_threshold:2",
        "defrag_threshold:abc", "per_process_memory_fraction:0", "size_classes_per_doubling:0",
        "upstream:cuda", "sim_granularity:3000", "sim_granularity:512", "sim_granularity:2KiB",
        "sim_granularity:2GiB", "sim_capacity:29TiB", "sim_capacity:1", "sim_capacity:63KiB",
        "va_reserve:65TiB", "sweep_interval:0", "stream_alias:maybe", "cache_slack:-1"}) {
    const std::string msg = error_of(bad);
    const std::string key = std::string(bad).substr(0, std::string(bad).find(':'));
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << bad << " -> " << msg;
    EXPECT_NE(msg.find("position 0"), std::string::npos) << msg;
  }
  // The message says what the key takes.
  EXPECT_NE(error_of("sim_granularity:3000").find("a power of two from 64KiB to 1GiB"),
            std::string::npos);
  EXPECT_NE(error_of("defrag_threshold:2").find("a number in [0, 1]"), std::string::npos);
  EXPECT_NE(error_of("small_limit:12XB").find("a size from 512 to 256MiB"), std::string::npos);
}

TEST(Config, SizesOutOfRangeAreRefused) {
  EXPECT_THROW(Config::parse("small_limit:4GiB,slab_size:4GiB"), ConfigError);
  EXPECT_THROW(Config::parse("slab_size:2GiB"), ConfigError);
  EXPECT_NO_THROW(Config::parse("small_limit:256MiB,slab_size:256MiB"));
}

TEST(Config, SyntaxErrors) {
  EXPECT_NE(error_of("small_limit").find("expected key:value"), std::string::npos);
  EXPECT_NE(error_of("small_limit:[1,2").find("unbalanced"), std::string::npos);
}

TEST(Config, ReadsEnvironment) {
  setenv("CUARENA_CONF", "small_limit:8KiB", 1);
  EXPECT_EQ(Config::from_env().small_limit, 8 * KiB);
  setenv("CUARENA_CONF", "nope:1", 1);
  EXPECT_THROW(Config::from_env(), ConfigError);
  unsetenv("CUARENA_CONF");
  EXPECT_EQ(Config::from_env(), Config{});
}

TEST(ParseSize, UnitsAndErrors) {
  EXPECT_EQ(parse_size("512", "x"), 512u);
  EXPECT_EQ(parse_size("80GiB", "x"), 80 * GiB);
  EXPECT_EQ(parse_size("512MiB", "x"), 512 * MiB);
  EXPECT_EQ(parse_size("1.5KiB", "x"), 1536u);
  EXPECT_EQ(parse_size("2 MiB", "x"), 2 * MiB);
  // SI units are powers of 1000, IEC units powers of 1024; ambiguous spellings are refused.
  EXPECT_EQ(parse_size("80GB", "x"), std::size_t{80'000'000'000});
  EXPECT_EQ(parse_size("1.5KB", "x"), 1500u);
  EXPECT_EQ(parse_size("2TB", "x"), std::size_t{2'000'000'000'000});
  EXPECT_EQ(parse_size("3B", "x"), 3u);
  for (const char* ambiguous : {"80G", "80gb", "2 mb", "1k", "4Gib", "1KIB"}) {
    try {
      parse_size(ambiguous, "--capacity");
      ADD_FAILURE() << ambiguous << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--capacity"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("powers of 1000"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_size("-5", "x"), ConfigError);
  EXPECT_THROW(parse_size("", "x"), ConfigError);
  EXPECT_THROW(parse_size("0.3B", "x"), ConfigError);
  EXPECT_THROW(parse_size("99999999999TiB", "x"), ConfigError);
  EXPECT_THROW(parse_size("5 parsecs", "x"), ConfigError);
}

TEST(FormatBytes, HumanUnits) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * MiB / 2), "1.50 MiB");
  EXPECT_EQ(format_bytes(80 * GiB), "80.00 GiB");
}

}  // namespace
