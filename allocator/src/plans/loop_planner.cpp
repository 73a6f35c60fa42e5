#include "plans/loop_planner.hpp"

#include <algorithm>
#include <array>
#include <numeric>
#include <utility>

#include "support/assert.hpp"
#include "tuning.hpp"

namespace cuarena::detail {

namespace {
constexpr std::uint64_t kBase = 0x100000001b3ULL;  // FNV prime: odd, so powers never vanish

constexpr std::uint64_t base_pow(int n) {
  std::uint64_t p = 1;
  for (int i = 0; i < n; ++i) p *= kBase;
  return p;
}
constexpr std::uint64_t kBaseW = base_pow(TokenWindow::kWindow);

/// Blocks of a period that may have been planned against each other wrongly when streams differ
/// or lifetimes meet on the circle: [s, e) and [s', e') overlap modulo `period` (each shorter
/// than 2 x period after the margin).
bool cyclic_overlap(std::uint64_t s1, std::uint64_t e1, std::uint64_t s2, std::uint64_t e2,
                    std::uint64_t period) {
  auto overlap = [](std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
    return a < d && c < b;
  };
  return overlap(s1, e1, s2, e2) || overlap(s1, e1, s2 + period, e2 + period) ||
         overlap(s1 + period, e1 + period, s2, e2);
}
}  // namespace

std::uint64_t TokenWindow::token_hash(const Token& t) {
  std::uint64_t h =
      (std::uint64_t(t.size) * 0x9e3779b97f4a7c15ULL) ^ (t.stream + 0x632be59bd9b4e019ULL);
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 32);
}

void TokenWindow::push(const Token& t) {
  const std::uint64_t h = token_hash(t);
  const int slot = count_ % kWindow;
  hash_ = hash_ * kBase + h - ring_[slot] * kBaseW;  // the token kWindow back leaves the sum
  ring_[slot] = h;
  ++count_;
  if (count_ == 2 * kWindow) count_ = kWindow;  // keeps count_ % kWindow cycling, full() true
}

