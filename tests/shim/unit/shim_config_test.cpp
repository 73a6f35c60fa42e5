// The shim's settings (shim/src/shim_config.cpp): its own CUARENA_CONF keys, the core's, and the
// environment variables, without loading the shim.
#include "shim_config.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuarena/errors.hpp"

using cuarena::ConfigError;
using cuarena::shim::ShimConfig;

TEST(ShimConfig, DefaultsWhenEmpty) {
  const ShimConfig c = ShimConfig::parse("");
  EXPECT_EQ(c.memory_limit, 0u);
  EXPECT_EQ(c.pending_free_bytes, std::size_t{1} << 30);
  EXPECT_EQ(c.snug_factor, 4u);
  cuarena::Config core;
  // The shim's own defaults (tests/shim/churn_target_test.py replays with them).
  core.wait_before_grow = true;
  core.internal_dependencies = false;
  core.whole_chunk_max = std::size_t{32} << 20;
  core.whole_chunk_min = std::size_t{4} << 20;
  core.loop_plan = false;
  EXPECT_EQ(c.core, core);
  EXPECT_TRUE(ShimConfig::parse("loop_plan:True").core.loop_plan);
  EXPECT_FALSE(ShimConfig::parse("wait_before_grow:False").core.wait_before_grow);
  EXPECT_TRUE(ShimConfig::parse("internal_dependencies:True").core.internal_dependencies);
  EXPECT_EQ(ShimConfig::parse("whole_chunk_max:128MiB").core.whole_chunk_max,
            std::size_t{128} << 20);
}

