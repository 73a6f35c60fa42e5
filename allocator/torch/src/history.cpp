#include "history.hpp"

#include <algorithm>

namespace cuarena::torch_adapter {

namespace {
thread_local std::string thread_metadata_;  // _set_memory_metadata's, per thread
}  // namespace

void History::set_thread_metadata(const std::string& metadata) { thread_metadata_ = metadata; }
std::string History::thread_metadata() { return thread_metadata_; }

void History::configure(bool enabled, CDA::CreateContextFn recorder, std::size_t max_entries,
                        CDA::RecordContext when, bool clear, const std::vector<std::string>& skip) {
  std::lock_guard lock(mu_);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : CDA::RecordContext::NEVER;
  max_entries_ = std::max<std::size_t>(max_entries, 1);
  skip_.clear();
  for (const std::string& name : skip) skip_.insert(int(CDA::parseTraceEntryAction(name)));
  if (clear || !enabled) {
    rings_.clear();
    if (!enabled) contexts_.clear();
  }
  for (Ring& r : rings_) {  // a smaller ring keeps the newest entries, oldest first
    if (r.entries.size() > max_entries_) {
      std::rotate(r.entries.begin(), r.entries.begin() + std::ptrdiff_t(r.next), r.entries.end());
      r.entries.erase(r.entries.begin(), r.entries.end() - std::ptrdiff_t(max_entries_));
      r.next = 0;
    }
  }
  enabled_.store(enabled, std::memory_order_relaxed);
  wanted_.store(enabled || !trackers_.empty(), std::memory_order_relaxed);
}

void History::attach_tracker(CDA::AllocatorTraceTracker tracker) {
  std::lock_guard lock(mu_);
  trackers_.push_back(std::move(tracker));
  wanted_.store(true, std::memory_order_relaxed);
}

void History::push(c10::DeviceIndex device, const CDA::TraceEntry& te) {
  if (rings_.size() <= std::size_t(device)) rings_.resize(std::size_t(device) + 1);
  Ring& r = rings_[std::size_t(device)];
  if (r.entries.size() < max_entries_) {
    r.entries.push_back(te);
  } else {
    r.entries[r.next] = te;
    r.next = (r.next + 1) % max_entries_;
  }
}

std::pair<CDA::CreateContextFn, CDA::RecordContext> History::stack_settings() const {
  std::lock_guard lock(mu_);
  return {recorder_, when_};
}

bool History::skipped(Action action) const { return skip_.count(int(action)) != 0; }

void History::record(Action action, c10::DeviceIndex device, std::size_t addr, std::size_t size,
                     void* stream, c10::MempoolId_t pool) {
  if (!wanted()) return;
  // Gather the Python/C++ stack outside the lock: it may take the GIL.
  const auto [recorder, when] = stack_settings();
  std::shared_ptr<c10::GatheredContext> ctx;
  const bool stack = recorder != nullptr &&
                     ((action == Action::ALLOC && when >= CDA::RecordContext::STATE) ||
                      (action == Action::FREE_REQUESTED && when == CDA::RecordContext::ALL));
  if (stack) ctx = recorder();
  CDA::TraceEntry te =
      make_trace_entry(action, device, addr, size, stream, pool, c10::getApproximateTime(),
                       when >= CDA::RecordContext::ALLOC || action != Action::ALLOC ? ctx : nullptr,
                       thread_metadata_);
  std::vector<CDA::AllocatorTraceTracker> trackers;
  {
    std::lock_guard lock(mu_);
    if (action == Action::ALLOC && ctx) contexts_[addr] = ctx;
    if (enabled() && !skipped(action) && device >= 0) push(device, te);
    trackers = trackers_;
  }
  for (const auto& t : trackers) t(te);
}

void History::record_reservation(c10::DeviceIndex device, std::size_t addr, std::int64_t bytes) {
  if (!enabled() || device < 0 || bytes == 0) return;
  const Action action = bytes > 0 ? Action::SEGMENT_MAP : Action::SEGMENT_UNMAP;
  const auto size = std::size_t(bytes > 0 ? bytes : -bytes);
  const CDA::TraceEntry te = make_trace_entry(action, device, addr, size, nullptr, {0, 0},
                                              c10::getApproximateTime(), nullptr, thread_metadata_);
  std::lock_guard lock(mu_);
  if (!skipped(action)) push(device, te);
}

std::shared_ptr<c10::GatheredContext> History::context_of(std::size_t addr) const {
  std::lock_guard lock(mu_);
  auto it = contexts_.find(addr);
  return it == contexts_.end() ? nullptr : it->second;
}

void History::forget(std::size_t addr) {
  if (!wanted()) return;
  std::lock_guard lock(mu_);
  contexts_.erase(addr);
}

std::vector<std::vector<CDA::TraceEntry>> History::traces(int devices) const {
  std::lock_guard lock(mu_);
  auto to_unix_us = clock_.makeConverter();
  std::vector<std::vector<CDA::TraceEntry>> out(std::size_t(std::max(devices, 0)));
  for (std::size_t d = 0; d < out.size() && d < rings_.size(); ++d) {
    const Ring& r = rings_[d];
    out[d].reserve(r.entries.size());
    for (std::size_t i = 0; i < r.entries.size(); ++i) {
      out[d].push_back(r.entries[(r.next + i) % r.entries.size()]);
      auto& t = out[d].back().time_;
      t.t_ = to_unix_us(t.approx_t_) / 1000;
    }
  }
  return out;
}

void History::annotate(const std::vector<std::pair<std::string, std::string>>& md,
                       c10::DeviceIndex device) {
  if (!enabled()) return;
  CDA::AnnotationEntry e(device, c10::getApproximateTime());
  for (const auto& [k, v] : md) e.recordUserMetadata(k, v);
  std::lock_guard lock(mu_);
  annotations_.push_back(std::move(e));
}

void History::annotate_allocation(c10::DeviceIndex device, std::size_t addr, std::size_t size,
                                  void* stream, const std::string& metadata) {
  if (!kTraceAnnotate || !enabled() || device < 0) return;
  const auto [recorder, when] = stack_settings();
  // The annotation site's stack, kept as an allocation's would be.
  std::shared_ptr<c10::GatheredContext> ctx;
  if (recorder != nullptr && when >= CDA::RecordContext::ALLOC) ctx = recorder();
  CDA::TraceEntry te = make_trace_entry(annotate_action(), device, addr, size, stream, {0, 0},
                                        c10::getApproximateTime(), ctx, metadata);
  std::vector<CDA::AllocatorTraceTracker> trackers;
  {
    std::lock_guard lock(mu_);
    push(device, te);
    trackers = trackers_;
  }
  for (const auto& t : trackers) t(te);
}

std::vector<CDA::AnnotationEntry> History::annotations() const {
  std::lock_guard lock(mu_);
  auto to_unix_us = clock_.makeConverter();
  std::vector<CDA::AnnotationEntry> out = annotations_;
  for (auto& a : out) a.time_.t_ = to_unix_us(a.time_.approx_t_) / 1000;
  return out;
}

}  // namespace cuarena::torch_adapter
