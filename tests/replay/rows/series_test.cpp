// Time series of a replay (--series, --report): downsampling keeps every window's largest value,
// each row's series peaks at the row's own reported peak, and asking for one changes no figure.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/torch_sim.hpp"
#include "cuarena/replay/trace.hpp"

using namespace cuarena;
using namespace cuarena::replay;

namespace {

std::uint64_t max_of(const std::vector<std::uint64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

Event alloc(std::uint64_t addr, std::uint64_t size, std::int64_t t = 0) {
  return {Action::kAlloc, 0, 0, addr, size, t};
}
Event free_completed(std::uint64_t addr, std::int64_t t = 0) {
  return {Action::kFreeCompleted, 0, 0, addr, 0, t};
}

TEST(SeriesRecorder, FewEventsAreOnePointEach) {
  SeriesRecorder rec(3);
  for (std::uint64_t v : {5, 9, 2}) rec.add(v);
  const std::vector<Event> ev = {alloc(1, 10), alloc(2, 20), free_completed(1)};
  const Series s = rec.finish(ev);
  EXPECT_EQ(s.window, 1u);
  EXPECT_EQ(s.event, (std::vector<std::uint64_t>{0, 1, 2}));
  EXPECT_EQ(s.reserved, (std::vector<std::uint64_t>{5, 9, 2}));
  EXPECT_EQ(s.requested, (std::vector<std::uint64_t>{10, 30, 20}));
  EXPECT_TRUE(s.time_us.empty());  // the trace has no times
}

// A one-event spike anywhere survives downsampling, in the point whose window holds it.
TEST(SeriesRecorder, DownsamplingKeepsEachWindowsMaximum) {
  const std::size_t n = 100003, max_points = 2000;
  for (std::size_t spike : {std::size_t{0}, std::size_t{1}, std::size_t{49}, std::size_t{50},
                            std::size_t{51234}, n - 1}) {
    SeriesRecorder rec(n, max_points);
    std::vector<Event> ev;
    ev.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      rec.add(i == spike ? 1000000 : i % 97);
      ev.push_back(i == spike       ? alloc(7, 555, std::int64_t(i) + 1)
                   : i == spike + 1 ? free_completed(7, std::int64_t(i) + 1)
                                    : Event{Action::kOther, 0, 0, 0, 0, std::int64_t(i) + 1});
    }
    const Series s = rec.finish(ev);
    ASSERT_LE(s.event.size(), max_points);
    EXPECT_EQ(s.window, (n + max_points - 1) / max_points);
    EXPECT_EQ(s.event.size(), (n + s.window - 1) / s.window);
    EXPECT_EQ(s.reserved.size(), s.event.size());
    EXPECT_EQ(s.requested.size(), s.event.size());
    ASSERT_EQ(s.time_us.size(), s.event.size());
    EXPECT_EQ(s.event.back(), n - 1);
    EXPECT_EQ(s.time_us.back(), std::int64_t(n));
    const std::size_t k = spike / s.window;
    EXPECT_EQ(s.reserved[k], 1000000u) << "spike at " << spike;
    EXPECT_EQ(max_of(s.reserved), 1000000u);
    EXPECT_EQ(s.requested[k], 555u);
    EXPECT_EQ(max_of(s.requested), 555u);
    for (std::size_t i = 0; i < s.event.size(); ++i) {  // every other window: its own maximum
      if (i == k) continue;
      const std::uint64_t lo = i * s.window, hi = std::min<std::uint64_t>(lo + s.window, n);
      const std::uint64_t expect = hi - lo >= 97                ? 96
                                   : (hi - 1) % 97 >= (lo % 97) ? (hi - 1) % 97
                                                                : 96;
      ASSERT_EQ(s.reserved[i], expect) << "point " << i;
    }
  }
}

// A replay that stops early (add() called fewer times) gives the series of what it replayed.
TEST(SeriesRecorder, StopsWhereTheReplayStopped) {
  SeriesRecorder rec(10, 4);  // window 3
  for (int i = 0; i < 7; ++i) rec.add(std::uint64_t(i));
  std::vector<Event> ev(10, alloc(0, 1));
  const Series s = rec.finish(ev);
  EXPECT_EQ(s.window, 3u);
  EXPECT_EQ(s.event, (std::vector<std::uint64_t>{2, 5, 6}));
  EXPECT_EQ(s.reserved, (std::vector<std::uint64_t>{2, 5, 6}));
  EXPECT_EQ(s.requested.size(), 3u);
}

std::string trace_path(const std::string& name) {
  return std::string(CUARENA_TRACE_DIR) + "/" + name;
}

const char* const kTraceFiles[] = {"gpt2_train.pickle.gz", "resnet50_amp.pickle.gz",
                                   "bert_varlen_infer.pickle.gz", "vit_multistream.pickle.gz",
                                   "moe_train.pickle.gz"};

void expect_series_matches(const Result& r, std::size_t events) {
  SCOPED_TRACE(r.allocator);
  ASSERT_TRUE(r.series.has_value());
  const Series& s = *r.series;
  EXPECT_LE(s.event.size(), kSeriesPoints);
  EXPECT_EQ(s.event.back(), events - 1);
  EXPECT_EQ(max_of(s.reserved), r.peak_reserved_bytes);
  EXPECT_EQ(max_of(s.requested), r.peak_requested_bytes);
  EXPECT_EQ(s.time_us.size(), s.event.size());  // snapshots carry times
}

// The numbers a row reports with and without its series: the same.
void expect_same_figures(const Result& a, const Result& b) {
  EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
  EXPECT_EQ(a.peak_requested_bytes, b.peak_requested_bytes);
  EXPECT_EQ(a.external_fragmentation, b.external_fragmentation);
  EXPECT_EQ(a.free_at_peak_bytes, b.free_at_peak_bytes);
  EXPECT_EQ(a.rounding_waste_bytes, b.rounding_waste_bytes);
  EXPECT_EQ(a.ooms, b.ooms);
  EXPECT_EQ(a.allocs, b.allocs);
  EXPECT_EQ(a.frees, b.frees);
  EXPECT_EQ(a.skipped_events, b.skipped_events);
  EXPECT_EQ(a.counters, b.counters);
}

class SeriesOfRealTrace : public ::testing::TestWithParam<const char*> {};

TEST_P(SeriesOfRealTrace, PeaksAreTheRowsPeaksAndFiguresDoNotChange) {
  const auto events = load_trace(trace_path(GetParam()));
  SimOptions plain, with;
  with.series = true;
  const Result rec = replay_recorded(events, true);
  expect_series_matches(rec, events.size());
  expect_same_figures(rec, replay_recorded(events));

  const Result cua = replay_cuarena(events, with);
  expect_series_matches(cua, events.size());
  expect_same_figures(cua, replay_cuarena(events, plain));

  for (const char* row : {"torch-native-sim", "torch-expandable-sim"}) {
    const Result t = replay_torch_sim_row(row, events, with, false);
    expect_series_matches(t, events.size());
    expect_same_figures(t, replay_torch_sim_row(row, events, plain, false));
  }
}

// Under a capacity the models release and retry inside one request: the series still peaks
// at the reported peak (read during the event, not only after it).
TEST_P(SeriesOfRealTrace, PeaksMatchUnderACapacityToo) {
  const auto events = load_trace(trace_path(GetParam()));
  const Result plain = replay_torch_sim_row("torch-native-sim", events, SimOptions{}, false);
  SimOptions with;
  with.series = true;
  with.capacity =
      (plain.peak_requested_bytes + plain.peak_reserved_bytes) / 2 / (2 << 20) * (2 << 20);
  for (const char* row : {"torch-native-sim", "torch-expandable-sim"}) {
    const Result t = replay_torch_sim_row(row, events, with, false);
    expect_series_matches(t, events.size());
  }
  const Result cua = replay_cuarena(events, with);
  expect_series_matches(cua, events.size());
}

INSTANTIATE_TEST_SUITE_P(Traces, SeriesOfRealTrace, ::testing::ValuesIn(kTraceFiles),
                         [](const auto& info) {
                           std::string name = info.param;
                           return name.substr(0, name.find('.'));
                         });

}  // namespace