TEST(ShimConfig, ShimKeysAreTakenOutAndTheRestGoesToTheCore) {
  const ShimConfig c = ShimConfig::parse(
      "whole_chunk_min:0,memory_limit:40GiB,pending_free_bytes:1GiB,dormant_maps:2");
  EXPECT_EQ(c.memory_limit, std::size_t{40} << 30);
  EXPECT_EQ(c.pending_free_bytes, std::size_t{1} << 30);
  EXPECT_EQ(c.core.whole_chunk_min, 0u);
  EXPECT_EQ(c.core.dormant_maps, 2u);
  EXPECT_EQ(ShimConfig::parse("memory_limit:80GB").memory_limit, std::size_t{80'000'000'000});
  EXPECT_EQ(ShimConfig::parse(" snug_factor : 8 ").snug_factor, 8u);
  EXPECT_EQ(ShimConfig::parse("snug_factor:0").snug_factor, 0u);
  EXPECT_TRUE(ShimConfig().serve_shareable);
  EXPECT_FALSE(ShimConfig::parse(" serve_shareable : False").serve_shareable);
}

TEST(ShimConfig, BadInputNamesTheKey) {
  auto message = [](const char* conf) {
    try {
      ShimConfig::parse(conf);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message("bogus_key:1").find("bogus_key"), std::string::npos);
  EXPECT_NE(message("bogus_key:1").find("memory_limit, pending_free_bytes"), std::string::npos)
      << "an unknown key's message lists the shim's keys too";
  EXPECT_NE(message("dormant_maps:1,memory_limit:lots").find("position 15"), std::string::npos);
  // The core's position, counted in the user's string (the shim's key before it taken out).
  EXPECT_NE(message("memory_limit:1GiB,bogus:1").find("at position 18"), std::string::npos)
      << message("memory_limit:1GiB,bogus:1");
  EXPECT_NE(message("memory_limit").find("memory_limit"), std::string::npos);
  EXPECT_NE(message("memory_limit:").find("memory_limit"), std::string::npos);
  EXPECT_NE(message("memory_limit:12zz").find("memory_limit"), std::string::npos);
  EXPECT_NE(message("snug_factor:2000").find("snug_factor"), std::string::npos);
  EXPECT_NE(message("pending_free_bytes:64TiB").find("larger than any device"), std::string::npos);
  EXPECT_NE(message("memory_limit:1GiB,whole_chunk_min:x").find("whole_chunk_min"),
            std::string::npos);
}

TEST(ShimConfig, EnvironmentVariables) {
  setenv("CUARENA_CONF", "memory_limit:1GiB", 1);
  setenv("CUARENA_LOG", "1", 1);
  setenv("CUARENA_SUMMARY", "0", 1);
  setenv("CUARENA_TRACE", "/tmp/t.cuat", 1);
  setenv("CUARENA_KEEP_TORCH_CACHE", "1", 1);
  ShimConfig c = ShimConfig::from_env();
  EXPECT_EQ(c.memory_limit, std::size_t{1} << 30);
  EXPECT_EQ(c.log_path, "-");
  EXPECT_FALSE(c.summary);
  EXPECT_EQ(c.trace_path, "/tmp/t.cuat");
  EXPECT_TRUE(c.keep_torch_cache);
  setenv("CUARENA_LOG", "/tmp/shim.log", 1);
  setenv("CUARENA_SUMMARY", "1", 1);
  c = ShimConfig::from_env();
  EXPECT_EQ(c.log_path, "/tmp/shim.log");
  EXPECT_TRUE(c.summary);
  setenv("CUARENA_CONF", "nope:1", 1);
  try {
    ShimConfig::from_env();
    ADD_FAILURE() << "a bad CUARENA_CONF was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("CUARENA_CONF: ", 0), 0u) << e.what();
  }
  for (const char* v : {"CUARENA_CONF", "CUARENA_LOG", "CUARENA_SUMMARY", "CUARENA_TRACE",
                        "CUARENA_KEEP_TORCH_CACHE"})
    unsetenv(v);
}

TEST(ShimConfig, WhitespaceAroundKeysAndValuesAsTheCoresParserAllows) {
  const ShimConfig c = ShimConfig::parse(" memory_limit : 1GiB , dormant_maps : 2 ");
  EXPECT_EQ(c.memory_limit, std::size_t{1} << 30);
  EXPECT_EQ(c.core.dormant_maps, 2u);
  EXPECT_EQ(ShimConfig::parse("pending_free_bytes :\t2MiB").pending_free_bytes,
            std::size_t{2} << 20);
}

// A switch reads as the Python package's: off words turn it off, on words on; CUARENA_LOG's
// other values are a path.
TEST(ShimConfig, SwitchesReadOffAndOnWords) {
  for (const char* off : {"0", "off", "no", "false", "False", "OFF", " no "}) {
    setenv("CUARENA_LOG", off, 1);
    setenv("CUARENA_SUMMARY", off, 1);
    const ShimConfig c = ShimConfig::from_env();
    EXPECT_EQ(c.log_path, "") << off;
    EXPECT_FALSE(c.summary) << off;
  }
  for (const char* on : {"1", "on", "yes", "true", "True", "stderr"}) {
    setenv("CUARENA_LOG", on, 1);
    setenv("CUARENA_SUMMARY", on == std::string("stderr") ? "1" : on, 1);
    const ShimConfig c = ShimConfig::from_env();
    EXPECT_EQ(c.log_path, "-") << on;
    EXPECT_TRUE(c.summary) << on;
  }
  setenv("CUARENA_SUMMARY", "maybe", 1);
  EXPECT_THROW(ShimConfig::from_env(), ConfigError);
  unsetenv("CUARENA_LOG");
  unsetenv("CUARENA_SUMMARY");
}

TEST(ShimConfig, TheShimsKeysAreATableOverTheCoresParser) {
  ASSERT_EQ(cuarena::ConfigTarget::key_names(ShimConfig::table()),
            (std::vector<std::string>{"memory_limit", "pending_free_bytes", "snug_factor",
                                      "serve_shareable"}));
  ShimConfig c;
  c.memory_limit = std::size_t{3} << 30;
  c.pending_free_bytes = std::size_t{2} << 20;
  const std::string text = cuarena::config_string(ShimConfig::table(), c);
  EXPECT_EQ(text, "memory_limit:3GiB,pending_free_bytes:2MiB,snug_factor:4,serve_shareable:True");
  const ShimConfig back = ShimConfig::parse(text);
  EXPECT_EQ(back.memory_limit, c.memory_limit);
  EXPECT_EQ(back.pending_free_bytes, c.pending_free_bytes);
  try {
    ShimConfig::parse("dormant_maps:1,pending_free_bytes:64TiB");
    ADD_FAILURE() << "a size larger than any device was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pending_free_bytes 64TiB at position 15"),
              std::string::npos)
        << e.what();
  }
}
