// Replays of the real traces in tests/data/traces (copies of shared/traces, recorded on an H200).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cuarena/allocator.hpp"
#include "cuarena/replay/replay.hpp"
#include "cuarena/replay/trace.hpp"
#include "cuarena/sim_backend.hpp"
#include "input/sha256.hpp"

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

std::string trace_path(const std::string& name) {
  return std::string(CUARENA_TRACE_DIR) + "/" + name;
}

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

// The cuarena row's counters are the allocator's whole Stats::to_map(), each
// cuarena.X also under the replayer's earlier name X; they agree with the row's own figures.
TEST_P(RealTrace, CuarenaCountersAreTheAllocatorsStats) {
  const auto events = load_trace(trace_path(GetParam().file));
  const Result r = replay_cuarena(events, SimOptions{});
  for (const auto& [key, value] : Stats{}.to_map()) {
    ASSERT_TRUE(r.counters.count(key)) << key;
    if (key.rfind("cuarena.", 0) == 0) {
      EXPECT_EQ(r.counters.at(key.substr(8)), r.counters.at(key)) << key;
    }
  }
  for (const char* earlier :  // the names the row reported before to_map()
       {"num_device_alloc", "num_device_free", "granules_stolen", "granules_aliased",
        "granules_reactivated", "map_calls", "unmap_calls", "access_calls", "granules_mapped",
        "granules_unmapped", "stitched_ranges", "defrag_passes", "num_sync_all_streams",
        "slabs_created", "cross_stream_reuses"}) {
    EXPECT_TRUE(r.counters.count(earlier)) << earlier;
  }
  EXPECT_EQ(std::uint64_t(r.counters.at("reserved_bytes.all.peak")), r.peak_reserved_bytes);
  EXPECT_EQ(std::uint64_t(r.counters.at("allocation.all.allocated")), r.allocs);
  EXPECT_EQ(r.counters.at("num_ooms"), 0);
  EXPECT_GT(r.counters.at("map_calls"), 0);
}