namespace {
constexpr std::size_t kUnpinned = SIZE_MAX;

/// The greedy placement: blocks with a pin first, at it, then the others in `order`, each at the
/// lowest offset where no block already placed that is live at the same time (cyclically, plus
/// the cross-stream margin) overlaps it. The placed blocks are kept by offset, so the first gap
/// is found in one walk that stops there: O(n^2) pair checks at worst, with no sorting per
/// block. Returns the extent, or SIZE_MAX when two pinned blocks collide or the extent passes
/// `limit` (the placement then stops there). Adds the pair checks made (and the insertions'
/// moves, 8 to a check) to `*checks`, if given.
std::size_t place_greedy(const std::vector<PackItem>& items, std::uint64_t period,
                         std::uint64_t margin, const std::vector<std::uint32_t>& order,
                         const std::vector<std::size_t>& pin, std::vector<std::size_t>& offsets,
                         std::size_t limit = SIZE_MAX, std::size_t* checks = nullptr) {
  auto conflict = [&](const PackItem& a, const PackItem& o) {
    const std::uint64_t m = o.stream == a.stream ? 0 : margin;
    return cyclic_overlap(a.start, a.end + m, o.start, o.end + m, period);
  };
  std::vector<std::uint32_t> placed;  // by offset
  placed.reserve(items.size());
  std::size_t extent = 0;
  auto put = [&](std::uint32_t i, std::size_t at) {
    offsets[i] = at;
    extent = std::max(extent, at + items[i].size);
    const auto pos =
        std::upper_bound(placed.begin(), placed.end(), at,
                         [&](std::size_t off, std::uint32_t j) { return off < offsets[j]; });
    if (checks != nullptr) *checks += std::size_t(placed.end() - pos) / 8;  // the move, as work
    placed.insert(pos, i);
  };
  for (const std::uint32_t i : order) {
    if (pin[i] == kUnpinned) continue;
    for (const std::uint32_t j : placed) {
      if (offsets[j] < pin[i] + items[i].size && pin[i] < offsets[j] + items[j].size &&
          conflict(items[i], items[j]))
        return SIZE_MAX;
    }
    put(i, pin[i]);
    if (extent > limit) return SIZE_MAX;
  }
  for (const std::uint32_t i : order) {
    if (pin[i] != kUnpinned) continue;
    const PackItem& a = items[i];
    std::size_t at = 0;  // lowest offset where `a` fits between the conflicting blocks
    std::size_t walked = 0;
    for (const std::uint32_t j : placed) {
      if (offsets[j] >= at + a.size) break;
      ++walked;
      if (conflict(a, items[j])) at = std::max(at, offsets[j] + items[j].size);
    }
    if (checks != nullptr) *checks += walked;
    put(i, at);
    if (extent > limit) return SIZE_MAX;
  }
  return extent;
}

/// Most bytes of `items` live at once on the circle: the extent no packing goes below.
std::size_t live_peak(const std::vector<PackItem>& items, std::uint64_t period) {
  std::vector<std::pair<std::uint64_t, std::int64_t>> steps;  // (tick, change)
  for (const PackItem& it : items) {
    const auto size = std::int64_t(it.size);
    steps.push_back({it.start, size});
    if (it.end <= period) {
      steps.push_back({it.end, -size});
    } else {
      steps.push_back({period, -size});
      steps.push_back({0, size});
      steps.push_back({it.end - period, -size});
    }
  }
  std::sort(steps.begin(), steps.end());  // a free before an allocation at the same tick
  std::int64_t live = 0, peak = 0;
  for (const auto& [t, d] : steps) peak = std::max(peak, live += d);
  return std::size_t(peak);
}
/// Blocks of two streams sharing bytes (at different times, by the packing): each one's free
/// needs an event before the other reuses them. A sweep over addresses finds them.
void mark_fences(const std::vector<PackItem>& items, const std::vector<std::size_t>& offsets,
                 std::vector<bool>& fence) {
  const std::size_t n = items.size();
  std::vector<std::uint32_t> by_offset(n);
  std::iota(by_offset.begin(), by_offset.end(), 0u);
  std::sort(by_offset.begin(), by_offset.end(),
            [&](std::uint32_t a, std::uint32_t b) { return offsets[a] < offsets[b]; });
  std::vector<std::uint32_t> open;  // blocks whose bytes reach past the current offset
  for (std::uint32_t i : by_offset) {
    std::erase_if(open, [&](std::uint32_t j) { return offsets[j] + items[j].size <= offsets[i]; });
    for (std::uint32_t j : open) {
      if (items[j].stream != items[i].stream) fence[i] = fence[j] = true;
    }
    open.push_back(i);
  }
}

/// The prefix of `order` (by size, largest first) of the blocks of at least 1/kPackTrialShare
/// of `floor`: they set the extent; the smaller ones only fill gaps.
std::vector<std::uint32_t> large_prefix(const std::vector<PackItem>& items,
                                        const std::vector<std::uint32_t>& order,
                                        std::size_t floor) {
  std::vector<std::uint32_t> large = order;
  large.erase(std::find_if(
                  large.begin(), large.end(),
                  [&](std::uint32_t i) { return items[i].size * tuning::kPackTrialShare < floor; }),
              large.end());
  return large;
}

/// Greedy leaves a chain of large long-lived blocks, each overlapping the next by a few events
/// (a micro-batch's logits kept until the next micro-batch's exist), in two slots above the short
/// large blocks around them, one slot idle at the peak. Pins such blocks (at most
/// kPackMaxPinned, each at least 1/kPackHeavyShare of `floor` and living a tenth of the period)
/// at other offsets, the ends of large blocks, one at a time (coordinate descent, two rounds),
/// and packs the rest around them by `order`; a move that keeps the extent is taken, so two
/// moves that only help together are found. On the recorded GPT-2 step with gradient
/// accumulation: 6971 MiB -> 6579 MiB, its live peak. The tries stop after kPackSearchChecks
/// pair checks (bert_varlen_infer's 14860 blocks took 8 s without a bound). Updates `offsets`
/// and `extent`.
void improve(const std::vector<PackItem>& items, std::uint64_t period, std::uint64_t margin,
             const std::vector<std::uint32_t>& order, std::size_t floor,
             std::vector<std::size_t>& offsets, std::size_t& extent) {
  const std::size_t n = items.size();
  auto life = [&](std::uint32_t i) { return items[i].end - items[i].start; };
  auto at_least = [&](std::uint32_t i, std::size_t share) {
    return items[i].size * share >= floor;
  };
  std::vector<std::uint32_t> heavy;
  for (const std::uint32_t i : order) {
    if (at_least(i, tuning::kPackHeavyShare) && life(i) * 10 >= period) heavy.push_back(i);
  }
  if (heavy.size() > tuning::kPackMaxPinned) heavy.resize(tuning::kPackMaxPinned);
  if (heavy.empty()) return;
  // Tries place only the large blocks: they set the extent; the small ones fill gaps once at
  // the end.
  const std::vector<std::uint32_t> large = large_prefix(items, order, floor);
  std::vector<std::size_t> pin(n, kUnpinned), now(n), trial(n);
  std::size_t checks = 0;
  std::size_t top = place_greedy(items, period, margin, large, pin, now, SIZE_MAX, &checks);
  for (int round = 0; round < 2 && checks < tuning::kPackSearchChecks; ++round) {
    for (const std::uint32_t h : heavy) {
      std::vector<std::size_t> ends{0};  // where a heavy-sized block ends: candidate offsets
      for (const std::uint32_t j : large) {
        if (!at_least(j, tuning::kPackHeavyShare)) break;
        ends.push_back(now[j] + items[j].size);
      }
      std::sort(ends.begin(), ends.end());
      ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
      std::pair<std::size_t, std::size_t> best{top + 1, kUnpinned};  // (extent, offset)
      for (const std::size_t at : ends) {
        if (checks >= tuning::kPackSearchChecks) break;
        if (at == now[h] || at + items[h].size > top) continue;
        std::vector<std::size_t> p = pin;
        p[h] = at;
        const std::size_t e =
            place_greedy(items, period, margin, large, p, trial, best.first - 1, &checks);
        if (e < best.first) best = {e, at};
      }
      if (best.second == kUnpinned) continue;
      pin[h] = best.second;
      top = place_greedy(items, period, margin, large, pin, now, SIZE_MAX, &checks);
    }
  }
  const std::size_t whole = place_greedy(items, period, margin, order, pin, trial, extent - 1);
  if (whole < extent) {
    extent = whole;
    offsets = std::move(trial);
  }
}

/// Local search over the placement order of the large blocks (at least 1/kPackTrialShare of
/// `floor`, which set the extent; the small ones fill gaps once at the end): swaps two of them
/// and keeps the swap when they then pack no wider, until they pack at `floor` or
/// kPackSearchChecks pair checks are spent. The swaps come from a fixed-seed generator, so a
/// loop gets the same plan in every run. Greedy by size leaves periodic loops well above their
/// live peak (a stage whose blocks outlive its period by a step takes two slots above the
/// short blocks); a few hundred swaps find the interleaving (bundled case 12: 1.107 -> 1.000 of
/// the live peak). Updates `offsets` and `extent` when the whole packing is narrower.
void search(const std::vector<PackItem>& items, std::uint64_t period, std::uint64_t margin,
            const std::vector<std::uint32_t>& order, std::size_t floor,
            std::vector<std::size_t>& offsets, std::size_t& extent) {
  const std::size_t n = items.size();
  std::vector<std::uint32_t> large = large_prefix(items, order, floor);
  if (large.size() < 2) return;
  const std::vector<std::size_t> free_pin(n, kUnpinned);
  std::vector<std::size_t> trial(n);
  std::size_t checks = 0;
  std::size_t best = place_greedy(items, period, margin, large, free_pin, trial, SIZE_MAX, &checks);
  std::uint64_t rng = 0x9e3779b97f4a7c15ULL;  // splitmix64: deterministic, cheap
  auto next = [&rng] {
    std::uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  // Within n^2 x kPackSearchPerPair pair checks (a few hundred placements of the large
  // blocks), at most kPackSearchChecks.
  const std::size_t budget =
      std::min(tuning::kPackSearchChecks, large.size() * large.size() * tuning::kPackSearchPerPair);
  while (best > floor && checks < budget) {
    const std::size_t a = next() % large.size(), b = next() % large.size();
    if (a == b || items[large[a]].size == items[large[b]].size) continue;
    std::swap(large[a], large[b]);
    const std::size_t e =
        place_greedy(items, period, margin, large, free_pin, trial, best, &checks);
    if (e <= best) {
      best = e;
    } else {
      std::swap(large[a], large[b]);
    }
  }
  // The small blocks after the large ones, in the old order.
  std::vector<std::uint32_t> whole = large;
  whole.insert(whole.end(), order.begin() + std::ptrdiff_t(large.size()), order.end());
  const std::size_t e = place_greedy(items, period, margin, whole, free_pin, trial, extent - 1);
  if (e < extent) {
    extent = e;
    offsets = std::move(trial);
  }
}

}  // namespace

std::size_t pack_cyclic(const std::vector<PackItem>& items, std::uint64_t period,
                        std::uint64_t margin, std::vector<std::size_t>& offsets,
                        std::vector<bool>& fence) {
  const std::size_t n = items.size();
  offsets.assign(n, 0);
  fence.assign(n, false);
  if (n == 0 || period == 0) return 0;
  // Greedy by size (largest first, the longest-lived first among equals).
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  auto life = [&](std::uint32_t i) { return items[i].end - items[i].start; };
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    if (items[a].size != items[b].size) return items[a].size > items[b].size;
    return life(a) != life(b) ? life(a) > life(b) : a < b;
  });
  std::size_t extent =
      place_greedy(items, period, margin, order, std::vector<std::size_t>(n, kUnpinned), offsets);
  // More than 1% over the live peak: look for a better layout of the largest blocks.
  const std::size_t floor = live_peak(items, period);
  if (extent > floor + floor / 100) improve(items, period, margin, order, floor, offsets, extent);
  if (extent > floor + floor / 100) search(items, period, margin, order, floor, offsets, extent);
  mark_fences(items, offsets, fence);
  return extent;
}

