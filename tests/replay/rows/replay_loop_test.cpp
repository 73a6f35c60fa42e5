// The replayer's one trace loop (replay_loop.hpp), which the recorded,
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
  std::size_t stop_after = ~std::size_t{0};
  int on_alloc(std::size_t i, const Event&) {
    seen.push_back("alloc@" + std::to_string(i));
    return next++;
  }
  void on_free(std::size_t i, const Event&, int& h) {
    seen.push_back("free" + std::to_string(h) + "@" + std::to_string(i));
  }
  void on_free_requested(std::size_t i, const Event&, int& h) {
    seen.push_back("requested" + std::to_string(h) + "@" + std::to_string(i));
  }
  void on_deferred_free(std::size_t i, const Event&, int& h) {
    seen.push_back("deferred" + std::to_string(h) + "@" + std::to_string(i));
  }
  void on_deferred_free_completed(std::size_t i, const Event&) {
    seen.push_back("completed@" + std::to_string(i));
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

// Which free_requested events are deferred frees: the next alloc, free_requested or
// free_completed of the address is a free_completed, not the event right after.
TEST(ReplayLoop, DeferredFrees) {
  const std::vector<Event> events = {
      ev(Action::kAlloc, 0x100, 8),         // 0
      ev(Action::kFreeRequested, 0x100),    // 1: completed at once: not deferred
      ev(Action::kFreeCompleted, 0x100),    // 2
      ev(Action::kAlloc, 0x200, 8),         // 3
      ev(Action::kFreeRequested, 0x200),    // 4: completed at 6: deferred
      ev(Action::kSegmentAlloc, 0x200, 8),  // 5: not a block event, but an event between
      ev(Action::kFreeCompleted, 0x200),    // 6
      ev(Action::kAlloc, 0x300, 8),         // 7
      ev(Action::kFreeRequested, 0x300),    // 8: superseded by 10
      ev(Action::kAlloc, 0x400, 8),         // 9
      ev(Action::kFreeRequested, 0x300),    // 10: completed at 12: deferred
      ev(Action::kAlloc, 0x500, 8),         // 11
      ev(Action::kFreeCompleted, 0x300),    // 12
      ev(Action::kFreeRequested, 0x400),    // 13: its address allocated again first
      ev(Action::kAlloc, 0x600, 8),         // 14
      ev(Action::kAlloc, 0x400, 8),         // 15
      ev(Action::kFreeCompleted, 0x400),    // 16
      ev(Action::kFreeRequested, 0x500),    // 17: never completed
  };
  const std::vector<bool> d = deferred_frees(events);
  ASSERT_EQ(d.size(), events.size());
  for (std::size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], i == 4 || i == 10) << "event " << i;
}

TEST(ReplayLoop, FreesDeferredFreesAtFreeRequested) {
  const std::vector<Event> events = {
      ev(Action::kAlloc, 0x100, 8),       // 0
      ev(Action::kFreeRequested, 0x100),  // 1: an ordinary free
      ev(Action::kFreeCompleted, 0x100),  // 2
      ev(Action::kAlloc, 0x200, 8),       // 3
      ev(Action::kFreeRequested, 0x200),  // 4: deferred
      ev(Action::kAlloc, 0x300, 8),       // 5
      ev(Action::kFreeCompleted, 0x200),  // 6
      ev(Action::kFreeRequested, 0x400),  // 7: never allocated: ignored
  };
  Log at_completed;  // the default: every block is freed at its free_completed
  TraceCounts c = run_trace<int>(events, at_completed);
  EXPECT_EQ(c.frees, 2u);
  EXPECT_EQ(at_completed.seen,
            (std::vector<std::string>{"alloc@0", "requested1@1", "free1@2", "alloc@3",
                                      "requested2@4", "alloc@5", "free2@6", "end:1"}));
  Log at_request;
  c = run_trace<int>(events, at_request, events.size(), {.deferred_at_request = true});
  EXPECT_EQ(c.frees, 2u);
  EXPECT_EQ(c.skipped, 0u);
  EXPECT_EQ(at_request.seen,
            (std::vector<std::string>{"alloc@0", "requested1@1", "free1@2", "alloc@3",
                                      "deferred2@4", "alloc@5", "completed@6", "end:1"}));
  // Replayed only up to the free_requested, the free is still deferred: the classification
  // looks at the whole trace.
  Log cut;
  c = run_trace<int>(events, cut, 5, {.deferred_at_request = true});
  EXPECT_EQ(c.frees, 2u);
  EXPECT_EQ(cut.seen.back(), "end:0");
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
