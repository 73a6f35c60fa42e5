#include "stream_registry.hpp"

#include <algorithm>
#include <string>

#include "cuarena/errors.hpp"
#include "real_driver.hpp"

namespace cuarena::shim {

namespace {
bool is_default(CUstream s) {
  return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

void check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS)
    throw BackendError(std::string("cuarena shim: ") + call + " failed (CUresult " +
                       std::to_string(int(r)) + ")");
}
}  // namespace

StreamRegistry::~StreamRegistry() {
  retired_.clear();
  newest_legacy_.reset();
  const RealDriver& d = RealDriver::get();
  for (CUevent e : *spare_) d.event_destroy(e);
  spare_->clear();
}

void StreamRegistry::add(CUstream stream, bool used) {
  if (is_default(stream)) return;
  for (Known& k : streams_) {
    if (k.stream == stream) {
      k.used = k.used || used;
      return;
    }
  }
  unsigned flags = 0;
  if (RealDriver::get().stream_get_flags(stream, &flags) != CUDA_SUCCESS)
    return;  // not a live stream
  streams_.push_back({stream, flags, used, false});
  if (flags & CU_STREAM_NON_BLOCKING) order_after_fences(stream);
}

void StreamRegistry::order_after_fences(CUstream stream) {
  if (!newest_legacy_) return;
  // Legal during another stream's capture too: `stream` is new, and the event a plain record.
  check(RealDriver::get().stream_wait_event(stream, newest_legacy_.get(), 0), "cuStreamWaitEvent");
}

std::size_t StreamRegistry::live_non_blocking() const {
  return std::size_t(std::count_if(streams_.begin(), streams_.end(), [](const Known& k) {
    return !k.parked && (k.flags & CU_STREAM_NON_BLOCKING);
  }));
}

bool StreamRegistry::retire(CUstream stream) {
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [&](const Known& k) { return k.stream == stream; });
  if (it == streams_.end()) return true;
  if (it->used) {
    it->parked = true;
    return false;
  }
  streams_.erase(it);
  retired_.push_back(record(stream));
  return true;
}

CUstream StreamRegistry::reuse(unsigned flags, int priority) {
  const RealDriver& d = RealDriver::get();
  for (Known& k : streams_) {
    int p = 0;
    if (k.parked && k.flags == flags && d.stream_get_priority(k.stream, &p) == CUDA_SUCCESS &&
        p == priority) {
      k.parked = false;
      if (flags & CU_STREAM_NON_BLOCKING) order_after_fences(k.stream);
      return k.stream;
    }
  }
  return nullptr;
}

FenceEvent StreamRegistry::try_record(CUstream stream) {
  const RealDriver& d = RealDriver::get();
  CUevent e = nullptr;
  if (!spare_->empty()) {
    e = spare_->back();
    spare_->pop_back();
  } else {
    check(d.event_create(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  // The deleter keeps the spare list alive, so an event may outlive the registry.
  FenceEvent ev(e, [spare = spare_](CUevent ev) { spare->push_back(ev); });
  if (d.event_record(e, stream) != CUDA_SUCCESS) return nullptr;  // back to the spares
  return ev;
}

FenceEvent StreamRegistry::record(CUstream stream) {
  FenceEvent e = try_record(stream);
  if (!e) throw BackendError("cuarena shim: cuEventRecord failed");
  return e;
}

bool StreamRegistry::any_capturing() const {
  const RealDriver& d = RealDriver::get();
  // Any answer but "not capturing" counts as capturing: recording or serving then could break it.
  auto capturing = [&](CUstream s) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return d.stream_is_capturing(s, &status) != CUDA_SUCCESS ||
           status != CU_STREAM_CAPTURE_STATUS_NONE;
  };
  return !capturing_.empty() || capturing(CU_STREAM_LEGACY);
}

void StreamRegistry::capture_ends(CUstream stream) {
  auto it = std::find(capturing_.begin(), capturing_.end(), stream);
  if (it != capturing_.end()) capturing_.erase(it);
}

bool StreamRegistry::record_fence() {
  if (any_capturing()) return false;
  const RealDriver& d = RealDriver::get();
  const auto non_blocking = [](const Known& k) { return (k.flags & CU_STREAM_NON_BLOCKING) != 0; };
  // A stream the driver refuses was destroyed behind the hooks: it has nothing to order.
  std::vector<CUstream> gone;
  // 1. The legacy stream waits for what the non-blocking streams (parked ones too: their work
  //    still runs) have queued. Recording and waiting cost about a tenth of asking a stream
  //    whether it is idle (bench/shim/fence_costs.cpp), and an idle stream's event is complete.
  for (const Known& k : streams_) {
    if (!non_blocking(k)) continue;
    const FenceEvent e = try_record(k.stream);
    if (!e) {
      gone.push_back(k.stream);
      continue;
    }
    check(d.stream_wait_event(CU_STREAM_LEGACY, e.get(), 0), "cuStreamWaitEvent");
  }
  // (A wait on a completed event costs less than asking whether it has completed.)
  for (const FenceEvent& e : retired_)
    check(d.stream_wait_event(CU_STREAM_LEGACY, e.get(), 0), "cuStreamWaitEvent");
  retired_.clear();  // the legacy stream's event below covers them from now on
  // 2. The legacy stream's event: after every earlier command of the context.
  newest_legacy_ = record(CU_STREAM_LEGACY);
  // 3. Every later command of a live non-blocking stream after it.
  for (const Known& k : streams_) {
    if (!non_blocking(k) || k.parked) continue;
    if (d.stream_wait_event(k.stream, newest_legacy_.get(), 0) != CUDA_SUCCESS)
      gone.push_back(k.stream);
  }
  std::erase_if(streams_, [&](const Known& k) {
    return std::find(gone.begin(), gone.end(), k.stream) != gone.end();
  });
  return true;
}

}  // namespace cuarena::shim