std::uint64_t LoopPlanner::on_allocate(const Token& token, std::size_t live_bytes) {
  const std::uint64_t seq = next_seq();
  reqs_.push_back({token, clock_++, live_bytes});
  window_.push(token);
  update_candidates(seq);
  while (reqs_.size() > 2 * max_period_ + 1) {
    reqs_.pop_front();
    ++first_seq_;
  }
  if (last_seen_.size() > 4 * max_period_) last_seen_.clear();
  return seq;
}

void LoopPlanner::on_free(std::uint64_t seq) {
  if (seq < first_seq_ || seq >= next_seq()) return;  // older than the history
  reqs_[seq - first_seq_].t_free = clock_++;
}

void LoopPlanner::update_candidates(std::uint64_t seq) {
  const Token& now = at(seq).token;
  std::erase_if(candidates_, [&](Candidate& c) {
    if (seq < first_seq_ + c.period || !(at(seq - c.period).token == now)) return true;
    ++c.matched;
    return false;
  });
  if (window_.full()) {
    // A period is proposed by every earlier occurrence of the current window remembered: the
    // latest is often one layer or one near-identical iteration back, the loop further.
    std::array<std::uint64_t, kOccurrences>& seen = last_seen_[window_.hash()];
    for (std::uint64_t q : seen) {
      if (q == 0) continue;  // empty slot (seq 0 never ends a full window)
      propose(seq, seq - q);
    }
    std::copy_backward(seen.begin(), seen.end() - 1, seen.end());
    seen[0] = seq;
  }
  for (const Candidate& c : candidates_) {
    if (c.matched >= c.period && c.period > planned_period_ &&
        (ready_period_ == 0 || c.period < ready_period_)) {
      ready_ = seq;
      ready_period_ = c.period;
    }
  }
}

