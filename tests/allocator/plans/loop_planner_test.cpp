// LoopPlanner and pack_cyclic: the plan a repeating loop gets. (The allocator serving plans is
// tested in randomized_invariants_test.cpp's RandomizedLoopPlan tests.)
#include "plans/loop_planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <optional>
#include <random>
#include <vector>

namespace cuarena::detail {
namespace {

bool cyclic_overlap(const PackItem& a, const PackItem& b, std::uint64_t period,
                    std::uint64_t margin) {
  const std::uint64_t m = a.stream == b.stream ? 0 : margin;
  auto overlap = [](std::uint64_t s1, std::uint64_t e1, std::uint64_t s2, std::uint64_t e2) {
    return s1 < e2 && s2 < e1;
  };
  const std::uint64_t ae = a.end + m, be = b.end + m;
  return overlap(a.start, ae, b.start, be) || overlap(a.start, ae, b.start + period, be + period) ||
         overlap(a.start + period, ae + period, b.start, be);
}

// Most bytes live at once (one stream, the circle of `period` events).
std::size_t live_peak_of(const std::vector<PackItem>& items, std::uint64_t period) {
  std::vector<std::int64_t> live(period, 0);
  for (const PackItem& it : items) {
    for (std::uint64_t t = it.start; t < it.end; ++t) live[t % period] += std::int64_t(it.size);
  }
  return std::size_t(*std::max_element(live.begin(), live.end()));
}

// Every block inside the extent, and no two live together sharing bytes (one stream).
void expect_packed(const std::vector<PackItem>& items, std::uint64_t period,
                   const std::vector<std::size_t>& offsets, std::size_t extent) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    EXPECT_LE(offsets[i] + items[i].size, extent);
    for (std::size_t j = i + 1; j < items.size(); ++j) {
      const bool share =
          offsets[i] < offsets[j] + items[j].size && offsets[j] < offsets[i] + items[i].size;
      EXPECT_FALSE(share && cyclic_overlap(items[i], items[j], period, 0)) << i << " and " << j;
    }
  }
}

TEST(PackCyclic, BlocksLiveTogetherNeverShareBytes) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; ++round) {
    // Periods longer than 4096 events too (iterations of thousands of requests): a blocks'
    // wrap past the period's end must still be seen to conflict with the period's start.
    const std::uint64_t period = round % 4 == 0 ? 5000 + rng() % 60000 : 50 + rng() % 2000;
    const std::uint64_t margin = rng() % 2 ? 0 : rng() % 64;
    std::vector<PackItem> items(1 + rng() % 120);
    for (PackItem& it : items) {
      it.size = 512 * (1 + rng() % 64);
      it.start = rng() % period;
      it.end = it.start + 1 + rng() % period;  // up to a whole period: may wrap
      it.stream = rng() % 3;
    }
    std::vector<std::size_t> offsets;
    std::vector<bool> fence;
    const std::size_t extent = pack_cyclic(items, period, margin, offsets, fence);
    std::size_t top = 0;
    std::vector<std::int64_t> live(period, 0);
    for (std::size_t i = 0; i < items.size(); ++i) {
      top = std::max(top, offsets[i] + items[i].size);
      for (std::uint64_t t = items[i].start; t < items[i].end; ++t)
        live[t % period] += std::int64_t(items[i].size);
      for (std::size_t j = i + 1; j < items.size(); ++j) {
        const bool share =
            offsets[i] < offsets[j] + items[j].size && offsets[j] < offsets[i] + items[i].size;
        if (cyclic_overlap(items[i], items[j], period, margin)) {
          ASSERT_FALSE(share) << "round " << round << ": blocks " << i << " and " << j
                              << " are live together and share bytes";
        }
        if (share && items[i].stream != items[j].stream) {
          EXPECT_TRUE(fence[i] && fence[j]) << "round " << round << ": blocks " << i << " and " << j
                                            << " of two streams share bytes without fences";
        }
      }
    }
    EXPECT_EQ(extent, top);
    EXPECT_GE(extent, std::size_t(*std::max_element(live.begin(), live.end())));
  }
}

// The large blocks of one recorded GPT-2 step with gradient accumulation (4 micro-batches; MiB,
// start and end in events): each micro-batch's bf16 logits (393) live until the next one's
// exist, beside the short fp32 copies (785) of the loss. Greedy by size puts the logits in two
// alternating slots above the copies, one idle at the peak: 3288 MiB for a live peak of 2895.
TEST(PackCyclic, AChainOfMicroBatchLogitsPacksToItsLivePeak) {
  const std::uint64_t period = 10305;
  const std::vector<std::array<std::uint64_t, 3>> blocks = {
      {147, 0, 295},      {393, 1136, 3498},  {785, 1137, 1143}, {785, 1140, 1203},
      {785, 1197, 1202},  {785, 1201, 1205},  {393, 1204, 1208}, {147, 1213, 10601},
      {147, 2773, 2797},  {393, 3487, 6000},  {785, 3488, 3494}, {785, 3491, 3557},
      {785, 3551, 3556},  {785, 3555, 3559},  {393, 3558, 3562}, {147, 3567, 5299},
      {147, 5274, 5298},  {393, 5989, 8502},  {785, 5990, 5996}, {785, 5993, 6059},
      {785, 6053, 6058},  {785, 6057, 6061},  {393, 6060, 6064}, {147, 6069, 7801},
      {147, 7776, 7800},  {393, 8491, 10751}, {785, 8492, 8498}, {785, 8495, 8561},
      {785, 8555, 8560},  {785, 8559, 8563},  {393, 8562, 8566}, {147, 8571, 10303},
      {147, 10278, 10302}};
  std::vector<PackItem> items;
  for (const auto& [mib, start, end] : blocks) items.push_back({mib << 20, start, end, 0});
  const std::size_t peak = live_peak_of(items, period);
  ASSERT_EQ(peak >> 20, 2895u);
  std::vector<std::size_t> offsets;
  std::vector<bool> fence;
  const std::size_t extent = pack_cyclic(items, period, 0, offsets, fence);
  EXPECT_LE(extent, peak + peak / 100) << "extent " << (extent >> 20) << " MiB";
  expect_packed(items, period, offsets, extent);
}

