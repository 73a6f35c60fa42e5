// README.md's Configuration table is generated from the config tables (`cuarena config
// --markdown`): this fails when they drift apart.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "cuarena/replay/replay.hpp"

namespace {

// The lines of README.md's table under "## Configuration": from its header row to the first line
// that is not a table row.
std::string readme_table() {
  std::ifstream in(CUARENA_README);
  std::string line, out;
  bool section = false, table = false;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) section = line == "## Configuration";
    if (!section) continue;
    if (line.rfind("| key |", 0) == 0) table = true;
    if (table) {
      if (line.empty() || line[0] != '|') break;
      out += line + "\n";
    }
  }
  return out;
}

TEST(ConfigDoc, ReadmeTableIsTheGeneratedOne) {
  const std::string readme = readme_table();
  ASSERT_FALSE(readme.empty()) << "no table under '## Configuration' in " << CUARENA_README;
  EXPECT_EQ(readme, cuarena::replay::config_markdown_table())
      << "README.md's Configuration table differs from the config tables: replace it with the "
         "output of 'build/bin/cuarena config --markdown'";
}

}  // namespace
