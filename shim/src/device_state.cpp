#include "device_state.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cuarena/cuda_ipc.hpp"
#include "cuarena/errors.hpp"
#include "real_driver.hpp"
#include "shim.hpp"

namespace cuarena::shim {

namespace {
/// Makes `context` current for a scope (the hooks run in the caller's context, usually this one).
class ContextScope {
 public:
  explicit ContextScope(CUcontext context) {
    const RealDriver& d = RealDriver::get();
    if (d.ctx_get_current(&previous_) == CUDA_SUCCESS && previous_ != context)
      switched_ = d.ctx_set_current(context) == CUDA_SUCCESS;
  }
  ~ContextScope() {
    if (switched_) RealDriver::get().ctx_set_current(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};
}  // namespace

DeviceState::DeviceState(CUcontext context, int device, const ShimConfig& config,
                         TraceRecorder* trace)
    : context_(context),
      device_(device),
      hold_limit_(config.pending_free_bytes),
      snug_factor_(config.snug_factor),
      trace_(trace),
      backend_(device, config.memory_limit, context),
      alloc_(backend_, config.core) {
  if (monitor::monitor_enabled()) start_monitor();
}

void DeviceState::start_monitor() {
  const RealDriver& d = RealDriver::get();
  monitor::MonitorPublisher::Options o;
  o.kind = monitor::PageKind::kShim;
  o.device = device_;
  CUuuid uuid{};
  if (d.device_get_uuid != nullptr && d.device_get_uuid(&uuid, CUdevice(device_)) == CUDA_SUCCESS)
    o.device_uuid = monitor::format_gpu_uuid(uuid.bytes);
  // On the publisher's thread, through the real driver (never the hooks, which would count it),
  // in relaxed capture mode: the thread captures nothing, and its call must never invalidate a
  // global-mode capture on another thread.
  o.device_memory = [context = context_](const Stats&) {
    const RealDriver& real = RealDriver::get();
    static thread_local const bool relaxed = [&real] {
      CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
      return real.thread_exchange_capture_mode != nullptr &&
             real.thread_exchange_capture_mode(&mode) == CUDA_SUCCESS;
    }();
    std::size_t free = 0, total = 0;
    ContextScope scope(context);
    if (!relaxed || real.mem_get_info(&free, &total) != CUDA_SUCCESS)
      return monitor::DeviceMemory{};
    return monitor::DeviceMemory{std::int64_t(free), std::int64_t(total)};
  };
  o.log = [](const std::string& line) { Shim::get().log("%s", line.c_str()); };
  monitor_ = std::make_unique<monitor::MonitorPublisher>(alloc_, std::move(o));
}

void* DeviceState::allocate(std::size_t bytes, StreamId stream, std::size_t alignment) {
  if (held_bytes_.load(std::memory_order_acquire) != 0) {
    // Frees are held. A request served by a block cuarena has mapped does not need them (their
    // fence costs a driver call or two per non-blocking stream), unless only by splitting a
    // block much larger while a held one would fit: then the fence keeps the footprint where
    // reuse at once would have it (bench/shim/held_frees_sim.cpp measures both).
    if (void* p = allocate_cached(bytes, stream, alignment)) {
      served_held_.fetch_add(1, std::memory_order_relaxed);
      return p;
    }
    release_held();
  }
  try {
    SpentTimer timer(Shim::Part::kCore);
    return alloc_.allocate_aligned(bytes, alignment, stream);
  } catch (const OutOfMemoryError&) {
  }
  // Out of memory: every free the program made is memory it may count on (frees held since
  // the fence above, by other threads).
  release_held();
  return alloc_.allocate_aligned(bytes, alignment, stream);
}

void* DeviceState::allocate_cached(std::size_t bytes, StreamId stream, std::size_t alignment) {
  SpentTimer timer(Shim::Part::kCore);
  if (snug_factor_ == 0) return alloc_.allocate_cached(bytes, stream, SIZE_MAX, alignment);
  const std::size_t snug = bytes > SIZE_MAX / snug_factor_ ? SIZE_MAX : bytes * snug_factor_;
  if (void* p = alloc_.allocate_cached(bytes, stream, snug, alignment)) return p;
  {
    std::lock_guard lock(mu_);
    if (held_.holds_fit(bytes, snug)) return nullptr;
  }
  return alloc_.allocate_cached(bytes, stream, SIZE_MAX, alignment);
}

std::optional<Allocator::BlockInfo> DeviceState::find(DevicePtr ptr) const {
  std::optional<Allocator::BlockInfo> b = alloc_.find(reinterpret_cast<void*>(ptr));
  if (b && held_bytes_.load(std::memory_order_acquire) != 0) {
    std::lock_guard lock(mu_);
    if (held_.held(ptr)) return std::nullopt;
  }
  return b;
}

bool DeviceState::free_sync(DevicePtr ptr, const Allocator::BlockInfo& block) {
  std::lock_guard lock(mu_);
  if (!held_.hold(ptr, block.size)) return false;
  forget(ptr);
  held_bytes_.store(held_.bytes(), std::memory_order_release);
  // Bounded even while every allocation is served without them.
  if (held_.bytes() >= hold_limit_ || held_.count() >= 4096) fence_and_release();
  return true;
}

void DeviceState::free_async(DevicePtr ptr, const Allocator::BlockInfo& block, StreamId stream) {
  if (has_records_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mu_);
    forget(ptr);
  }
  void* p = reinterpret_cast<void*>(ptr);
  // Freed on another stream than it was allocated on: reusable once that stream's work before
  // the free is done (cuarena then records and waits for an event there).
  // Freed on the legacy stream: in CUDA that free waits for every blocking stream's earlier work,
  // and the next user of the block on any blocking stream waits for the free. No legacy-stream
  // work is queued here, so an event there (recorded at the free) stands for it, whatever stream
  // the block was allocated on.
  if (stream == 0) {
    alloc_.record_stream(p, reinterpret_cast<StreamId>(CU_STREAM_LEGACY));
  } else if (stream != block.stream) {
    add_stream(reinterpret_cast<CUstream>(stream), true);
    alloc_.record_stream(p, stream);
  }
  {
    SpentTimer timer(Shim::Part::kCore);
    alloc_.deallocate(p);
  }
  if (trace_)
    trace_->record(cuat::Action::kFreeCompleted, device_, block.stream, ptr, block.requested);
}

bool DeviceState::any_capturing() const {
  std::lock_guard lock(mu_);
  return streams_.any_capturing();
}

void DeviceState::capture_begins(CUstream stream) {
  std::lock_guard lock(mu_);
  streams_.capture_begins(stream);
}

void DeviceState::capture_ends(CUstream stream) {
  std::lock_guard lock(mu_);
  streams_.capture_ends(stream);
}

void DeviceState::add_stream(CUstream stream, bool used) {
  std::lock_guard lock(mu_);
  streams_.add(stream, used);
}

bool DeviceState::retire_stream(CUstream stream) {
  std::lock_guard lock(mu_);
  ContextScope scope(context_);
  return streams_.retire(stream);
}

CUstream DeviceState::reuse_stream(unsigned flags, int priority) {
  std::lock_guard lock(mu_);
  return streams_.reuse(flags, priority);
}

DeviceState::FenceCounters DeviceState::fence_counters() const {
  std::lock_guard lock(mu_);
  FenceCounters c = counters_;
  c.served_held = served_held_.load(std::memory_order_relaxed);
  return c;
}

void DeviceState::release_held() {
  std::lock_guard lock(mu_);
  fence_and_release();
}

void DeviceState::fence_and_release() {
  if (held_.count() == 0) return;
  std::vector<HeldFrees::Freed> freed;
  {
    ContextScope scope(context_);
    SpentTimer timer(Shim::Part::kFence);
    if (!streams_.record_fence()) return;  // a capture is under way: at a later fence
    held_.take_all(freed);
    ++counters_.fences;
    counters_.reused += freed.size();
    counters_.streams = streams_.live_non_blocking();
  }
  held_bytes_.store(0, std::memory_order_release);
  SpentTimer timer(Shim::Part::kCore);
  for (const HeldFrees::Freed& f : freed) {
    std::optional<Allocator::BlockInfo> b;
    if (trace_) b = alloc_.find(reinterpret_cast<void*>(f.ptr));
    alloc_.deallocate(reinterpret_cast<void*>(f.ptr));
    if (b) trace_->record(cuat::Action::kFreeCompleted, device_, b->stream, f.ptr, b->requested);
  }
}

void DeviceState::forget(DevicePtr ptr) {
  if (!has_records_.load(std::memory_order_relaxed)) return;
  ids_.erase(ptr);
  exports_.erase(ptr);
  has_records_.store(!ids_.empty() || !exports_.empty(), std::memory_order_release);
}

void DeviceState::mem_info(std::size_t& free_bytes, std::size_t& total_bytes) {
  const RealDriver& d = RealDriver::get();
  std::size_t real_free = 0, real_total = 0;
  {
    ContextScope scope(context_);
    const CUresult r = d.mem_get_info(&real_free, &real_total);
    if (r != CUDA_SUCCESS)
      throw BackendError("cuarena shim: cuMemGetInfo failed (CUresult " + std::to_string(int(r)) +
                         ")");
  }
  const Stats st = alloc_.stats();
  const auto all = std::size_t(Pool::kAll);
  const std::size_t reserved = std::size_t(st.reserved_bytes[all].current);
  const std::size_t allocated = std::size_t(st.allocated_bytes[all].current);
  const std::size_t pending = std::min(held_bytes_.load(std::memory_order_acquire), allocated);
  const std::size_t in_use = allocated - pending;  // what the program still holds
  free_bytes = real_free + (reserved - std::min(reserved, in_use));
  total_bytes = real_total;
  const std::size_t limit = alloc_.memory_limit();
  if (limit < real_total) {
    total_bytes = limit;
    free_bytes = std::min(free_bytes, limit - std::min(limit, in_use));
  }
}

DeviceState::Lookup DeviceState::range(DevicePtr ptr, DevicePtr& base, std::size_t& size) const {
  if (std::optional<Allocator::BlockInfo> b = find(ptr)) {
    base = ptr;
    size = b->requested;
    return Lookup::kFound;
  }
  if (!alloc_.owns(reinterpret_cast<void*>(ptr))) return Lookup::kNotOurs;
  // An interior pointer: O(live allocations), for the rare callers that ask (IPC, NCCL).
  for (const Allocator::BlockInfo& b : alloc_.live_blocks()) {
    if (b.ptr <= ptr && ptr < b.ptr + b.requested && find(b.ptr)) {
      base = b.ptr;
      size = b.requested;
      return Lookup::kFound;
    }
    if (b.ptr > ptr) break;
  }
  return Lookup::kNotLive;
}

std::uint64_t DeviceState::id_of(DevicePtr base) {
  auto [it, fresh] = ids_.try_emplace(base, 0);
  if (fresh) it->second = (std::uint64_t{1} << 63) | next_id_++;
  has_records_.store(true, std::memory_order_release);
  return it->second;
}

std::uint64_t DeviceState::buffer_id(DevicePtr base) {
  std::lock_guard lock(mu_);
  return id_of(base);
}

const std::string& DeviceState::ipc_record(DevicePtr base, const Allocator::BlockInfo& block,
                                           std::size_t& offset) {
  const std::size_t g = backend_.granularity();
  const DevicePtr start = base / g * g;
  const std::size_t span = round_up(base + block.size, g) - start;
  offset = base - start;
  std::lock_guard lock(mu_);
  std::unique_ptr<std::string>& rec = exports_[base];
  if (!rec) {
    std::vector<CudaBackend::ExportPiece> pieces;
    alloc_.with_device_lock([&] { pieces = backend_.export_range(start, span); });
    // The record: the allocation's buffer id, then the handle cuda_ipc::open reads.
    const std::uint64_t id = id_of(base);
    std::string bytes(sizeof id, '\0');
    std::memcpy(bytes.data(), &id, sizeof id);
    rec = std::make_unique<std::string>(bytes + cuda_ipc::encode(device_, span, pieces));
  }
  return *rec;
}

}  // namespace cuarena::shim
