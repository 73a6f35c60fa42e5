// The replayer's allocator registry (allocator_registry.hpp), the one table
// that --allocator's choices and help, the default rows and run_replay's dispatch read.
#include "cuarena/replay/allocator_registry.hpp"

#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cuarena/errors.hpp"

using namespace cuarena;
using namespace cuarena::replay;

namespace {

std::string message_of(const std::vector<std::string>& names, bool on_sim, bool on_cuda) {
  try {
    check_allocators(names, on_sim, on_cuda);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(AllocatorRegistry, EveryEntryHasANameADescriptionAndAReplay) {
  std::set<std::string> seen;
  for (const AllocatorEntry& e : allocator_registry()) {
    EXPECT_TRUE(seen.insert(e.name).second) << e.name << " twice";
    EXPECT_NE(std::string(e.description), "") << e.name;
    EXPECT_TRUE(e.trace || e.sim || e.cuda) << e.name << " replays nowhere";
    EXPECT_EQ(find_allocator(e.name), &e);
    EXPECT_NE(allocator_help().find(std::string(" ") + e.name + " ("), std::string::npos) << e.name;
  }
  EXPECT_EQ(allocator_names().size(), allocator_registry().size());
  EXPECT_EQ(find_allocator("nope"), nullptr);
}

TEST(AllocatorRegistry, DefaultRowsFollowTheBackends) {
  const std::vector<std::string> sim = {"recorded", "cuarena"};
  const std::vector<std::string> gpu = {
      "recorded",         "cuarena",     "cuarena-async", "cuarena-malloc", "torch-native",
      "torch-expandable", "torch-async", "cuda-malloc",   "cuda-async",     "cub",
      "rmm-pool",         "rmm-arena"};
  EXPECT_EQ(default_allocators(true, false), sim);
  EXPECT_EQ(default_allocators(false, true), gpu);
  EXPECT_EQ(default_allocators(true, true), gpu);  // the torch-*-sim models only when named
}

TEST(AllocatorRegistry, ANameNeedsABackendThatReplaysIt) {
  EXPECT_EQ(message_of({"recorded", "cuarena"}, true, false), "");
  EXPECT_EQ(message_of({"recorded", "cuarena", "cub"}, false, true), "");
  EXPECT_EQ(message_of({"torch-native-sim", "cub"}, true, true), "");
  EXPECT_EQ(message_of({"cuarena", "cub"}, true, false), "--allocator cub needs --backend cuda");
  EXPECT_EQ(message_of({"torch-expandable-sim"}, false, true),
            "--allocator torch-expandable-sim needs --backend sim");
  EXPECT_EQ(message_of({"nope"}, true, true), "--allocator nope: no such allocator");
}

TEST(AllocatorRegistry, RowsThisBuildCannotReplayOnTheGpu) {
  const std::vector<std::string> asked = {"cuarena", "rmm-pool", "cub", "rmm-arena"};
  const std::string why = rmm_rows_unavailable();
  std::ostringstream notes;
  const std::vector<std::string> kept = available_on_gpu(asked, false, notes);
  if (why.empty()) {  // a build with RMM keeps every row, silently
    EXPECT_EQ(kept, asked);
    EXPECT_EQ(notes.str(), "");
    return;
  }
  EXPECT_EQ(kept, (std::vector<std::string>{"cuarena", "cub"}));
  EXPECT_EQ(notes.str(), "cuarena replay: rmm-pool, rmm-arena: skipped: " + why + "\n");
  try {
    available_on_gpu(asked, true, notes);
    ADD_FAILURE() << "asking for an RMM row by name must be refused";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "--allocator rmm-pool: " + why);
  }
}
