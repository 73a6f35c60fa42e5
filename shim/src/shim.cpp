#include "shim.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuarena/driver_resolver.hpp"
#include "cuarena/errors.hpp"
#include "real_driver.hpp"

extern "C" __attribute__((visibility("default"))) const char* cuarena_preload_version() {
  return CUARENA_VERSION;
}

namespace cuarena::shim {

namespace {
Shim* g_shim = nullptr;

// At load, before the job's main (and so before PyTorch reads its environment).
__attribute__((constructor)) void load() { Shim::get(); }
}  // namespace

Shim& Shim::get() {
  static Shim* const shim = [] {
    g_shim = new Shim();  // never destroyed (see shim.hpp)
    std::atexit([] { g_shim->at_exit(); });
    pthread_atfork([] { g_shim->create_mu_.lock(); }, [] { g_shim->create_mu_.unlock(); },
                   [] { g_shim->after_fork_in_child(); });
    return g_shim;
  }();
  return *shim;
}

Shim::Shim() {
  try {
    config_ = ShimConfig::from_env();
  } catch (const ConfigError& e) {
    // Nothing has run yet, so nothing is lost: stop before the job starts on a wrong setting.
    std::fprintf(stderr, "cuarena: %s\n", e.what());
    std::_Exit(2);
  }
  // The exit summary and stderr logging write to a copy of stderr: coreutils' programs close
  // stderr in their own atexit handler, which runs before the shim's.
  if (const int fd = fcntl(2, F_DUPFD_CLOEXEC, 3); fd >= 0) stderr_fd_ = fd;
  if (config_.log_path == "-") {
    log_ = fdopen(stderr_fd_, "w");
  } else if (!config_.log_path.empty()) {
    log_ = std::fopen(config_.log_path.c_str(), "a");
    if (log_ == nullptr)
      std::fprintf(stderr, "cuarena: CUARENA_LOG=%s: cannot open; not logging\n",
                   config_.log_path.c_str());
  }
  if (!config_.trace_path.empty()) {
    // Said once, at the start: the job runs on, and the recording goes where it can be written.
    if (const std::string why = TraceRecorder::cannot_write(config_.trace_path); !why.empty()) {
      const std::string fallback = TraceRecorder::fallback_path();
      std::fprintf(stderr, "cuarena: CUARENA_TRACE=%s: %s; recording to %s instead\n",
                   clip(config_.trace_path).c_str(), why.c_str(), fallback.c_str());
      config_.trace_path = fallback;
    }
    trace_ = std::make_unique<TraceRecorder>(config_.trace_path);
  }
  // PyTorch's caching would hide every tensor from cuarena: one cudaMalloc per tensor instead.
  if (!config_.keep_torch_cache) setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 1);
  // Nor may cuarena's PyTorch drop-in (pip package) start inside the job: it would read
  // CUARENA_CONF (the shim's keys are not its own) and CUARENA_TRACE too.
  setenv("CUARENA", "0", 1);
  // The backends must reach the driver's own entry points, never these hooks.
  cuda::set_driver_resolver(driver_resolver);
}

void Shim::log(const char* format, ...) {
  if (log_ == nullptr) return;
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::lock_guard lock(log_mu_);
  std::fprintf(log_, "cuarena: %s\n", line);
  std::fflush(log_);
}

DeviceState* Shim::current(bool* no_context) {
  CUcontext ctx = nullptr;
  const RealDriver& d = RealDriver::get();
  if (d.ctx_get_current == nullptr || d.ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    if (no_context) *no_context = true;
    return nullptr;
  }
  if (no_context) *no_context = false;
  return of_context(ctx);
}

DeviceState* Shim::of_context(CUcontext ctx) {
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (slots_[std::size_t(i)].context.load(std::memory_order_acquire) == ctx)
      return slots_[std::size_t(i)].state.load(std::memory_order_acquire);
  }
  std::lock_guard lock(create_mu_);
  const int m = count_.load(std::memory_order_relaxed);
  for (int i = 0; i < m; ++i) {
    if (slots_[std::size_t(i)].context.load(std::memory_order_relaxed) == ctx)
      return slots_[std::size_t(i)].state.load(std::memory_order_relaxed);
  }
  if (m == kMaxStates) return nullptr;
  DeviceState* state = nullptr;
  CUcontext previous = nullptr;
  const RealDriver& d = RealDriver::get();
  CUdevice device = -1;
  d.ctx_get_current(&previous);
  d.ctx_set_current(ctx);
  const CUresult r = d.ctx_get_device(&device);
  d.ctx_set_current(previous);
  if (r == CUDA_SUCCESS) {
    try {
      state =
          new DeviceState(ctx, int(device), config_, trace_.get());  // lives as long as the process
      log("serving device %d (context %p), limit %zu bytes", int(device), static_cast<void*>(ctx),
          state->allocator().memory_limit());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cuarena: device %d is left to the driver: %s\n", int(device), e.what());
    }
  }
  Slot& slot = slots_[std::size_t(m)];
  slot.state.store(state, std::memory_order_relaxed);
  slot.context.store(ctx, std::memory_order_relaxed);
  count_.store(m + 1, std::memory_order_release);
  return state;
}

