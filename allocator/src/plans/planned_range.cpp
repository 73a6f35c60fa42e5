#include "plans/planned_range.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "support/assert.hpp"

namespace cuarena::detail {

PlannedRange::PlannedRange(DeviceBackend& backend, Plan plan, std::size_t phase, bool stream_waits,
                           std::int64_t& waits_made)
    : backend_(backend),
      plan_(std::move(plan)),
      cursor_(phase),
      may_wait_(stream_waits),
      waits_made_(waits_made) {
  CUARENA_ASSERT(!plan_.entries.empty() && cursor_ < plan_.entries.size(),
                 "a plan needs entries and a phase among them");
}

void PlannedRange::replan(Plan fresh) {
  CUARENA_ASSERT(trial() && fresh.entries.size() == plan_.entries.size(),
                 "replan: only a plan on trial, by one of the same period");
  CUARENA_ASSERT_INTERNAL(
      std::equal(fresh.entries.begin(), fresh.entries.end(), plan_.entries.begin(),
                 [](const Plan::Entry& a, const Plan::Entry& b) { return a.token == b.token; }),
      "replan: not the same requests");
  plan_ = std::move(fresh);
}

void PlannedRange::attach(Block* backing) {
  CUARENA_ASSERT(
      trial() && backing != nullptr && backing->allocated && backing->size >= plan_.bytes,
      "a planned arena needs an allocated block as large as its plan");
  backing_ = backing;
  base_ = backing->addr;
  bytes_ = backing->size;
  held_.emplace(base_, backing);
}

Block* PlannedRange::piece(DevicePtr ptr) const {
  if (!contains(ptr)) return nullptr;
  Block* b = std::prev(held_.upper_bound(ptr))->second;
  return ptr < b->end() ? b : nullptr;
}

void PlannedRange::unplace(DevicePtr ptr) {
  const auto it = live_.find(std::size_t(ptr - base_));
  CUARENA_ASSERT(contains(ptr) && it != live_.end(), "unplace: not a block of the arena");
  live_.erase(it);
}

std::vector<Block*> PlannedRange::carve(BlockPool& pool, std::size_t min_gap) {
  std::vector<Block*> out;
  if (trial() || backing_ == nullptr) return out;  // on trial, or carved already
  Block* piece = held_.begin()->second;            // [pos, end): not yet cut
  held_.clear();
  DevicePtr pos = base_;
  auto cut = [&](DevicePtr lo, DevicePtr hi) {  // gives [lo, hi) of `piece` to the pool
    if (lo > piece->addr) {
      Block* rest = pool.split_allocated(piece, lo);
      held_.emplace(piece->addr, piece);
      piece = rest;
    }
    if (hi < piece->end()) {
      Block* rest = pool.split_allocated(piece, hi);
      out.push_back(piece);
      piece = rest;
    } else {
      out.push_back(piece);
      piece = nullptr;
    }
  };
  for (const auto& [offset, live] : live_) {
    const DevicePtr lo = base_ + offset;
    if (lo - pos >= min_gap) cut(pos, lo);
    pos = std::max(pos, base_ + live.end);
  }
  if (piece != nullptr) {
    // With no live block the whole range goes back, however small.
    if (live_.empty() || base_ + bytes_ - pos >= min_gap) cut(pos, base_ + bytes_);
    if (piece != nullptr) held_.emplace(piece->addr, piece);
  }
  backing_ = nullptr;
  return out;
}

PlannedRange::~PlannedRange() {
  for (const Fence& f : fences_) backend_.release_event(f.event);
}

DevicePtr PlannedRange::place(const Token& token, const TokenWindow& window) {
  const std::size_t n = plan_.entries.size();
  std::size_t k = cursor_;
  if (!synced_ || !(plan_.entries[k].token == token)) {
    synced_ = false;
    const auto it = window.full() ? plan_.resume.find(window.hash()) : plan_.resume.end();
    if (it == plan_.resume.end() || !(plan_.entries[it->second].token == token)) {
      ++missed_;
      return 0;
    }
    k = it->second;
    synced_ = true;
  }
  cursor_ = k + 1 == n ? 0 : k + 1;
  if (followed_ < n) ++followed_;
  if (followed_ == n && cursor_ == plan_.quiet) ++quiet_visits_;
  const Plan::Entry& e = plan_.entries[k];
  if (trial() || e.offset == Plan::kUnplanned) return 0;
  if (!available(e.offset, token.size, token.stream)) return 0;
  live_.emplace(e.offset, Live{e.offset + token.size, token.stream, e.fence});
  if (std::find(streams_.begin(), streams_.end(), token.stream) == streams_.end())
    streams_.push_back(token.stream);
  return base_ + e.offset;
}

bool PlannedRange::available(std::size_t offset, std::size_t size, StreamId stream) {
  const std::size_t end = offset + size;
  auto next = live_.lower_bound(offset);
  if (next != live_.end() && next->first < end) return false;
  if (next != live_.begin() && std::prev(next)->second.end > offset) return false;
  to_wait_.clear();
  for (std::size_t i = 0; i < fences_.size();) {
    Fence& f = fences_[i];
    const bool done = backend_.event_completed(f.event);
    if (done) {
      backend_.release_event(f.event);
      f = fences_.back();
      fences_.pop_back();
      continue;
    }
    if (f.stream != stream && f.offset < end && offset < f.end) {
      if (!may_wait_) return false;
      to_wait_.push_back(&f);
    }
    ++i;
  }
  // A stream under graph capture can be ordered after nothing outside it: the bytes are busy.
  if (!to_wait_.empty() && backend_.stream_capturing(stream)) return false;
  // The device orders the request's stream after those frees (a backend that cannot: the
  // bytes are busy): per other stream, a wait for its newest such fence, unless the stream
  // waited for that one or a newer one already. The fences stay until done: another stream
  // may need them too.
  std::sort(to_wait_.begin(), to_wait_.end(),
            [](const Fence* a, const Fence* b) { return a->seq > b->seq; });
  for (const Fence* f : to_wait_) {
    auto w = std::find_if(waited_.begin(), waited_.end(),
                          [&](const Waited& x) { return x.to == stream && x.from == f->stream; });
    if (w != waited_.end() && w->seq >= f->seq) continue;
    if (!backend_.stream_wait_event(stream, f->event)) return false;
    ++waits_made_;
    if (w == waited_.end()) {
      waited_.push_back({stream, f->stream, f->seq});
    } else {
      w->seq = f->seq;
    }
  }
  return true;
}

Block* PlannedRange::free(DevicePtr ptr) {
  const auto it = live_.find(std::size_t(ptr - base_));
  CUARENA_ASSERT(contains(ptr) && it != live_.end(),
                 "freeing a block the planned arena does not hold");
  if (it->second.fence)
    fences_.push_back({it->first, it->second.end, it->second.stream,
                       backend_.record_event(it->second.stream), ++fence_seq_});
  live_.erase(it);
  if (backing_ != nullptr) return nullptr;  // not carved: the whole backing stays
  // The held piece that held ptr: empty now unless another live block lies in it.
  const auto piece = std::prev(held_.upper_bound(ptr));
  Block* b = piece->second;
  const auto next = live_.lower_bound(std::size_t(b->addr - base_));
  if (next != live_.end() && base_ + next->first < b->end()) return nullptr;
  held_.erase(piece);
  return b;
}

void PlannedRange::check_invariants() const {
  auto broken = [](const std::string& what) {
    throw std::logic_error("cuarena invariant violated: planned arena: " + what);
  };
  if (cursor_ >= plan_.entries.size()) broken("cursor past the plan");
  if (held_.empty()) {
    if (!live_.empty()) broken("blocks live in an arena holding no memory");
    return;
  }
  for (const auto& [addr, piece] : held_) {
    if (!piece->allocated || piece->addr != addr) broken("held piece not an allocated block");
    if (backing_ == nullptr) {
      auto it = live_.lower_bound(std::size_t(addr - base_));
      if (it == live_.end() || base_ + it->first >= piece->end())
        broken("carved piece holding no live block");
    }
  }
  std::size_t pos = 0;
  for (const auto& [offset, live] : live_) {
    if (offset < pos) broken("live blocks overlap at offset " + std::to_string(offset));
    if (live.end <= offset || live.end > bytes_) broken("live block outside the arena");
    auto piece = held_.upper_bound(base_ + offset);
    if (piece == held_.begin() || std::prev(piece)->second->end() < base_ + live.end)
      broken("live block outside the held pieces");
    pos = live.end;
  }
}

}  // namespace cuarena::detail
