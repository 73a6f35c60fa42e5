// Issue 12, item 5: the replayer's one trace loop (replay_loop.hpp), which the recorded,
// cuarena-on-the-simulator, torch-*-sim and GPU rows, peak_requested(), the series' requested
// bytes and the benchmarks' compile_trace_ops() share. Its rules on hand-made traces.
#include "cuarena/replay/replay_loop.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuarena/replay/trace.hpp"

using namespace cuarena::replay;

namespace {

Event ev(Action a, std::uint64_t addr, std::uint64_t size = 0) {
  return Event{a, 0, 1, addr, size, 0};
}

// Records which hook saw which event.
struct Log : TraceHooks<int> {
  std::vector<std::string> seen;
  int next = 1;
  bool free_early = false;  // on_free_requested frees the block
  std::size_t stop_after = ~std::size_t{0};
  int on_alloc(std::size_t i, const Event&) {
    seen.push_back("alloc@" + std::to_string(i));
    return next++;
  }
  void on_free(std::size_t i, const Event&, int& h) {
    seen.push_back("free" + std::to_string(h) + "@" + std::to_string(i));
  }
  bool on_free_requested(std::size_t i, const Event&, int& h) {
    seen.push_back("requested" + std::to_string(h) + "@" + std::to_string(i));
    return free_early;
  }
  void on_free_completed_early(std::size_t i, const Event&) {
    seen.push_back("early@" + std::to_string(i));
  }
  bool after(std::size_t i, const Event&) { return i != stop_after; }
  void on_end(std::unordered_map<std::uint64_t, int>& live) {
    seen.push_back("end:" + std::to_string(live.size()));
  }
};

}  // namespace

TEST(ReplayLoop, LostAndUnknownFrees) {
  const std::vector<Event> events = {
      ev(Action::kAlloc, 0x100, 8),       // 0: block 1
      ev(Action::kAlloc, 0x100, 16),      // 1: lost free of block 1, then block 2
      ev(Action::kFreeCompleted, 0x200),  // 2: never allocated: skipped
      ev(Action::kFreeCompleted, 0x100),  // 3: block 2
      ev(Action::kOther, 0),              // 4: skipped
      ev(Action::kAlloc, 0x300, 8),       // 5: block 3, live at the end
  };
  Log log;
  const TraceCounts c = run_trace<int>(events, log);
  EXPECT_EQ(c.allocs, 3u);
  EXPECT_EQ(c.frees, 1u);
  EXPECT_EQ(c.skipped, 3u);  // the lost free, the unknown free, the unknown action
  EXPECT_EQ(log.seen, (std::vector<std::string>{"alloc@0", "free1@1", "alloc@1", "free2@3",
                                                "alloc@5", "end:1"}));
  Log quiet;
  EXPECT_EQ(run_trace<int>(events, quiet, events.size(), {.lost_free_skipped = false}).skipped, 2u);
}

TEST(ReplayLoop, FreesAtFreeRequested) {
  const std::vector<Event> events = {
      ev(Action::kAlloc, 0x100, 8),       // 0
      ev(Action::kFreeRequested, 0x100),  // 1
      ev(Action::kFreeCompleted, 0x100),  // 2
      ev(Action::kFreeRequested, 0x400),  // 3: never allocated: ignored
  };
  Log stays;  // on_free_requested keeps the block: freed at free_completed
  TraceCounts c = run_trace<int>(events, stays);
  EXPECT_EQ(c.frees, 1u);
  EXPECT_EQ(stays.seen, (std::vector<std::string>{"alloc@0", "requested1@1", "free1@2", "end:0"}));
  Log early;
  early.free_early = true;
  c = run_trace<int>(events, early);
  EXPECT_EQ(c.frees, 1u);
  EXPECT_EQ(c.skipped, 0u);
  EXPECT_EQ(early.seen, (std::vector<std::string>{"alloc@0", "requested1@1", "early@2", "end:0"}));
}

// Every allocation becomes live, a failed one too (a row's empty handle): the job had the
// block, so its free is a free and a later alloc at its address a lost free, on every row.
TEST(ReplayLoop, EveryAllocationIsLive) {
  const std::vector<Event> events = {
      ev(Action::kAlloc, 0x100, 8),       // 0: block 1
      ev(Action::kAlloc, 0x200, 8),       // 1: block 2 (say the row's allocation failed)
      ev(Action::kFreeCompleted, 0x200),  // 2: its free: a free
      ev(Action::kAlloc, 0x200, 8),       // 3: block 3
      ev(Action::kAlloc, 0x100, 8),       // 4: lost free of block 1, then block 4
      ev(Action::kFreeCompleted, 0x100),  // 5: free of block 4
  };
  Log h;
  const TraceCounts c = run_trace<int>(events, h);
  EXPECT_EQ(c.allocs, 4u);
  EXPECT_EQ(c.frees, 2u);
  EXPECT_EQ(c.skipped, 1u);  // the lost free at 4
  EXPECT_EQ(h.seen, (std::vector<std::string>{"alloc@0", "alloc@1", "free2@2", "alloc@3", "free1@4",
                                              "alloc@4", "free4@5", "end:1"}));
}

TEST(ReplayLoop, StopsWhereTold) {
  const std::vector<Event> events = {ev(Action::kAlloc, 0x100, 8), ev(Action::kAlloc, 0x200, 8),
                                     ev(Action::kAlloc, 0x300, 8)};
  Log a;
  EXPECT_EQ(run_trace<int>(events, a, 2).allocs, 2u);  // events[0, 2)
  Log b;
  b.stop_after = 0;  // after() returns false at event 0
  EXPECT_EQ(run_trace<int>(events, b).allocs, 1u);
  EXPECT_EQ(b.seen, (std::vector<std::string>{"alloc@0", "end:1"}));
}

TEST(ReplayLoop, RequestedHooks) {
  const std::vector<Event> events = {ev(Action::kAlloc, 0x100, 8), ev(Action::kAlloc, 0x100, 16),
                                     ev(Action::kFreeCompleted, 0x200),
                                     ev(Action::kAlloc, 0x300, 4)};
  RequestedHooks h;
  run_trace<std::uint64_t>(events, h);
  EXPECT_EQ(h.current, 20u);  // the lost free dropped the first 8
}
