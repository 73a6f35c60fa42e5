// Replays of the real traces in tests/data/traces (copies of shared/traces, recorded on an H200).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cuarena/allocator.hpp"
#include "cuarena/sim_backend.hpp"
#include "replay.hpp"
#include "trace.hpp"

using namespace cuarena;
using namespace cuarena::replay;

namespace {

struct Expected {
  const char* file;
  std::uint64_t peak_requested;
  std::uint64_t native_reserved;  // traces/README.md, reserved_bytes.all.peak under native
};

const Expected kTraces[] = {
    {"gpt2_train.pickle.gz", 14104549064, 15286140928},
    {"resnet50_amp.pickle.gz", 6057040924, 7295991808},
    {"bert_varlen_infer.pickle.gz", 753596000, 1497366528},
    {"vit_multistream.pickle.gz", 7981331564, 8577351680},
    {"moe_train.pickle.gz", 11490525960, 12396265472},
};

void PrintTo(const Expected& e, std::ostream* os) { *os << e.file; }

std::string trace_path(const std::string& name) { return std::string(CUARENA_TRACE_DIR) + "/" + name; }

class RealTrace : public ::testing::TestWithParam<Expected> {};

TEST_P(RealTrace, RecordedPeakMatchesPyTorchToTheByte) {
  const auto events = load_trace(trace_path(GetParam().file));
  const Result r = replay_recorded(events);
  EXPECT_EQ(r.peak_reserved_bytes, GetParam().native_reserved);
  EXPECT_EQ(r.peak_requested_bytes, GetParam().peak_requested);
  EXPECT_EQ(r.skipped_events, 0u);
}

TEST_P(RealTrace, CuarenaReplaysWithoutOutOfMemoryAndBeatsNative) {
  const auto events = load_trace(trace_path(GetParam().file));
  const Result r = replay_cuarena(events, SimOptions{});
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_requested_bytes, GetParam().peak_requested);
  EXPECT_GE(r.peak_reserved_bytes, r.peak_requested_bytes);
  EXPECT_LT(r.peak_reserved_bytes, GetParam().native_reserved);
}

// The whole trace through the allocator with every invariant checked along the way.
TEST_P(RealTrace, InvariantsHoldThroughoutReplay) {
  const auto events = load_trace(trace_path(GetParam().file));
  SimBackend sim;
  Allocator alloc(sim);
  std::unordered_map<std::uint64_t, void*> live;
  std::size_t n = 0;
  for (const Event& e : events) {
    sim.advance(1);
    if (e.action == Action::kAlloc) {
      live[e.addr] = alloc.allocate(e.size, e.stream);
    } else if (e.action == Action::kFreeCompleted) {
      auto it = live.find(e.addr);
      if (it == live.end()) continue;
      alloc.deallocate(it->second);
      live.erase(it);
    } else {
      continue;
    }
    if (++n % 97 == 0) {
      ASSERT_NO_THROW(alloc.check_invariants()) << "after event " << n;
    }
    ASSERT_EQ(sim.physical_bytes(), std::size_t(alloc.stats().reserved_bytes[0].current));
  }
  alloc.check_invariants();
  for (auto& [addr, p] : live) alloc.deallocate(p);
  alloc.check_invariants();
  EXPECT_EQ(alloc.stats().allocated_bytes[0].current, 0);
}

INSTANTIATE_TEST_SUITE_P(Traces, RealTrace, ::testing::ValuesIn(kTraces),
                         [](const auto& info) {
                           std::string name = info.param.file;
                           return name.substr(0, name.find('.'));
                         });

}  // namespace
