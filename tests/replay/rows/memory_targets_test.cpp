// cuarena's memory on every bundled real trace, held to what PyTorch's allocators measured on
// the same workloads (tests/data/traces/README.md and more/README.md) and to the targets the
// policy meets today, so a change that loses memory fails here. Simulator; memory first at lag 1
// (the replayer's default), the default at every lag from 1 to 64 (its placement depends on when
// frees are shared, so one lag alone is a sample of a chaotic function: bench/policy_table.py
// and docs/results.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuarena/config.hpp"
#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/trace.hpp"

using namespace cuarena;
using namespace cuarena::replay;

namespace {

struct Trace {
  const char* file;
  double native, expandable, async;  // PyTorch's reserved_ratio on the H200 (0: none measured)
  // The default's reserved_ratio over sim_event_latency 1, 2, 4, ..., 64 today, rounded up:
  // regression bounds on its mean and on its range (max - min; the target is 0.01).
  double default_mean_max, default_range_max;
  double memory_first_max;  // 1.02 for training, 1.05 for inference (the targets)
};

class PolicyTargets : public ::testing::TestWithParam<Trace> {};

auto events_of(const Trace& t) { return load_trace(std::string(CUARENA_TRACE_DIR) + "/" + t.file); }

SimOptions options(const std::string& config) {
  SimOptions o;
  o.config = Config::parse(config);
  return o;
}

Result replay(const Trace& t, const std::string& config) {
  return replay_cuarena(events_of(t), options(config));
}

TEST_P(PolicyTargets, DefaultBelowNativeAndAsyncAtEveryLag) {
  const Trace& t = GetParam();
  const auto events = events_of(t);
  double sum = 0, lo = 1e9, hi = 0;
  int lags = 0;
  for (std::uint64_t lag = 1; lag <= 64; lag *= 2, ++lags) {
    SimOptions o = options("");
    o.device.event_latency = lag;
    const Result r = replay_cuarena(events, o);
    EXPECT_EQ(r.ooms, 0u) << "lag " << lag;
    EXPECT_LT(r.reserved_ratio, t.native) << "lag " << lag;
    if (t.async > 0) {
      EXPECT_LT(r.reserved_ratio, t.async) << "lag " << lag;
    }
    sum += r.reserved_ratio;
    lo = std::min(lo, r.reserved_ratio);
    hi = std::max(hi, r.reserved_ratio);
  }
  EXPECT_LE(sum / lags, t.default_mean_max) << "mean over lags 1-64";
  EXPECT_LE(hi - lo, t.default_range_max) << "range over lags 1-64: " << lo << " to " << hi;
}

TEST_P(PolicyTargets, MemoryFirstBelowEveryPyTorchModeAndOnTarget) {
  const Trace& t = GetParam();
  const Result r = replay(t, "whole_chunk_min:0");
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_LT(r.reserved_ratio, t.native);
  EXPECT_LT(r.reserved_ratio, t.expandable);
  if (t.async > 0) {
    EXPECT_LT(r.reserved_ratio, t.async);
  }
  EXPECT_LE(r.reserved_ratio, t.memory_first_max);
}

// The smallest capacity the replayer reports is checked by probes above it: none of them runs
// out of memory (a binary search alone assumes that).
TEST_P(PolicyTargets, NoOutOfMemoryAboveTheMinimumCapacity) {
  const Trace& t = GetParam();
  const auto events = events_of(t);
  const SimOptions o = options("whole_chunk_min:0");
  const Result r = replay_cuarena(events, o);
  const CheckedMinCapacity m = min_capacity_checked(events, o, r.peak_reserved_bytes);
  ASSERT_TRUE(m.bytes.has_value());
  for (const CapacityProbe& p : m.probes) {
    if (p.capacity_bytes >= *m.bytes) {
      EXPECT_EQ(p.ooms, 0u) << "at " << p.capacity_bytes << " bytes";
    }
  }
}

// llm_generate (a million allocations) is asserted in the default build only: under ASan one
// replay takes ~100 s and the capacity probes twenty minutes, past what CI allows.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

const Trace kAllTraces[] = {
    {"bert_varlen_infer.pickle.gz", 1.9870, 1.2105, 1.3358, 1.024, 0.004, 1.05},
    {"gpt2_train.pickle.gz", 1.0838, 1.0698, 1.1776, 1.006, 0.003, 1.02},
    {"moe_train.pickle.gz", 1.0788, 1.0681, 1.0775, 1.006, 0.002, 1.02},
    {"resnet50_amp.pickle.gz", 1.2045, 1.0100, 1.0636, 1.006, 0.001, 1.02},
    {"vit_multistream.pickle.gz", 1.0747, 1.0224, 1.0594, 1.005, 0.002, 1.02},
    {"more/llm_generate.pickle.gz", 1.3083, 1.0476, 1.2359, 1.018, 0.008, 1.05},
    {"more/compile_train.pickle.gz", 1.1873, 1.0961, 0, 1.018, 0.029, 1.02},
    {"more/cnn_varres_infer.pickle.gz", 2.2216, 1.2737, 1.1858, 1.021, 0.002, 1.05},
};

std::vector<Trace> traces() {
  std::vector<Trace> out;
  for (const Trace& t : kAllTraces) {
    if (!(kSanitized && std::string(t.file) == "more/llm_generate.pickle.gz")) out.push_back(t);
  }
  return out;
}

void PrintTo(const Trace& t, std::ostream* os) { *os << t.file; }

INSTANTIATE_TEST_SUITE_P(Bundled, PolicyTargets, ::testing::ValuesIn(traces()),
                         [](const auto& info) {
                           std::string name = info.param.file;
                           if (name.rfind("more/", 0) == 0) name = name.substr(5);
                           return name.substr(0, name.find('.'));
                         });

}  // namespace

