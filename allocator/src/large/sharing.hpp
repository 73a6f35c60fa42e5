// Sharing: when owned free and retired blocks become shared.
//
// A free block owned by stream S becomes shared once an event recorded on S after the free has
// completed (a sweep, StreamSweeps), or at once if it was never used; a retired block's old
// mapping is dropped then too (BlockPool::make_shared does what sharing a block does).
//
// Frees defer sharing (mapping backends): the sweep point a free reaches every sweep_interval frees
// leaves its poll and the sharing of what completed owed (owed_, an unpolled entry), and every
// pool entry point but a free settles first (settle()), so requests see the pool as if the
// sweep point had polled and shared (the poll, later, sees at least as much of the device's
// progress). The free pays only the sweep's record. Until settled a block stays indexed as
// owned; once polled it merges with nothing (owes()), and a free whose coalescing could reach a
// block an unpolled entry may owe polls first (near()). Placed unified, a free also absorbs
// shared neighbours, so a free whose coalescing could reach a block owed settles first, and
// sharing puts blocks in warm() where the sweep point stood (a sentinel): polling at the sweep
// point and polling later then make the same placements and driver calls. Segment mode shares at
// once (its frees absorb any shared neighbour).
//
// Invariants (check_invariants()):
//   owed_ empty when !lazy
//   o in owed_  =>  o.covered <= o.sp->done
//   o unpolled (o.polls != 0)  =>  o.covered == 0, o.polls <= |o.sp->events|,
//                                  o.sp->unpolled_reach == o.sp->events[o.polls - 1].second
//   a stream has an unpolled entry  <=>  its unpolled_reach != 0  (at most one)
//   o in owed_  =>  (o.sentinel in warm())  ==  unified placement
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "front/context.hpp"
#include "large/free_index.hpp"
#include "large/stream_sweeps.hpp"

namespace cuarena::detail {

class Sharing {
 public:
  /// `lazy`: frees leave sharing owed (mapping backends); `share(b)` turns owned free or retired
  /// block b, taken out of no index yet, into a shared one.
  Sharing(Context& ctx, FreeIndex& index, bool lazy, std::function<void(Block*)> share)
      : ctx_(ctx),
        index_(index),
        sweeps_(ctx.backend, ctx.stats),
        lazy_(lazy),
        share_(std::move(share)) {}
  Sharing(const Sharing&) = delete;
  Sharing& operator=(const Sharing&) = delete;

  /// A free or retirement on sp's stream: its free number.
  std::uint64_t note_free(StreamFreeLists& sp) { return sweeps_.note_free(sp); }
  /// After a free on sp's stream (coalesced and indexed): every sweep_interval frees, keeps one
  /// sweep in flight, polling (or leaving owed) the ones before. Non-blocking.
  void after_free(StreamFreeLists& sp);
  /// Shares what completed sweeps cover and frees left owed, in the order they completed. Its
  /// driver calls are those sharing makes (BlockPool::make_shared); throws BackendError.
  void settle();
  /// Records a sweep event on every stream with unswept blocks and none pending. Non-blocking.
  void record_sweeps();
  /// Settles, then shares the blocks covered by completed sweep events. Non-blocking.
  void poll_sweeps();
  /// Blocks until every stream's free and retired blocks are shared.
  void synchronize();

  /// b is an owned free or retired block that a completed sweep covers, its sharing owed: it
  /// merges with nothing until settled.
  bool owes(const Block* b) const {
    if (owed_.empty()) return false;
    const StreamFreeLists* sp = index_.owner(b);
    return sp != nullptr && b->free_seq <= sp->done;
  }
  /// Before each step of coalescing free block b (`owned`: b is owned): polls the unpolled
  /// entries b could meet, so owes() is exact; placed unified, settles what b could absorb.
  void before_coalesce(const Block* b, bool owned) {
    if (owed_.empty()) return;
    if (near(b, [&](const Block* n) { return unpolled(n); })) poll_unpolled();
    if (index_.unified() && owned && !owed_.empty() &&
        near(b, [&](const Block* n) { return owes(n); }))
      settle();
  }

  /// Throws std::logic_error naming the first broken invariant above.
  void check_invariants() const;

 private:
  // Sharing owed by sweeps, in the order of the sweep points that polled them or left them
  // unpolled: the stream, the free number covered (0 until polled), (placed unified) the sentinel
  // in warm() where the sweep point stood, and the sweeps left unpolled: the oldest `polls` in
  // flight (0: polled).
  struct Owed {
    StreamFreeLists* sp;
    std::uint64_t covered;
    Block* sentinel;
    std::size_t polls;
  };
  /// b is an owned free or retired block that its stream's unpolled entry would cover if its
  /// sweeps completed: owes(b) is known only once they are polled.
  bool unpolled(const Block* b) const {
    const StreamFreeLists* sp = index_.owner(b);
    return sp != nullptr && b->free_seq <= sp->unpolled_reach;
  }
  /// Polls the sweeps unpolled entry `o` stands for (the oldest o.polls in flight), fixing what it
  /// covers. Precondition: no other poll of the stream since the sweep point that left it.
  void poll_owed(Owed& o);
  /// poll_owed() on every unpolled entry.
  void poll_unpolled();
  /// Coalescing detached free block b could meet a block `pred` holds for: a neighbour (free or
  /// retired), or a shared neighbour (coalesced, so its far neighbour is not shared) next to one.
  template <class Pred>
  bool near(const Block* b, Pred&& pred) const {
    for (const Block* n : {b->prev, b->next}) {
      if (n == nullptr || n->allocated) continue;
      if (pred(n)) return true;  // an owned free or retired block
      const Block* far = n == b->prev ? n->prev : n->next;
      if (n->shared && far != nullptr && pred(far)) return true;
    }
    return false;
  }
  /// A sentinel at the back of warm(), for the sharing a free leaves owed; drop_sentinel() takes
  /// it out again once that sharing is done.
  Block* push_sentinel();
  void drop_sentinel(Block* sentinel);
  /// Records a sweep on sp's stream if it has free or retired blocks no completed sweep covers.
  void start_sweep(StreamFreeLists& sp) {
    const auto uncovered = [&](const Fifo& l) {
      return !l.empty() && l.back()->free_seq > sp.done;  // sorted: the back is the newest
    };
    if (uncovered(sp.fifo) || uncovered(sp.retired)) sweeps_.record(sp);
  }
  /// Shares sp's free and retired blocks freed up to number `covered` (a completed sweep).
  void share_covered(StreamFreeLists& sp, std::uint64_t covered);

  Context& ctx_;
  FreeIndex& index_;
  StreamSweeps sweeps_;  // after index_ (its streams): its destructor releases their events
  const bool lazy_;
  std::function<void(Block*)> share_;
  std::vector<Owed> owed_;
  std::vector<std::unique_ptr<Block>> sentinels_;  // every sentinel made
  std::vector<Block*> spare_sentinels_;            // those not in warm()
};

}  // namespace cuarena::detail