// How far the device runs behind shows in the sweep polls: at a lag of one tick every poll
// finds its stream's sweep done; the longer the lag, the more polls find it still running.
TEST(SweepPolls, ThePendingShareGrowsWithTheDevicesLag) {
  const auto events = load_trace(trace_path("gpt2_train.pickle.gz"));
  auto pending_share = [&](std::uint64_t lag) {
    SimOptions o;
    o.device.event_latency = lag;
    const Result r = replay_cuarena(events, o);
    const auto polls = r.counters.at("cuarena.sweep_polls");
    EXPECT_GT(polls, 100) << "lag " << lag;
    return double(r.counters.at("cuarena.sweep_polls_pending")) / double(polls);
  };
  EXPECT_EQ(pending_share(1), 0.0);
  const double at16 = pending_share(16), at256 = pending_share(256);
  EXPECT_GT(at16, 0.2);
  EXPECT_GT(at256, at16 + 0.2);
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

INSTANTIATE_TEST_SUITE_P(Traces, RealTrace, ::testing::ValuesIn(kTraces), [](const auto& info) {
  std::string name = info.param.file;
  return name.substr(0, name.find('.'));
});

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

// FIPS 180-4's examples, and lengths around the 56- and 64-byte padding boundaries against
// digests from Python's hashlib.
TEST(Sha256, KnownAnswers) {
  auto sha = [](const std::string& s, std::size_t chunk = 1 << 20) {
    Sha256 h;
    for (std::size_t i = 0; i < s.size(); i += chunk)
      h.update(s.data() + i, std::min(chunk, s.size() - i));
    return h.hex();
  };
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha(std::string(1000000, 'a'), 777),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  const std::pair<std::size_t, const char*> xs[] = {
      {55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"},
      {56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"},
      {63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"},
      {64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"},
      {65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"}};
  for (const auto& [n, digest] : xs) {
    EXPECT_EQ(sha(std::string(n, 'x')), digest) << n;
    EXPECT_EQ(sha(std::string(n, 'x'), 7), digest) << n;
  }
}

TEST(MinCapacityCheck, ProbesAreTwoMiBStepsToSixteenAndOneAndFivePercent) {
  const std::vector<std::uint64_t> p = probe_capacities(2000 * MiB, 2 * MiB);
  const std::vector<std::uint64_t> want = {2002 * MiB, 2004 * MiB, 2006 * MiB, 2008 * MiB,
                                           2010 * MiB, 2012 * MiB, 2014 * MiB, 2016 * MiB,
                                           2020 * MiB,   // +1%
                                           2100 * MiB};  // +5%
  EXPECT_EQ(p, want);
  // +1% of 1000 MiB is 10 MiB, already a 2 MiB step: no repeats.
  EXPECT_EQ(probe_capacities(1000 * MiB, 2 * MiB).size(), 9u);
  // Steps never below the granule: with 1 GiB granules every probe is the next granule.
  EXPECT_EQ(probe_capacities(4096 * MiB, 1024 * MiB), (std::vector<std::uint64_t>{5120 * MiB}));
}

// A device that fits from 94 MiB, fails from 102 to 108 MiB and fits again from 110 MiB (the
// shape of the synthetic trace in test_cli.py): the binary search finds 94 MiB, the probes
// find the failures above it, and the answer is the first capacity above the last failure.
TEST(MinCapacityCheck, AFailureAboveTheSearchesAnswerMovesItAboveTheFailure) {
  std::vector<std::uint64_t> asked;
  auto ooms_at = [&](std::uint64_t c) -> std::uint64_t {
    asked.push_back(c);
    return c < 94 * MiB || (c >= 102 * MiB && c <= 108 * MiB) ? 1 : 0;
  };
  const CheckedMinCapacity m = checked_min_capacity(2 * MiB, 75 * MiB, 110 * MiB, 1 << 30, ooms_at);
  EXPECT_EQ(m.searched, 94 * MiB);
  EXPECT_EQ(m.bytes, 110 * MiB);
  ASSERT_FALSE(m.probes.empty());
  for (const CapacityProbe& p : m.probes) {
    EXPECT_GT(p.capacity_bytes, 94 * MiB);
    EXPECT_EQ(p.ooms > 0, p.capacity_bytes >= 102 * MiB && p.capacity_bytes <= 108 * MiB);
  }
}

TEST(MinCapacityCheck, AFailureAtTheLastProbeSearchesAgainAboveIt) {
  // Fits at 100 MiB, fails from 102 MiB up to +5% (106 MiB is the last probe) and beyond up
  // to 200 MiB; fits from 202 MiB.
  auto ooms_at = [](std::uint64_t c) -> std::uint64_t {
    return c < 100 * MiB || (c > 100 * MiB && c < 202 * MiB) ? 3 : 0;
  };
  const CheckedMinCapacity m = checked_min_capacity(2 * MiB, 90 * MiB, 100 * MiB, 1 << 30, ooms_at);
  EXPECT_EQ(m.searched, 100 * MiB);
  EXPECT_EQ(m.bytes, 202 * MiB);
  for (const CapacityProbe& p : m.probes) EXPECT_EQ(p.ooms > 0, p.capacity_bytes < 202 * MiB);
}

TEST(MinCapacityCheck, AMonotoneDeviceKeepsTheSearchesAnswer) {
  auto ooms_at = [](std::uint64_t c) -> std::uint64_t { return c < 128 * MiB ? 5 : 0; };
  const CheckedMinCapacity m = checked_min_capacity(2 * MiB, 64 * MiB, 300 * MiB, 1 << 30, ooms_at);
  EXPECT_EQ(m.searched, 128 * MiB);
  EXPECT_EQ(m.bytes, 128 * MiB);
  EXPECT_EQ(m.probes.size(), probe_capacities(128 * MiB, 2 * MiB).size());
}

}  // namespace
