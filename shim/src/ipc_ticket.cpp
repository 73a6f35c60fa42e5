#include "ipc_ticket.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "cuarena/cuda_ipc.hpp"
#include "cuarena/errors.hpp"

namespace cuarena::shim {

namespace {
constexpr char kMagic[8] = {'c', 'u', 'a', 'r', 't', 'k', 't', '1'};
constexpr std::size_t kMaxRecord = std::size_t{64} << 20;  // far above any allocation's piece list

struct Ticket {
  char magic[8];
  std::int32_t pid;
  std::int32_t device;
  std::uint64_t record_addr;
  std::uint64_t record_len;
  std::uint64_t buffer_id;
  std::uint64_t offset;
};
static_assert(sizeof(Ticket) <= sizeof(CUipcMemHandle));
}  // namespace

CUipcMemHandle make_ticket(int device, const std::string& record, std::size_t offset) {
  Ticket t{};
  std::memcpy(t.magic, kMagic, sizeof kMagic);
  t.pid = std::int32_t(::getpid());
  t.device = device;
  t.record_addr = reinterpret_cast<std::uintptr_t>(record.data());
  t.record_len = record.size();
  std::memcpy(&t.buffer_id, record.data(), sizeof t.buffer_id);
  t.offset = offset;
  CUipcMemHandle h{};
  std::memcpy(h.reserved, &t, sizeof t);
  return h;
}

bool is_ticket(const CUipcMemHandle& handle) {
  return std::memcmp(handle.reserved, kMagic, sizeof kMagic) == 0;
}

std::shared_ptr<void> open_ticket(const CUipcMemHandle& handle, CUdeviceptr& ptr) {
  Ticket t;
  std::memcpy(&t, handle.reserved, sizeof t);
  if (t.record_len < sizeof(std::uint64_t) || t.record_len > kMaxRecord)
    throw BackendError("cuarena shim: IPC handle with an implausible record length");
  std::string record(t.record_len, '\0');
  iovec local{record.data(), record.size()};
  iovec remote{reinterpret_cast<void*>(t.record_addr), record.size()};
  const ssize_t got = ::process_vm_readv(t.pid, &local, 1, &remote, 1, 0);
  if (got != ssize_t(record.size())) {
    throw BackendError("cuarena shim: cannot read the IPC record of process " +
                       std::to_string(t.pid) + " (" +
                       (got < 0 ? std::strerror(errno) : "short read") +
                       "): the exporter exited, or this process may not read its memory");
  }
  std::uint64_t id = 0;
  std::memcpy(&id, record.data(), sizeof id);
  if (id != t.buffer_id)
    throw BackendError("cuarena shim: IPC handle of memory the exporting process has freed");
  std::shared_ptr<void> base = cuda_ipc::open(record.substr(sizeof id));
  ptr = reinterpret_cast<CUdeviceptr>(base.get()) + t.offset;
  return base;
}

}  // namespace cuarena::shim