void LoopPlanner::propose(std::uint64_t seq, std::size_t period) {
  if (period > max_period_ || period <= planned_period_ ||
      (refused_period_ != 0 && period % refused_period_ == 0) ||
      seq < first_seq_ + period + TokenWindow::kWindow)
    return;
  for (const Candidate& c : candidates_) {
    if (c.period == period) return;
  }
  for (int k = 0; k < TokenWindow::kWindow; ++k) {
    if (!(at(seq - k).token == at(seq - k - period).token)) return;  // a hash collision
  }
  const Candidate fresh{period, std::size_t(TokenWindow::kWindow)};
  if (candidates_.size() < kMaxCandidates) {
    candidates_.push_back(fresh);
    return;
  }
  // Full: the new one replaces the candidate with the shortest match so far, if as short.
  auto weakest = std::min_element(
      candidates_.begin(), candidates_.end(),
      [](const Candidate& a, const Candidate& b) { return a.matched < b.matched; });
  if (weakest->matched <= fresh.matched) *weakest = fresh;
}

std::optional<Plan> LoopPlanner::take_plan(std::size_t& phase) {
  if (!ready_) return std::nullopt;
  const std::uint64_t last = *ready_;
  const std::size_t period = ready_period_;
  ready_.reset();
  ready_period_ = 0;
  // Plan from the earlier of the two matching periods: its blocks have mostly been freed.
  if (last + 1 < 2 * period || last + 1 - 2 * period < first_seq_) return std::nullopt;
  const std::uint64_t first = last + 1 - 2 * period;
  planned_period_ = period;
  std::erase_if(candidates_, [&](const Candidate& c) { return c.period <= period; });
  phase = 0;  // the next request repeats the earlier period's first one
  return build(first, period, first, /*find_quiet=*/true);
}

std::optional<Plan> LoopPlanner::refresh(const Plan& plan, std::uint64_t last_seq,
                                         std::size_t last_entry) const {
  const std::size_t period = plan.entries.size();
  CUARENA_ASSERT(last_entry < period && last_seq < next_seq(), "refresh: not a followed request");
  if (last_seq < last_entry + period || last_seq - last_entry - period < first_seq_)
    return std::nullopt;
  const std::uint64_t first = last_seq - last_entry - period;  // its next iteration has begun
  std::uint64_t oldest = first;
  auto same = [&](std::uint64_t from) {
    for (std::size_t k = 0; k < period; ++k) {
      if (!(at(from + k).token == plan.entries[k].token)) return false;
    }
    return true;
  };
  if (!same(first)) return std::nullopt;
  while (oldest >= first_seq_ + period && same(oldest - period)) oldest -= period;
  Plan fresh = build(first, period, oldest, /*find_quiet=*/false);
  fresh.quiet = plan.quiet;
  return fresh;
}

