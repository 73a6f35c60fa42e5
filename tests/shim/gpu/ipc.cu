// shim_ipc: legacy CUDA IPC for memory the shim serves. The parent allocates blocks with
// cudaMalloc (two small ones that the shim likely carves from one slab, a mid-size and a large
// one), fills each with its own pattern and exports it with cudaIpcGetMemHandle. It then runs
// itself again as a child (fork + exec of /proc/self/exe: a fresh process, which inherits
// LD_PRELOAD and so runs under the shim too), passing each handle in hex with its size and tag.
// The child opens each handle with cudaIpcOpenMemHandle, verifies the parent's pattern (a handle
// that maps the wrong memory, or the right memory at the wrong offset, fails here), writes a new
// pattern, synchronises and closes the handle. The parent then verifies that every block holds
// the child's pattern, whole and in place (a write that landed in a neighbour shows there).
//
// Cases: parent: export, child_exit (the child's status), child_writes_seen;
//        child: open_verify_write.
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "shim_test.cuh"

extern char** environ;

using namespace shimtest;

namespace {

constexpr std::uint32_t kChildTagOffset = 1000;

std::string to_hex(const cudaIpcMemHandle_t& h) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  const auto* b = reinterpret_cast<const unsigned char*>(&h);
  for (std::size_t i = 0; i < sizeof h; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  return s;
}

bool from_hex(const std::string& s, cudaIpcMemHandle_t* h) {
  if (s.size() != 2 * sizeof *h) return false;
  auto* b = reinterpret_cast<unsigned char*>(h);
  for (std::size_t i = 0; i < sizeof *h; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    b[i] = static_cast<unsigned char>(v);
  }
  return true;
}

struct Shared {
  void* p = nullptr;
  std::size_t size = 0;
  std::uint32_t tag = 0;
  cudaIpcMemHandle_t handle{};
};

// The child: argv holds --child HEX:SIZE:TAG ...
int child_main(int argc, char** argv, const char* program) {
  std::vector<Shared> blocks;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto c1 = arg.find(':'), c2 = arg.rfind(':');
    if (c1 == std::string::npos || c1 == c2) continue;  // --child, --expect-shim
    Shared b;
    if (!from_hex(arg.substr(0, c1), &b.handle)) die("child: bad handle argument %s", argv[i]);
    b.size = std::strtoull(arg.c_str() + c1 + 1, nullptr, 10);
    b.tag = static_cast<std::uint32_t>(std::strtoul(arg.c_str() + c2 + 1, nullptr, 10));
    blocks.push_back(b);
  }
  run_case("open_verify_write", [&] {
    expect(!blocks.empty(), "child: no handles on the command line");
    DeviceCounter errors;
    for (Shared& b : blocks) {
      CHECK(cudaIpcOpenMemHandle(&b.p, b.handle, cudaIpcMemLazyEnablePeerAccess));
      errors.reset();
      verify_bytes(b.p, b.size, b.tag, errors.p);
      const unsigned long long bad = errors.read();
      expect(bad == 0,
             "child: the opened %zu-byte block (tag %u) has %llu bytes that are not "
             "the parent's pattern",
             b.size, b.tag, bad);
      fill_bytes(b.p, b.size, b.tag + kChildTagOffset);
    }
    CHECK(cudaDeviceSynchronize());
    for (Shared& b : blocks) CHECK(cudaIpcCloseMemHandle(b.p));
  });
  return finish(program);
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc, argv, "shim_ipc");
  const bool child = has_flag(argc, argv, "--child");
  start(child ? "shim_ipc (child)" : program, argc, argv);
  if (child) return child_main(argc, argv, "shim_ipc (child)");

  std::vector<Shared> blocks;
  std::uint32_t tag = 500;
  for (std::size_t size : {4 * KiB, 4 * KiB, MiB + 17, 33 * MiB})
    blocks.push_back({nullptr, size, tag++});
  run_case("export", [&] {
    for (Shared& b : blocks) {
      CHECK(cudaMalloc(&b.p, b.size));
      fill_bytes(b.p, b.size, b.tag);
    }
    CHECK(cudaDeviceSynchronize());
    for (Shared& b : blocks) CHECK(cudaIpcGetMemHandle(&b.handle, b.p));
  });

  std::vector<std::string> args = {"/proc/self/exe", "--child"};
  if (has_flag(argc, argv, "--expect-shim")) args.push_back("--expect-shim");
  if (has_flag(argc, argv, "--expect-no-shim")) args.push_back("--expect-no-shim");
  for (const Shared& b : blocks)
    args.push_back(to_hex(b.handle) + ":" + std::to_string(b.size) + ":" + std::to_string(b.tag));
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  run_case("child_exit", [&] {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) die("fork: %s", std::strerror(errno));
    if (pid == 0) {  // only exec here: the CUDA state of the parent must not be used
      execve("/proc/self/exe", cargs.data(), environ);
      _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) die("waitpid: %s", std::strerror(errno));
    expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the child %s %d (its own FAIL lines are above)",
           WIFEXITED(status) ? "exited with" : "was killed by signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  });

  run_case("child_writes_seen", [&] {
    DeviceCounter errors;
    for (const Shared& b : blocks) {
      errors.reset();
      verify_bytes(b.p, b.size, b.tag + kChildTagOffset, errors.p);
      const unsigned long long bad = errors.read();
      expect(bad == 0,
             "the %zu-byte block (tag %u) at %p has %llu bytes that are not the "
             "child's pattern",
             b.size, b.tag, b.p, bad);
    }
    for (Shared& b : blocks) CHECK(cudaFree(b.p));
  });
  return finish(program);
}
