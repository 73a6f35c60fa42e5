// cuat::write: the .cuat writer the shim (CUARENA_TRACE) and `cuarena convert` use. A file is
// written under a name of its own beside the target and renamed whole; no file of the user's is
// taken on the way, and a failed write leaves the earlier file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cuarena/trace/reader.hpp"
#include "cuarena/trace/writer.hpp"

namespace fs = std::filesystem;
using namespace cuarena::cuat;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("cuat-writer-" + std::to_string(getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::vector<Event> events(std::size_t n) {
  std::vector<Event> ev(n);
  for (std::size_t i = 0; i < n; ++i) {
    ev[i].action = i % 2 ? Action::kFreeCompleted : Action::kAlloc;
    ev[i].addr = 0x1000 * (i / 2 + 1);
    ev[i].size = 4096;
  }
  return ev;
}

TEST(TraceWriter, WritesThroughANameOfItsOwnAndLeavesTheUsersFiles) {
  TempDir dir;
  const fs::path out = dir.path / "t.cuat";
  std::ofstream(dir.path / "t.cuat.partial") << "the user's own";  // a fixed temporary's name
  write(out.string(), events(10));
  EXPECT_EQ(read(out.string(), out.string()).size(), 10u);
  EXPECT_EQ(slurp(dir.path / "t.cuat.partial"), "the user's own");
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"t.cuat", "t.cuat.partial"}));
}

TEST(TraceWriter, AFailedWriteLeavesTheEarlierFileAndNoTemporary) {
  TempDir dir;
  const fs::path out = dir.path / "t.cuat";
  std::ofstream(out) << "earlier";
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &small);
  EXPECT_THROW(write(out.string(), events(10000)), WriteError);
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(slurp(out), "earlier");
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"t.cuat"}));
}

}  // namespace
