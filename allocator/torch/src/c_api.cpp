// The C entry points (cuarena/torch_c_api.h): installation for the Python package, and the
// pluggable ABI for torch.cuda.memory.CUDAPluggableAllocator.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "cuarena/torch_c_api.h"
#include "torch_allocator_impl.hpp"

namespace cuarena::torch_adapter {
namespace {

// Never destroyed: tensors are still freed while the process exits, after static destructors
// and the CUDA runtime's unloading have begun.
std::mutex& g_install_mu = *new std::mutex;
std::shared_ptr<TorchAllocator>& g_installed = *new std::shared_ptr<TorchAllocator>;
std::shared_ptr<TorchAllocator>& g_pluggable =
    *new std::shared_ptr<TorchAllocator>;  // pluggable ABI

int fail(char* err, std::size_t errlen, const std::string& message) {
  if (err != nullptr && errlen > 0) {
    std::snprintf(err, errlen, "%s", message.c_str());
  }
  return 1;
}

/// Runs fn, turning any exception into a non-zero return with its message.
template <class Fn>
int guarded(char* err, std::size_t errlen, Fn&& fn) {
  try {
    fn();
    return 0;
  } catch (const c10::Error& e) {
    return fail(err, errlen, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(err, errlen, e.what());
  }
}

TorchAllocator& plug() {
  std::lock_guard lock(g_install_mu);
  if (!g_pluggable) g_pluggable = std::make_shared<TorchAllocator>(Config::from_env());
  return *g_pluggable;
}

/// The allocator serving this process: the installed one, else the pluggable ABI's. Throws
/// c10::Error when neither is. (Neither is ever replaced or destroyed once set.)
TorchAllocator& serving() {
  std::lock_guard lock(g_install_mu);
  TorchAllocator* a = g_installed ? g_installed.get() : g_pluggable.get();
  TORCH_CHECK(a != nullptr, "cuarena is not installed");
  return *a;
}

}  // namespace

c10::cuda::CUDACachingAllocator::CUDAAllocator* installed() {
  std::lock_guard lock(g_install_mu);
  return g_installed.get();
}

std::size_t memory_available(int device) {
  return serving().memory_available(c10::DeviceIndex(device));
}

Stats stats(int device) { return serving().main_stats(c10::DeviceIndex(device)); }

std::map<std::string, double> driver_us(int device) {
  return serving().driver_us(c10::DeviceIndex(device));
}

}  // namespace cuarena::torch_adapter

using namespace cuarena;
using namespace cuarena::torch_adapter;
namespace CCA = c10::cuda::CUDACachingAllocator;

extern "C" {

int cuarena_torch_install(const char* config, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    const Config cfg = Config::parse(config == nullptr ? "" : config);
    std::lock_guard lock(g_install_mu);
    if (g_installed) {
      TORCH_CHECK(g_installed->config() == cfg, "cuarena is already enabled with config '",
                  g_installed->config().to_string(), "'; cannot enable it again with '",
                  cfg.to_string(), "'");
      return;
    }
    CCA::CUDAAllocator* current = CCA::allocator.load();
    TORCH_CHECK(current == nullptr || !current->initialized(),
                "CUDA is already initialised, so PyTorch's allocator (", current->name(),
                ") has served memory and cannot be swapped. Enable cuarena before the first CUDA "
                "call (before any tensor is moved to the GPU, torch.cuda.current_device(), "
                "set_device() or mem_get_info()), or start the job with CUARENA=1 or "
                "PYTORCH_CUDA_ALLOC_CONF=backend:cuarena.");
    auto alloc = std::make_shared<TorchAllocator>(cfg);
    CCA::allocator.store(alloc.get());
    // The second registry: torch.accelerator.memory_* and c10::GetAllocator(kCUDA) read it.
    c10::SetAllocator(c10::DeviceType::CUDA, alloc.get(), /*priority=*/255);
    g_installed = std::move(alloc);
  });
}

int cuarena_torch_is_installed(void) {
  std::lock_guard lock(g_install_mu);
  return g_installed != nullptr && CCA::allocator.load() == g_installed.get() ? 1 : 0;
}

const char* cuarena_torch_built_for(void) { return CUARENA_TORCH_VERSION; }

int cuarena_config_check(const char* config, char* err, size_t errlen) {
  return guarded(err, errlen, [&] { (void)Config::parse(config == nullptr ? "" : config); });
}

const char* cuarena_config_keys(void) {
  static const std::string keys = [] {
    std::string s;
    for (const std::string& k : Config::keys()) s += (s.empty() ? "" : ",") + k;
    return s;
  }();
  return keys.c_str();
}

int64_t cuarena_memory_available(int device, char* err, size_t errlen) {
  std::size_t bytes = 0;
  if (guarded(err, errlen, [&] { bytes = cuarena::torch_adapter::memory_available(device); }) != 0)
    return -1;
  return int64_t(bytes);
}

int64_t cuarena_stats(int device, char* buf, size_t buflen, char* err, size_t errlen) {
  std::string text;
  if (guarded(err, errlen, [&] {
        for (const auto& [key, value] : cuarena::torch_adapter::stats(device).to_map())
          text += key + " " + std::to_string(value) + "\n";
        for (const auto& [call, us] : cuarena::torch_adapter::driver_us(device))
          text += "cuarena.driver_us." + call + " " + std::to_string(std::int64_t(us)) + "\n";
      }) != 0)
    return -1;
  if (buf != nullptr && text.size() < buflen) std::memcpy(buf, text.c_str(), text.size() + 1);
  return int64_t(text.size());
}

void* cuarena_malloc(ssize_t size, int device, cuarena_stream_t stream) {
  if (size < 0) return nullptr;
  try {
    return plug().malloc(c10::DeviceIndex(device), std::size_t(size),
                         reinterpret_cast<cudaStream_t>(stream));
  } catch (const c10::OutOfMemoryError& e) {
    std::fprintf(stderr, "cuarena_malloc: returning NULL: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuarena_malloc: returning NULL: %s\n", e.what());
  }
  return nullptr;
}

void cuarena_free(void* ptr, ssize_t, int, cuarena_stream_t) {
  if (ptr == nullptr) return;
  try {
    plug().free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuarena_free: %s\n", e.what());
  }
}

void cuarena_init(int device_count) { plug().init(device_count); }
void cuarena_reset(void) { plug().emptyCache(); }
void cuarena_set_memory_fraction(double fraction, int device) {
  plug().setMemoryFraction(fraction, c10::DeviceIndex(device));
}
void* cuarena_base_alloc(void* ptr, size_t* size) { return plug().getBaseAllocation(ptr, size); }
void cuarena_record_stream(void* ptr, cuarena_stream_t stream) {
  const int dev = c10::cuda::current_device();
  c10::DataPtr dp(ptr, ptr, plug().raw_deleter(), c10::Device(c10::DeviceType::CUDA, dev));
  plug().recordStream(dp, c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(stream),
                                                           c10::DeviceIndex(dev)));
  (void)dp.release_context();
}
void cuarena_end_allocate_to_pool(int device, unsigned long long a, unsigned long long b) {
  plug().endAllocateToPool(c10::DeviceIndex(device), {a, b});
}
void cuarena_release_pool(int device, unsigned long long a, unsigned long long b) {
  plug().releasePool(c10::DeviceIndex(device), {a, b});
}

}  // extern "C"

void cuarena::pluggable::begin_allocate_to_pool(int device, c10::MempoolId_t pool,
                                                std::function<bool(cudaStream_t)> filter) {
  torch_adapter::plug().beginAllocateToPool(c10::DeviceIndex(device), pool, std::move(filter));
}
