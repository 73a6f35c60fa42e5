#include "cuarena/cuda_ipc.hpp"

#include <cuda.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "context.hpp"
#include "cuarena/driver_api.hpp"
#include "cuarena/errors.hpp"

namespace cuarena::cuda_ipc {

namespace {

constexpr char kMagic[8] = {'c', 'u', 'a', 'r', 'i', 'p', 'c', '1'};

struct Header {
  char magic[8];
  std::int32_t pid;
  std::int32_t device;
  std::uint64_t span;
  std::uint64_t pieces;
};
struct Piece {
  std::uint64_t offset, bytes, handle_offset;
  std::int32_t fd, pad;
};

void sys_fail(const char* call) {
  throw BackendError(std::string("cuarena: CUDA IPC: ") + call +
                     " failed: " + std::strerror(errno));
}

/// A file descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string encode(int device, std::size_t span,
                   const std::vector<CudaBackend::ExportPiece>& pieces) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.pid = std::int32_t(::getpid());
  h.device = device;
  h.span = span;
  h.pieces = pieces.size();
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  for (const auto& p : pieces) {
    const Piece q{p.offset, p.bytes, p.handle_offset, p.fd, 0};
    out.append(reinterpret_cast<const char*>(&q), sizeof q);
  }
  return out;
}

bool is_cuarena_handle(const std::string& handle) {
  return handle.size() >= sizeof(Header) && std::memcmp(handle.data(), kMagic, sizeof kMagic) == 0;
}

std::shared_ptr<void> open(const std::string& handle) {
  if (!is_cuarena_handle(handle)) throw std::invalid_argument("cuarena: not a cuarena IPC handle");
  Header h;
  std::memcpy(&h, handle.data(), sizeof h);
  if (handle.size() != sizeof h + h.pieces * sizeof(Piece) || h.span == 0)
    throw std::invalid_argument("cuarena: truncated or inconsistent IPC handle");
  std::vector<Piece> pieces(h.pieces);
  std::memcpy(pieces.data(), handle.data() + sizeof h, h.pieces * sizeof(Piece));

  const cuda::DriverApi& api = cuda::DriverApi::get();
  cuda::DeviceGuard guard(h.device);
  Fd pidfd{int(::syscall(SYS_pidfd_open, h.pid, 0))};
  if (pidfd.fd < 0) sys_fail("pidfd_open");
  CUdeviceptr base = 0;
  cuda::check(api.address_reserve(&base, h.span, 0, 0, 0), "cuMemAddressReserve (IPC)");
  std::size_t mapped = 0;  // pieces mapped so far, undone on failure
  auto undo = [&] {
    for (std::size_t i = 0; i < mapped; ++i)
      api.mem_unmap(base + pieces[i].offset, pieces[i].bytes);
    api.address_free(base, h.span);
  };
  try {
    for (const Piece& p : pieces) {
      if (p.offset + p.bytes > h.span)
        throw std::invalid_argument("cuarena: IPC piece out of range");
      Fd fd{int(::syscall(SYS_pidfd_getfd, pidfd.fd, p.fd, 0))};
      if (fd.fd < 0) sys_fail("pidfd_getfd");
      CUmemGenericAllocationHandle mem = 0;
      cuda::check(api.import_handle(&mem, reinterpret_cast<void*>(std::intptr_t(fd.fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                  "cuMemImportFromShareableHandle");
      const CUresult r = api.mem_map(base + p.offset, p.bytes, p.handle_offset, mem, 0);
      api.mem_release(mem);  // the mapping keeps the memory alive
      cuda::check(r, "cuMemMap (IPC)");
      ++mapped;
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = h.device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cuda::check(api.mem_set_access(base, h.span, &access, 1), "cuMemSetAccess (IPC)");
  } catch (...) {
    undo();
    throw;
  }
  const int device = h.device;
  const std::size_t span = h.span;
  return std::shared_ptr<void>(reinterpret_cast<void*>(base), [device, span](void* p) {
    const cuda::DriverApi& a = cuda::DriverApi::get();
    cuda::DeviceGuard g(device);
    a.mem_unmap(CUdeviceptr(p), span);  // unmaps every piece (one call may span mappings)
    a.address_free(CUdeviceptr(p), span);
  });
}

}  // namespace cuarena::cuda_ipc
