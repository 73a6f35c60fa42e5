// LoopPlanner: learns the requests of a repeating loop and plans where each one goes.
//
// A training or serving loop asks for the same sizes on the same streams in the same order every
// iteration. The planner watches the sequence of requests (rounded size, stream), finds its
// period P (the last P requests repeat the P before them), and from the lifetimes of the blocks of
// the earlier period computes one fixed offset per request inside a single range: a cyclic
// interval packing, greedy by size (TFLite's "greedy by size" offset planner: Pisarchyk and Lee,
// "Efficient Memory Management for Deep Neural Net Inference", 2020), with lifetimes on a circle
// because a block allocated late in one iteration may be freed early in the next. Served at those
// offsets from a range that stays mapped (PlannedRange), every iteration finds its memory mapped
// where it needs it: no driver calls, and the range is close to the loop's peak of live bytes.
//
// Time is counted in events (an allocation or a free each tick). The planner never sees a
// device and never allocates device memory; it is pure policy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cuarena/types.hpp"

namespace cuarena::detail {

/// A request's identity in the loop: its rounded size and stream.
struct Token {
  std::size_t size = 0;
  StreamId stream = 0;
  bool operator==(const Token&) const = default;
};

/// The hash of the last kWindow tokens, rolling: finds where in a loop a request sequence is.
class TokenWindow {
 public:
  static constexpr int kWindow = 8;
  void push(const Token& t);
  /// Valid once kWindow tokens were pushed.
  bool full() const { return count_ >= kWindow; }
  std::uint64_t hash() const { return hash_; }
  static std::uint64_t token_hash(const Token& t);

 private:
  std::uint64_t ring_[kWindow] = {};
  std::uint64_t hash_ = 0;
  int count_ = 0;
};

/// Where each request of one loop iteration goes.
struct Plan {
  static constexpr std::size_t kUnplanned = SIZE_MAX;
  struct Entry {
    Token token;
    std::size_t offset = kUnplanned;  ///< into the planned range; kUnplanned: served elsewhere
    /// A later block on another stream overlaps this one: its free must be fenced by an event.
    bool fence = false;
  };
  std::vector<Entry> entries;  ///< one per request of the period, in request order
  std::size_t bytes = 0;       ///< extent of the range: max(offset + size)
  std::size_t live_peak = 0;   ///< most bytes of planned blocks live at once (the lower bound)
  /// Most bytes the job had allocated during the iteration planned (planned blocks or not).
  std::size_t job_peak = 0;
  /// The entry whose request comes when the plan's own blocks hold least (then the job
  /// itself): where the plan is put in use.
  std::size_t quiet = 0;
  /// Window hash -> the entry that follows that window, for windows met once in the period:
  /// lets the arena find its place again after a request the plan did not foresee.
  std::unordered_map<std::uint64_t, std::uint32_t> resume;
};

/// One block of the packing problem: `size` bytes live over [start, end) on a circle of
/// `period` ticks (end may pass `period`: the block wraps into the next iteration).
struct PackItem {
  std::size_t size;
  std::uint64_t start, end;
  StreamId stream;
};
/// Offsets (same order as `items`) such that no two blocks whose lifetimes overlap on the circle
/// overlap in address; blocks of different streams must also be `margin` ticks apart, so an
/// event recorded at the first's free has time to complete before the second reuses its bytes.
/// Greedy by size, lowest offset that fits. `fence[i]` is set when a block of another stream
/// overlaps i's bytes later in the period. Returns the extent. O(n x blocks live at once).
std::size_t pack_cyclic(const std::vector<PackItem>& items, std::uint64_t period,
                        std::uint64_t margin, std::vector<std::size_t>& offsets,
                        std::vector<bool>& fence);

class LoopPlanner {
 public:
  /// Loops longer than `max_period` requests are not planned (the history holds 2x that).
  explicit LoopPlanner(std::size_t max_period, std::uint64_t cross_stream_margin)
      : max_period_(max_period), margin_(cross_stream_margin) {}