DeviceState* Shim::owner(DevicePtr ptr, Allocator::BlockInfo& block) {
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    DeviceState* s = slots_[std::size_t(i)].state.load(std::memory_order_acquire);
    if (s == nullptr) continue;
    if (std::optional<Allocator::BlockInfo> b = s->find(ptr)) {
      block = *b;
      return s;
    }
  }
  return nullptr;
}

DeviceState* Shim::holder(DevicePtr ptr) {
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    DeviceState* s = slots_[std::size_t(i)].state.load(std::memory_order_acquire);
    if (s != nullptr && s->allocator().owns(reinterpret_cast<void*>(ptr))) return s;
  }
  return nullptr;
}

void Shim::add_import(CUdeviceptr ptr, std::shared_ptr<void> mapping) {
  std::lock_guard lock(import_mu_);
  imports_[ptr] = std::move(mapping);
}

bool Shim::close_import(CUdeviceptr ptr) {
  std::shared_ptr<void> mapping;
  {
    std::lock_guard lock(import_mu_);
    auto it = imports_.find(ptr);
    if (it == imports_.end()) return false;
    mapping = std::move(it->second);
    imports_.erase(it);
  }
  return true;  // `mapping` unmaps here, outside the lock
}

std::string Shim::summary() {
  std::int64_t requested = 0, reserved = 0, maps = 0, unmaps = 0, access = 0, creates = 0,
               releases = 0, grow_waits = 0;
  DeviceState::FenceCounters fences;
  const int n = count_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    DeviceState* s = slots_[std::size_t(i)].state.load(std::memory_order_acquire);
    if (s == nullptr) continue;
    const Stats st = s->allocator().stats();
    requested += st.requested_bytes[std::size_t(Pool::kAll)].peak;
    reserved += st.reserved_bytes[std::size_t(Pool::kAll)].peak;
    maps += st.map_calls;
    unmaps += st.unmap_calls;
    access += st.access_calls;
    creates += st.num_device_alloc;
    releases += st.num_device_free;
    grow_waits += st.grow_waits;
    const DeviceState::FenceCounters f = s->fence_counters();
    fences.fences += f.fences;
    fences.reused += f.reused;
    fences.served_held += f.served_held;
    fences.streams = std::max(fences.streams, f.streams);
  }
  // The driver calls and host waits are what a served call can cost beyond cuarena's own work.
  auto ms = [&](Part p) { return double(spent_[std::size_t(p)].load()) / 1e6; };
  char line[1024];
  std::snprintf(
      line, sizeof line,
      "peak_requested_bytes=%lld peak_reserved_bytes=%lld reserved_ratio=%.4f "
      "calls_served=%llu calls_passed_through=%llu map_calls=%lld unmap_calls=%lld "
      "access_calls=%lld device_allocs=%lld device_frees=%lld grow_waits=%lld fences=%llu "
      "fence_reused=%llu served_held=%llu fence_streams=%llu alloc_ms=%.1f free_ms=%.1f "
      "core_ms=%.1f fence_ms=%.1f pid=%d",
      static_cast<long long>(requested), static_cast<long long>(reserved),
      requested > 0 ? double(reserved) / double(requested) : 0.0,
      static_cast<unsigned long long>(served_.load()),
      static_cast<unsigned long long>(passed_.load()), static_cast<long long>(maps),
      static_cast<long long>(unmaps), static_cast<long long>(access),
      static_cast<long long>(creates), static_cast<long long>(releases),
      static_cast<long long>(grow_waits), static_cast<unsigned long long>(fences.fences),
      static_cast<unsigned long long>(fences.reused),
      static_cast<unsigned long long>(fences.served_held),
      static_cast<unsigned long long>(fences.streams), ms(Part::kAlloc), ms(Part::kFree),
      ms(Part::kCore), ms(Part::kFence), int(::getpid()));
  return line;
}

void Shim::at_exit() {
  // A process that made no memory call (a launcher, a shell, `ls` in the job's script) must not
  // overwrite the trace of the one that did.
  if (trace_ && !trace_->empty()) {
    const std::string err = trace_->write();
    if (!err.empty()) std::fprintf(stderr, "cuarena: CUARENA_TRACE: %s\n", err.c_str());
  }
  const bool active = served_.load() + passed_.load() != 0 || count_.load() != 0;
  if ((config_.summary || log_ != nullptr) && active) {
    const std::string line = "cuarena: summary: " + summary() + "\n";
    [[maybe_unused]] const ssize_t n = ::write(stderr_fd_, line.data(), line.size());
  }
}

void Shim::after_fork_in_child() {
  // The parent's states and imports are abandoned, not destroyed: their memory and contexts are
  // the parent's. The child starts as a fresh process would.
  new (&create_mu_) std::mutex();
  new (&import_mu_) std::mutex();
  new (&log_mu_) std::mutex();
  new (&imports_) std::map<CUdeviceptr, std::shared_ptr<void>>();
  // Nor the parent's trace and counters: a child that exits must not rewrite the parent's trace
  // file or report the parent's calls.
  (void)trace_.release();
  if (!config_.trace_path.empty())
    trace_ = std::make_unique<TraceRecorder>(config_.trace_path + "." + std::to_string(::getpid()));
  served_.store(0);
  for (auto& part : spent_) part.store(0);
  passed_.store(0);
  for (Slot& s : slots_) {
    s.context.store(nullptr);
    s.state.store(nullptr);
  }
  count_.store(0);
}

}  // namespace cuarena::shim
