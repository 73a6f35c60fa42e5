// A stand-in for the shim's RealDriver (shim/src/real_driver.cpp) in CPU tests: events and
// streams are plain structs, with the ordering model of fake_driver.hpp, so the shim's fence
// logic runs without a GPU. Linked instead of real_driver.cpp.
#include "fake_driver.hpp"

#include <cuda.h>

#include <algorithm>
#include <deque>

#include "real_driver.hpp"

struct CUevent_st {
  bool done = false;  // complete() was called, or the model completed its clock
  cuarena::shim::fake::Clock clock;
};

namespace cuarena::shim::fake {

std::deque<CUevent_st> g_events;  // every event made, kept to the end (stable addresses)
bool g_capturing = false;
std::vector<std::pair<CUstream, CUevent>> g_waits;
std::vector<CUstream> g_idle;
std::vector<CUstream> g_dead;

namespace {
Clock g_issued;                    // commands issued per stream
Clock g_done;                      // commands completed per stream (a prefix)
std::map<CUstream, Clock> g_last;  // the clock of each stream's last command

CUstream norm(CUstream s) { return s == nullptr ? CU_STREAM_LEGACY : s; }
bool blocking(CUstream s) {
  return s == CU_STREAM_PER_THREAD || (reinterpret_cast<std::uintptr_t>(s) & 1) == 0;
}
void merge(Clock& into, const Clock& from) {
  for (const auto& [s, n] : from) into[s] = std::max(into[s], n);
}
bool dead(CUstream s) { return std::find(g_dead.begin(), g_dead.end(), s) != g_dead.end(); }

/// A command on `s`, after `also` (an event it waits for).
const Clock& issue(CUstream s, const Clock* also = nullptr) {
  s = norm(s);
  Clock c = g_last[s];
  if (s == CU_STREAM_LEGACY) {
    for (const auto& [t, last] : g_last)
      if (t != CU_STREAM_LEGACY && blocking(t)) merge(c, last);
  } else if (blocking(s)) {
    merge(c, g_last[CU_STREAM_LEGACY]);
  }
  if (also != nullptr) merge(c, *also);
  c[s] = ++g_issued[s];
  return g_last[s] = std::move(c);
}

bool clock_done(const Clock& c) {
  for (const auto& [s, n] : c)
    if (g_done[s] < n) return false;
  return true;
}
}  // namespace

Clock launch(CUstream s) { return issue(s); }
Clock issued() { return g_issued; }

bool covers(const Clock& later, const Clock& earlier) {
  for (const auto& [s, n] : earlier) {
    const auto it = later.find(s);
    if ((it == later.end() || it->second < n) && g_done[s] < n) return false;
  }
  return true;
}

void finish(CUstream s) {
  for (const auto& [t, n] : g_last[norm(s)]) g_done[t] = std::max(g_done[t], n);
}

void reset() {
  g_issued.clear();
  g_done.clear();
  g_last.clear();
  g_waits.clear();
  g_idle.clear();
  g_dead.clear();
  g_capturing = false;
}

CUevent new_event() {
  g_events.emplace_back();
  return &g_events.back();
}
void complete(CUevent e) { e->done = true; }
bool completed(CUevent e) { return e->done || (!e->clock.empty() && clock_done(e->clock)); }

}  // namespace cuarena::shim::fake

namespace cuarena::shim {

const RealDriver& RealDriver::get() {
  static const RealDriver table = [] {
    RealDriver t;
    t.event_create = [](CUevent* e, unsigned) {
      *e = fake::new_event();
      return CUDA_SUCCESS;
    };
    t.event_record = [](CUevent e, CUstream s) {
      if (fake::dead(s)) return CUDA_ERROR_INVALID_HANDLE;
      e->done = false;  // a record is a new point in the stream: not reached yet
      e->clock = fake::issue(s);
      return CUDA_SUCCESS;
    };
    t.event_query = [](CUevent e) {
      return fake::completed(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    };
    t.event_synchronize = [](CUevent e) {
      e->done = true;  // the host waited until the device got there
      return CUDA_SUCCESS;
    };
    t.event_destroy = [](CUevent) { return CUDA_SUCCESS; };
    t.stream_query = [](CUstream s) {
      if (fake::dead(s)) return CUDA_ERROR_INVALID_HANDLE;
      for (CUstream i : fake::g_idle)
        if (i == s) return CUDA_SUCCESS;
      s = fake::norm(s);
      return fake::g_done[s] >= fake::g_issued[s] ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    };
    t.stream_wait_event = [](CUstream s, CUevent e, unsigned) {
      if (fake::dead(s)) return CUDA_ERROR_INVALID_HANDLE;
      fake::g_waits.emplace_back(s, e);
      fake::issue(s, &e->clock);
      return CUDA_SUCCESS;
    };
    t.stream_get_flags = [](CUstream s, unsigned* flags) {
      if (fake::dead(s)) return CUDA_ERROR_INVALID_HANDLE;
      *flags = fake::blocking(s) ? 0 : CU_STREAM_NON_BLOCKING;
      return CUDA_SUCCESS;
    };
    t.stream_get_priority = [](CUstream, int* p) {
      *p = 0;
      return CUDA_SUCCESS;
    };
    t.stream_is_capturing = [](CUstream, CUstreamCaptureStatus* st) {
      *st = fake::g_capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
      return CUDA_SUCCESS;
    };
    return t;
  }();
  return table;
}

}  // namespace cuarena::shim