Plan LoopPlanner::build(std::uint64_t first, std::size_t period, std::uint64_t oldest,
                        bool find_quiet) const {
  CUARENA_ASSERT(oldest <= first && (first - oldest) % period == 0 && oldest >= first_seq_ &&
                     first + period < next_seq(),
                 "build: the iterations must be in the history");
  Plan plan;
  plan.entries.resize(period);
  const std::uint64_t t0 = at(first).t_alloc;
  const std::uint64_t ticks = at(first + period).t_alloc - t0;  // one iteration, in events
  std::vector<PackItem> items;
  std::vector<std::uint32_t> entry_of;
  for (std::size_t k = 0; k < period; ++k) {
    plan.entries[k].token = at(first + k).token;
    plan.job_peak = std::max(plan.job_peak, at(first + k).live + at(first + k).token.size);
    // A block still live, or living longer than an iteration, would overlap its own next
    // instance: an earlier one, or else served elsewhere.
    for (std::uint64_t begin = first;; begin -= period) {  // an iteration's first request
      const Request& r = at(begin + k);
      if (r.t_free != kLive && r.t_free - r.t_alloc <= ticks) {
        const std::uint64_t start = std::min(r.t_alloc - at(begin).t_alloc, ticks - 1);
        items.push_back({r.token.size, start, start + (r.t_free - r.t_alloc), r.token.stream});
        entry_of.push_back(std::uint32_t(k));
        break;
      }
      if (begin < oldest + period) break;
    }
  }
  std::vector<std::size_t> offsets;
  std::vector<bool> fence;
  plan.bytes = pack_cyclic(items, ticks, margin_, offsets, fence);
  std::vector<std::int64_t> delta(ticks + 1, 0);  // live bytes over the circle, for live_peak
  for (std::size_t i = 0; i < items.size(); ++i) {
    Plan::Entry& e = plan.entries[entry_of[i]];
    e.offset = offsets[i];
    e.fence = fence[i];
    const PackItem& it = items[i];
    const auto size = std::int64_t(it.size);
    if (it.end <= ticks) {
      delta[it.start] += size;
      delta[it.end] -= size;
    } else {
      delta[it.start] += size;
      delta[ticks] -= size;
      delta[0] += size;
      delta[it.end - ticks] -= size;
    }
  }
  std::vector<std::int64_t> live_at(ticks);  // planned bytes live during each tick
  std::int64_t live = 0, peak = 0;
  for (std::uint64_t t = 0; t < ticks; ++t) peak = std::max(peak, live_at[t] = live += delta[t]);
  plan.live_peak = std::size_t(peak);
  // The plan goes in use just before the request at which its own blocks hold least (the
  // previous iteration's instances of those, still live in the pool, then sit beside the new
  // range), and of those points where the job holds least.
  std::vector<std::int64_t> planned_size(period, 0);
  for (std::size_t i = 0; i < items.size(); ++i)
    planned_size[entry_of[i]] = std::int64_t(items[i].size);
  std::pair<std::int64_t, std::size_t> least{INT64_MAX, SIZE_MAX};
  for (std::size_t k = 0; k < period && find_quiet; ++k) {
    const std::uint64_t t = at(first + k).t_alloc - t0;
    const std::pair<std::int64_t, std::size_t> here{live_at[t] - planned_size[k],
                                                    at(first + period + k).live};
    if (here < least) {
      least = here;
      plan.quiet = k;
    }
  }
  // Windows met once in the period locate a request in it.
  TokenWindow w;
  std::unordered_map<std::uint64_t, std::int64_t> where;
  const auto n = std::int64_t(period);
  for (std::int64_t k = -TokenWindow::kWindow + 1; k < n; ++k) {
    w.push(plan.entries[std::size_t((k % n + n) % n)].token);  // periods under the window too
    if (k < 0) continue;
    auto [it, fresh] = where.try_emplace(w.hash(), k);
    if (!fresh) it->second = -1;  // ambiguous
  }
  for (const auto& [hash, k] : where) {
    if (k >= 0) plan.resume.emplace(hash, std::uint32_t(k));
  }
  return plan;
}

}  // namespace cuarena::detail