// An epoch of ten identical stages (MiB, events as recorded in bundled case 12): each stage's
// first and last blocks outlive it by one and seven events, so two instances of each are live
// at stage boundaries, beside three short large blocks. Greedy by size gives each long-lived
// pair two fixed slots above the short blocks (1.107 of the live peak); the search over the
// order interleaves them into the short blocks' idle bytes.
TEST(PackCyclic, StagesOutlivingTheirStepPackToTheirLivePeak) {
  const std::uint64_t period = 104;
  const std::array<std::array<std::uint64_t, 3>, 5> stage = {
      {{294, 0, 11}, {1179, 1, 3}, {2695, 2, 5}, {674, 4, 7}, {171, 6, 17}}};
  std::vector<PackItem> items;
  for (std::uint64_t k = 0; k < 10; ++k) {
    for (const auto& [mib, start, end] : stage)
      items.push_back({mib << 20, 10 * k + start, 10 * k + end, 0});
  }
  items.push_back({3072, 102, 204, 0});
  items.push_back({512, 103, 205, 0});
  const std::size_t peak = live_peak_of(items, period);
  std::vector<std::size_t> offsets;
  std::vector<bool> fence;
  const std::size_t extent = pack_cyclic(items, period, 0, offsets, fence);
  EXPECT_LE(extent, peak + peak / 100)
      << "extent " << (extent >> 20) << " MiB, live peak " << (peak >> 20) << " MiB";
  expect_packed(items, period, offsets, extent);
}

// A loop whose iteration repeats a layer: the planner plans the whole iteration once it has
// repeated (the allocator asks for a plan only while it has none or its plan missed; here the
// planner is asked after every request, so longer multiples follow), and that plan lists the
// iteration's requests in order from the phase it gives.
TEST(LoopPlanner, PlansTheLoopAroundRepeatedLayers) {
  LoopPlanner planner(1 << 12, 16);
  std::vector<Token> iteration;
  iteration.push_back({64 << 20, 0});  // input batch
  for (int layer = 0; layer < 12; ++layer) {
    iteration.push_back({8 << 20, 0});   // activation kept for backward
    iteration.push_back({32 << 20, 0});  // temporary
  }
  iteration.push_back({4 << 20, 1});  // loss, on a side stream
  std::vector<std::size_t> periods;
  std::vector<std::uint64_t> live;  // this iteration's kept blocks
  std::optional<Plan> loop_plan;
  std::size_t next_index = 0;  // the iteration index of the request after the plan was made
  for (int it = 0; it < 6; ++it) {
    for (std::size_t k = 0; k < iteration.size(); ++k) {
      const std::uint64_t seq = planner.on_allocate(iteration[k], live.size() << 20);
      const bool kept = iteration[k].size == (8u << 20) || k == 0;
      if (kept)
        live.push_back(seq);
      else
        planner.on_free(seq);  // temporaries die at once
      std::size_t phase = 0;
      if (std::optional<Plan> p = planner.take_plan(phase)) {
        periods.push_back(p->entries.size());
        if (p->entries.size() == iteration.size() && !loop_plan) {
          EXPECT_EQ(phase, 0u);
          loop_plan = std::move(p);
          next_index = (k + 1) % iteration.size();
        }
      }
    }
    for (std::uint64_t seq : live) planner.on_free(seq);  // backward
    live.clear();
  }
  ASSERT_FALSE(periods.empty()) << "no plan";
  EXPECT_TRUE(std::is_sorted(periods.begin(), periods.end())) << "a shorter plan came later";
  ASSERT_TRUE(loop_plan.has_value()) << "no plan for the whole iteration";
  const Plan& last = *loop_plan;
  for (std::size_t j = 0; j < iteration.size(); ++j)
    EXPECT_EQ(last.entries[j].token, iteration[(next_index + j) % iteration.size()]) << j;
  std::size_t planned = 0;
  for (const Plan::Entry& e : last.entries) planned += e.offset != Plan::kUnplanned;
  EXPECT_EQ(planned, iteration.size()) << "every block of the iteration dies within it";
  EXPECT_GE(last.bytes, last.live_peak);
  EXPECT_LE(last.bytes, last.live_peak + (32u << 20)) << "packing far above the live peak";
}

TEST(LoopPlanner, NoPlanWithoutRepetition) {
  LoopPlanner planner(1 << 12, 16);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 50000; ++i) {
    const std::uint64_t seq = planner.on_allocate({512 * (1 + rng() % 4096), rng() % 4}, 0);
    planner.on_free(seq);
    std::size_t phase = 0;
    ASSERT_FALSE(planner.take_plan(phase).has_value()) << "a plan for random requests, at " << i;
  }
}

}  // namespace
}  // namespace cuarena::detail
