#include "fence_queue.hpp"

#include "real_driver.hpp"

namespace cuarena::shim {

bool FenceQueue::defer(DevicePtr ptr, std::size_t bytes) {
  if (!waiting_.insert(ptr).second) return false;
  open_.push_back({ptr, bytes});
  open_bytes_ += bytes;
  return true;
}

void FenceQueue::close(FenceEvents&& events) {
  if (open_.empty()) return;
  Fence f;
  f.events = std::move(events);
  f.frees.swap(open_);
  f.bytes = open_bytes_;
  closed_bytes_ += open_bytes_;
  open_bytes_ = 0;
  fences_.push_back(std::move(f));
}

bool FenceQueue::completed(Fence& f, bool legacy_orders) {
  // Events complete in no particular order; remember how far the check got.
  const RealDriver& d = RealDriver::get();
  const std::vector<FenceEvent>& others = f.events.others;
  while (f.done < others.size() && d.event_query(others[f.done].get()) == CUDA_SUCCESS) ++f.done;
  if (f.done < others.size()) return false;
  if (legacy_orders) return true;
  if (!f.legacy_done) f.legacy_done = d.event_query(f.events.legacy.get()) == CUDA_SUCCESS;
  return f.legacy_done;
}

void FenceQueue::take(Fence& f, std::vector<Freed>& out) {
  for (const Freed& x : f.frees) waiting_.erase(x.ptr);
  out.insert(out.end(), f.frees.begin(), f.frees.end());
  closed_bytes_ -= f.bytes;
}

void FenceQueue::take_completed(std::vector<Freed>& out, bool legacy_orders) {
  // Fences were closed in order on the same streams, so a later one rarely completes first;
  // stopping at the first incomplete one costs little and keeps the scan short.
  while (!fences_.empty() && completed(fences_.front(), legacy_orders)) {
    take(fences_.front(), out);
    fences_.pop_front();
  }
}

bool FenceQueue::wait_oldest(std::vector<Freed>& out, bool legacy_orders) {
  if (fences_.empty()) return false;
  Fence& f = fences_.front();
  const RealDriver& d = RealDriver::get();
  // A wait the driver refuses (a capture in global mode elsewhere) proves nothing: keep it.
  for (; f.done < f.events.others.size(); ++f.done)
    if (d.event_synchronize(f.events.others[f.done].get()) != CUDA_SUCCESS) return false;
  if (!legacy_orders && !f.legacy_done) {
    if (d.event_synchronize(f.events.legacy.get()) != CUDA_SUCCESS) return false;
    f.legacy_done = true;
  }
  take(f, out);
  fences_.pop_front();
  return true;
}

}  // namespace cuarena::shim
