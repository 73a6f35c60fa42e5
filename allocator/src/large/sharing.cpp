#include "large/sharing.hpp"

#include <unordered_map>

#include "tuning.hpp"

namespace cuarena::detail {

void Sharing::after_free(StreamFreeLists& sp) {
  // Keep one sweep in flight per stream, looked at every sweep_interval frees, so blocks freed a
  // while ago are already shared when another stream or a shortage needs them.
  if (sp.seq % ctx_.config.sweep_interval != 0) return;
  if (lazy_) {
    // The poll and the sharing are owed to the pool's next request (settle()): only a request can
    // reuse what is shared, and the free stays a few set operations and one event record.
    if (sp.unpolled_reach != 0) {  // the sweep point before, no request since: poll it now
      for (auto it = owed_.rbegin(); it != owed_.rend(); ++it) {
        if (it->sp == &sp && it->polls != 0) {
          poll_owed(*it);
          break;
        }
      }
    }
    // Placed unified, warm()'s order is the order blocks were shared in: mark this sweep point.
    const auto sentinel = [&] { return index_.unified() ? push_sentinel() : nullptr; };
    if (sp.events.size() < tuning::kMaxSweepsPerStream) {
      if (!sp.events.empty()) {
        owed_.push_back({&sp, 0, sentinel(), sp.events.size()});
        sp.unpolled_reach = sp.events.back().second;
      }
    } else {  // full: the record below supersedes the newest sweep, so poll them now
      sweeps_.poll(sp, [&](std::uint64_t covered) {
        owed_.push_back({&sp, covered, sentinel(), 0});
      });
    }
    // A long run of frees with no request in between settles now and then, to bound owed_.
    if (owed_.size() > tuning::kMaxOwedShares) settle();
  } else {
    sweeps_.poll(sp, [&](std::uint64_t covered) { share_covered(sp, covered); });
  }
  start_sweep(sp);
}

void Sharing::settle() {
  if (owed_.empty()) return;
  // In the order the sweeps completed, as if each had been shared at its poll. (Sharing coalesces
  // only shared blocks, so the entries still to come need not be owed meanwhile.)
  std::vector<Owed> owed;
  owed.swap(owed_);
  for (Owed& o : owed) {
    if (o.polls != 0) poll_owed(o);
    index_.set_warm_before(o.sentinel);
    share_covered(*o.sp, o.covered);
    if (o.sentinel != nullptr) drop_sentinel(o.sentinel);
  }
  index_.set_warm_before(nullptr);
  owed.clear();
  if (owed_.empty()) owed_.swap(owed);  // keep the capacity
}

void Sharing::record_sweeps() {
  settle();
  // Covers everything each listed stream freed, or has nothing new to cover (a stream under
  // graph capture stays listed: StreamSweeps::record_all).
  sweeps_.record_all(
      [&](StreamSweeps::Stream& s) { start_sweep(static_cast<StreamFreeLists&>(s)); });
}

void Sharing::poll_sweeps() {
  settle();
  sweeps_.poll_all([&](StreamSweeps::Stream& s, std::uint64_t covered) {
    share_covered(static_cast<StreamFreeLists&>(s), covered);
  });
}

void Sharing::synchronize() {
  // Finish pending sweeps, cover everything freed since, and finish those too.
  for (int round = 0; round < 2; ++round) {
    sweeps_.wait_all();
    poll_sweeps();
    if (round == 0) record_sweeps();
  }
  ++ctx_.stats.num_sync_all_streams;
}

Block* Sharing::push_sentinel() {
  if (spare_sentinels_.empty()) {
    sentinels_.push_back(std::make_unique<Block>());
    spare_sentinels_.push_back(sentinels_.back().get());
  }
  Block* sentinel = spare_sentinels_.back();
  spare_sentinels_.pop_back();
  index_.warm().push_back(sentinel);
  return sentinel;
}

void Sharing::drop_sentinel(Block* sentinel) {
  index_.warm().erase(sentinel);
  spare_sentinels_.push_back(sentinel);
}

void Sharing::poll_owed(Owed& o) {
  CUARENA_ASSERT(o.polls <= o.sp->events.size() && o.sp->unpolled_reach != 0,
                 "poll_owed: the stream's sweeps were polled since its sweep point");
  sweeps_.poll(
      *o.sp, [&](std::uint64_t covered) { o.covered = covered; }, o.polls);
  o.polls = 0;
  o.sp->unpolled_reach = 0;
}

void Sharing::poll_unpolled() {
  for (Owed& o : owed_) {
    if (o.polls != 0) poll_owed(o);
  }
}

void Sharing::share_covered(StreamFreeLists& sp, std::uint64_t covered) {
  while (!sp.fifo.empty() && sp.fifo.front()->free_seq <= covered) share_(sp.fifo.front());
  while (!sp.retired.empty() && sp.retired.front()->free_seq <= covered) share_(sp.retired.front());
}

void Sharing::check_invariants() const {
  CUARENA_CHECK(owed_.empty() || lazy_, "sharing owed in segment mode");
  std::unordered_map<const StreamFreeLists*, int> unpolled;
  for (const Owed& o : owed_) {
    CUARENA_CHECK(o.covered <= o.sp->done, "sharing owed past a stream's completed sweeps");
    if (o.polls != 0) {
      CUARENA_CHECK(o.covered == 0, "an unpolled entry with a cover");
      CUARENA_CHECK(o.polls <= o.sp->events.size(), "an unpolled entry past the sweeps in flight");
      CUARENA_CHECK(o.sp->unpolled_reach == o.sp->events[o.polls - 1].second,
                    "an unpolled entry whose stream forgot how far its sweeps reach");
      CUARENA_CHECK(++unpolled[o.sp] <= 1, "two unpolled entries of one stream");
    }
    CUARENA_CHECK(index_.unified() == (o.sentinel != nullptr && o.sentinel->lru.linked),
                  "owed sharing without its place in the LRU list");
  }
  for (const auto& [id, sp] : index_.streams()) {
    CUARENA_CHECK(sp.unpolled_reach == 0 || unpolled.count(&sp) != 0,
                  "a stream's unpolled entry is missing");
  }
}

}  // namespace cuarena::detail