// --- The patterns of public bug reports (tests/data/traces/cases/README.md) ------------------

namespace {

struct Case {
  const char* file;
  double memory_first_peak;          // the case's own bound: peak reserved / peak requested ...
  std::uint64_t memory_first_slack;  // ... plus these bytes
  double default_min;  // the default's --min-capacity / peak requested today, rounded up
};

class Cases : public ::testing::TestWithParam<Case> {};

std::vector<Event> case_events(const Case& c) {
  return load_trace(std::string(CUARENA_TRACE_DIR) + "/cases/" + c.file);
}

Result at_capacity(const std::vector<Event>& events, const std::string& config,
                   std::uint64_t bytes) {
  SimOptions o = options(config);
  o.capacity = bytes;
  return replay_cuarena(events, o);
}

TEST_P(Cases, MemoryFirstMeetsTheCasesExpectation) {
  const Case& c = GetParam();
  const Result r = replay_cuarena(case_events(c), options("whole_chunk_min:0"));
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_LE(double(r.peak_reserved_bytes),
            c.memory_first_peak * double(r.peak_requested_bytes) + double(c.memory_first_slack));
}

// Under a limit the default goes memory-first when it runs short (whole_chunk_fraction), so
// it fits where memory first fits, give or take, and a larger device never fails where a
// smaller one succeeded: every capacity from its minimum up to 1.10x peak requested, in 2 MiB
// steps (at most 24 of them, spread evenly), replays with no out-of-memory.
TEST_P(Cases, DefaultFitsFromItsMinimumCapacityUp) {
  const Case& c = GetParam();
  const auto events = case_events(c);
  const Result r = replay_cuarena(events, options(""));
  const CheckedMinCapacity m = min_capacity_checked(events, options(""), r.peak_reserved_bytes);
  ASSERT_TRUE(m.bytes.has_value());
  EXPECT_LE(double(*m.bytes), c.default_min* double(r.peak_requested_bytes));
  constexpr std::uint64_t kStep = 2 * 1024 * 1024;
  const auto top = std::uint64_t(1.10 * double(r.peak_requested_bytes));
  const std::uint64_t steps = top > *m.bytes ? (top - *m.bytes) / kStep : 0;
  const std::uint64_t probes = std::min<std::uint64_t>(steps + 1, 24);
  for (std::uint64_t i = 0; i < probes; ++i) {
    const std::uint64_t bytes = *m.bytes + (probes > 1 ? steps * i / (probes - 1) : 0) * kStep;
    EXPECT_EQ(at_capacity(events, "", bytes).ooms, 0u) << "at " << bytes << " bytes";
  }
}

const Case kCases[] = {
    {"02-async-pool-churn.pickle.gz", 1.05, 0, 1.040},
    {"05-maxsplit-expandable-fence.pickle.gz", 1.10, 20 * 1024 * 1024, 1.010},
    {"12-identical-epochs-reserved-growth.pickle.gz", 1.05, 0, 1.015},
};

INSTANTIATE_TEST_SUITE_P(Reported, Cases, ::testing::ValuesIn(kCases), [](const auto& info) {
  const std::string name = info.param.file;
  return "case" + name.substr(0, 2);
});

// Placing whole chunks, turning memory-first is what fits case 05 (a small block fencing a
// merged free range 50 times) near its peak: with the switch off, whole chunks strand memory.
TEST(Cases, TurningMemoryFirstIsWhatFitsTheFence) {
  const auto events = case_events(kCases[1]);
  const std::uint64_t bytes = 420ull * 1024 * 1024;  // 1.034x its peak requested
  EXPECT_EQ(at_capacity(events, "", bytes).ooms, 0u);
  const std::string chunks = "loop_plan:False,whole_chunk_min:4MiB";
  EXPECT_EQ(at_capacity(events, chunks, bytes).ooms, 0u);
  EXPECT_GT(at_capacity(events, chunks + ",whole_chunk_fraction:1", bytes).ooms, 0u);
}

// The default, a loop plan over memory first, holds memory first's footprint: on the whole
// recorded jobs, where the job's real loop differs from the first one planned (the pool serves
// what the plan did not foresee, from the memory the plan's range holds between its blocks), and
// on the cases.
TEST(LoopPlanTargets, WithMemoryFirstWithinOnePercentOfMemoryFirst) {
  for (const char* file : {"jobs/resnet50.pickle.gz", "jobs/gpt2.pickle.gz",
                           "jobs/gpt2_varlen.pickle.gz", "gpt2_train.pickle.gz",
                           "moe_train.pickle.gz", "cases/05-maxsplit-expandable-fence.pickle.gz",
                           "cases/12-identical-epochs-reserved-growth.pickle.gz"}) {
    SCOPED_TRACE(file);
    const auto events = load_trace(std::string(CUARENA_TRACE_DIR) + "/" + file);
    const Result mf = replay_cuarena(events, options("loop_plan:False,whole_chunk_min:0"));
    const Result plan = replay_cuarena(events, options(""));  // the default: both
    EXPECT_EQ(plan.ooms, 0u);
    EXPECT_LE(plan.reserved_ratio, mf.reserved_ratio + 0.01);
  }
}

}  // namespace
