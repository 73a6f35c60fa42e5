// `cuarena replay --publish --pace`: a replay in progress shows on a monitor page, as
// `cuarena top` reads it, and the page goes when the replay ends.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuarena/monitor_publisher.hpp"
#include "cuarena/monitor_reader.hpp"
#include "cuarena/replay/trace.hpp"

extern char** environ;

using namespace cuarena;
using namespace cuarena::replay;

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// 600 events on `device`: 4 MiB allocations, each freed ten allocations later.
std::string write_trace(int device) {
  std::vector<Event> events;
  for (std::uint64_t i = 0; i < 300; ++i) {
    events.push_back({Action::kAlloc, std::uint16_t(device), 0, (i + 1) << 24, 4 * kMiB, 0});
    if (i >= 10)
      events.push_back(
          {Action::kFreeCompleted, std::uint16_t(device), 0, (i - 9) << 24, 4 * kMiB, 0});
  }
  const std::string path = testing::TempDir() + "publish_" + std::to_string(getpid()) + ".cuat";
  write_cuat(path, events);
  return path;
}

// Starts `cuarena replay ARGS...`, its output to `log`.
pid_t start_cli(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv_s = {CUARENA_CLI, "replay"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return err == 0 ? pid : -1;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

template <class Fn>
bool within_seconds(int seconds, Fn done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(ReplayPublish, AReplayInProgressShowsOnItsPageUntilItEnds) {
  const std::string trace = write_trace(1);
  const std::string log = trace + ".log";
  // 600 events x 3 ms: about two seconds of replay to watch.
  const pid_t pid = start_cli(
      {trace, "--allocator", "cuarena", "--capacity", "1GiB", "--publish", "--pace", "3000"}, log);
  ASSERT_GT(pid, 0);
  const std::string name = monitor::MonitorPublisher::page_name(geteuid(), pid, 1);
  std::optional<monitor::MonitorPage> page;
  const bool seen = within_seconds(20, [&] {
    page = monitor::read_page(name);
    return page && page->allocations > 0;
  });
  int status = 0;
  if (!seen) kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  ASSERT_TRUE(seen) << "no page " << name << " with allocations; output:\n" << slurp(log);
  EXPECT_EQ(std::memcmp(page->magic, monitor::kMonitorMagic, 8), 0);
  EXPECT_EQ(page->pid, pid);
  EXPECT_EQ(page->device, 1);
  EXPECT_EQ(page->kind, std::uint32_t(monitor::PageKind::kReplayer));
  EXPECT_STREQ(page->device_uuid, "");
  EXPECT_NE(std::string(page->command).find("--publish"), std::string::npos) << page->command;
  EXPECT_EQ(page->device_total_bytes, std::int64_t(1) << 30);
  EXPECT_EQ(page->limit_bytes, std::int64_t(1) << 30);
  EXPECT_GT(page->reserved_bytes, 0);
  EXPECT_LE(page->allocated_bytes, std::int64_t(11 * 4 * kMiB));
  EXPECT_GE(page->available_bytes, (std::int64_t(1) << 30) - page->reserved_bytes);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(log);
  EXPECT_FALSE(monitor::read_page(name)) << "the page outlived the replay";
  std::remove(trace.c_str());
  std::remove(log.c_str());
}

TEST(ReplayPublish, NeedsTheCuarenaSimRow) {
  const std::string trace = write_trace(0);
  const std::string log = trace + ".log";
  const pid_t pid = start_cli({trace, "--allocator", "recorded", "--publish"}, log);
  ASSERT_GT(pid, 0);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
  EXPECT_NE(slurp(log).find("--publish and --pace act on the cuarena sim row"), std::string::npos)
      << slurp(log);
  std::remove(trace.c_str());
  std::remove(log.c_str());
}

}  // namespace