  /// Records a request made while `live_bytes` were allocated; returns its sequence number, for
  /// on_free().
  std::uint64_t on_allocate(const Token& token, std::size_t live_bytes);
  /// Records the free of request `seq` (the block is reusable from now on).
  void on_free(std::uint64_t seq);

  /// A plan for a period confirmed longer than the last one handed out, if there is one;
  /// `phase` is the entry the next request corresponds to. A loop inside the loop (one layer of
  /// many) repeats first; the loop itself, longer, replaces its plan once it has repeated.
  std::optional<Plan> take_plan(std::size_t& phase);
  /// `plan` (one take_plan() handed out) rebuilt from the newest iteration that has ended: the one
  /// before the iteration in progress, whose entry `last_entry` was request `last_seq`. Each
  /// entry takes its newest instance freed within an iteration, so a request an early iteration
  /// made once for good (an optimizer's state, matching a later one's gradient by size) no longer
  /// leaves its entry unplanned. The quiet entry stays. nullopt when the history lacks that
  /// iteration or its requests are not the plan's.
  std::optional<Plan> refresh(const Plan& plan, std::uint64_t last_seq,
                              std::size_t last_entry) const;
  /// Forgets the plan handed out (its range was given back): any period may be planned again.
  void forget() {
    planned_period_ = 0;
    refused_period_ = 0;
  }
  /// The plan take_plan() handed out was not used (it packed too wide): its period's multiples
  /// (the same loop, repeated) are not planned either, until forget().
  void refuse(std::size_t period) { refused_period_ = period; }

  const TokenWindow& window() const { return window_; }
  std::uint64_t next_seq() const { return first_seq_ + reqs_.size(); }

 private:
  static constexpr std::uint64_t kLive = UINT64_MAX;
  struct Request {
    Token token;
    std::uint64_t t_alloc;
    std::size_t live;  ///< bytes allocated when it was requested
    std::uint64_t t_free = kLive;
  };
  struct Candidate {
    std::size_t period;
    std::size_t matched;  ///< consecutive requests equal to the one `period` before
  };
  const Request& at(std::uint64_t seq) const { return reqs_[seq - first_seq_]; }
  void update_candidates(std::uint64_t seq);
  /// Starts following `period` as a candidate if the window ending at `seq` repeats there.
  void propose(std::uint64_t seq, std::size_t period);
  /// The plan of the iteration of `period` requests starting at request `first`. An entry whose
  /// request there is live or outlives an iteration takes the instance one period earlier
  /// instead, back to `oldest` (a multiple of `period` before `first`), else stays unplanned.
  /// `find_quiet`: choose Plan::quiet (needs the next iteration recorded too).
  Plan build(std::uint64_t first, std::size_t period, std::uint64_t oldest, bool find_quiet) const;

  static constexpr std::size_t kMaxCandidates = 32;
  static constexpr std::size_t kOccurrences = 4;  ///< earlier occurrences kept per window
  const std::size_t max_period_;
  const std::uint64_t margin_;
  std::deque<Request> reqs_;  ///< the last 2 x max_period requests
  std::uint64_t first_seq_ = 0;
  std::uint64_t clock_ = 0;
  TokenWindow window_;
  /// Window hash -> the seqs that ended it last, newest first (0: none).
  std::unordered_map<std::uint64_t, std::array<std::uint64_t, kOccurrences>> last_seen_;
  std::vector<Candidate> candidates_;
  std::size_t planned_period_ = 0;      ///< period of the last plan handed out, until forget()
  std::size_t refused_period_ = 0;      ///< its multiples are not planned (refuse()), or 0
  std::optional<std::uint64_t> ready_;  ///< the last seq of a confirmed, unplanned period
  std::size_t ready_period_ = 0;
};

}  // namespace cuarena::detail
