// MonitorPublisher across fork() and exit(): a child leaves its parent's page alone, and a
// process that exits with a publisher alive removes its page. (Not run under ThreadSanitizer,
// which does not follow a child that starts threads after a multi-threaded fork.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "monitor_test_support.hpp"

namespace cuarena::monitor::test {
namespace {

// Runs `child` in a fork; returns its exit status (-1: killed, or still running after 10 s,
// e.g. joining a thread the child does not have).
template <class Fn>
int in_child(Fn child) {
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = fork();
  if (pid == 0) {
    child();
    std::_Exit(99);  // child() ends the process itself
  }
  int status = 0;
  if (!eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }) &&
      !eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; })) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(MonitorFork, AChildNeitherWritesNorRemovesItsParentsPage) {
  SimBackend sim(sim_options());
  Allocator alloc(sim);
  auto pub = std::make_unique<MonitorPublisher>(alloc, options(911));
  const std::string name = pub->page_name();
  ASSERT_TRUE(published(name));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int status = in_child([&] {
    pub.reset();  // the parent's: inert here
    // The child may publish a page of its own (its pid), removed by the exit handler.
    auto own = std::make_unique<MonitorPublisher>(alloc, options(911));
    if (!own->publishing() || !published(own->page_name())) std::_Exit(3);
    const pid_t me = getpid();
    if (write(fds[1], &me, sizeof me) != sizeof me) std::_Exit(4);
    // Never destroyed; held from a static so LeakSanitizer sees it reachable at exit.
    [[maybe_unused]] static MonitorPublisher* kept = nullptr;
    kept = own.release();
    std::exit(0);
  });
  EXPECT_EQ(status, 0);
  close(fds[1]);  // a child that failed before writing: read() returns 0, not blocks
  pid_t child = 0;
  const ssize_t got = read(fds[0], &child, sizeof child);
  close(fds[0]);
  ASSERT_EQ(got, ssize_t(sizeof child));
  EXPECT_FALSE(page_exists(MonitorPublisher::page_name(geteuid(), child, 911)));
  ASSERT_TRUE(page_exists(name));
  const std::optional<MonitorPage> page = read_page(name);
  ASSERT_TRUE(page);
  EXPECT_EQ(page->pid, getpid());
  EXPECT_TRUE(eventually([&] {
    const auto p = read_page(name);
    return p && p->seq > page->seq;  // the parent's thread still writes it
  }));
}

TEST(MonitorFork, APublisherStoppedAtExitIsDestroyedLaterWithoutHarm) {
  // A static owner destroyed after the exit handler ran (registered before the first publisher).
  const int status = in_child([] {
    static SimBackend sim(sim_options());
    static Allocator alloc(sim);
    static std::unique_ptr<MonitorPublisher> pub;
    pub = std::make_unique<MonitorPublisher>(alloc, options(913));
    if (!pub->publishing() || !published(pub->page_name())) std::_Exit(3);
    std::exit(0);
  });
  EXPECT_EQ(status, 0);
}

}  // namespace
}  // namespace cuarena::monitor::test
