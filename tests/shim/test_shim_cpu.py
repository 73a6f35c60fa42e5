"""Checks of the LD_PRELOAD shim (libcuarena_preload.so) that need no GPU: run by CTest as
shim_cpu_tests (tests/shim/CMakeLists.txt), which passes the paths in the environment:

  CUARENA_PRELOAD_LIB             the shim
  CUARENA_SHIM_DLSYM_PROBE        programs/dlsym_probe.c
  CUARENA_SHIM_CUDA_DRIVER_PROBE  programs/cuda_driver_probe.cpp
  CUARENA_SHIM_CUDA_RT_STATIC     programs/cuda_rt_probe.cu over the static cudart  (with CUDA)
  CUARENA_SHIM_CUDA_RT_SHARED     the same over the shared cudart                  (with CUDA)
  CUARENA_SHIM_SANITIZER          none, address or thread: how the build was sanitised
  CUARENA_READELF                 readelf from binutils (else found on PATH)

What it checks:
  1. the shim's DT_NEEDED: nothing from CUDA, nothing outside a small allowed set;
  2. its dynamic symbol table exports exactly EXPECTED_EXPORTS (no C++ or other names leak);
  3. programs that never touch CUDA (sh, python, a dlsym/RTLD_NEXT probe) give the same stdout,
     stderr and exit status with and without LD_PRELOAD;
  4. so do CUDA programs that find no GPU (runtime API over static and shared cudart, the
     driver API through dlopen). Every run has CUDA_VISIBLE_DEVICES set empty, so that on a GPU
     machine too no GPU is visible (there the shim's interposition of libcuda is exercised; in CI
     libcuda.so.1 is absent);
  5. a bad CUARENA_CONF makes the shim print one line naming the key and exit non-zero before
     the job starts (BAD_CONF_* below: the shim's contract).

Sanitised builds (the asan preset): an ASan-built shim has DT_NEEDED libasan, and the ASan
runtime refuses to start unless it comes first in the initial library list; an LD_PRELOAD'ed
library is loaded before the program's own DT_NEEDED, so the shim alone in LD_PRELOAD aborts the
process ("ASan runtime does not come first"). Every run here therefore preloads the sanitizer
runtimes the shim needs (asan first), in the run without the shim too, so that the two runs of a
comparison differ by the shim only; leak detection is off in both (python and sh are not ours).
The ASan runtime itself then calls the shim's exported dlsym while it initialises (its
interceptors find the real functions with dlsym(RTLD_NEXT, ...)), before its shadow memory
exists: the shim's dlsym and what it calls on that path must not be ASan-instrumented
(no_sanitize("address")), else every process crashes at start (SIGSEGV, exit status -11).
"""

import difflib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

# ---------------------------------------------------------------------------------------------
# The shim's interface, in one place.

# What libcuarena_preload.so exports: the hooks, and its version query. Nothing else may be
# exported (LINKER_EXPORTS excepted).
EXPECTED_EXPORTS = (
    # resolvers: how programs reach the driver
    "dlsym",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPointByVersion",
    # driver allocation and queries
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemGetInfo_v2",
    "cuMemGetAddressRange_v2",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemCreate",
    "cuMemAddressReserve",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemAddressFree",
    "cuMemRelease",
    "cuMemRetainAllocationHandle",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemExportToShareableHandle",
    "cuStreamCreate",
    "cuStreamCreateWithPriority",
    "cuStreamDestroy_v2",
    "cuStreamBeginCapture_v2",
    "cuStreamBeginCapture_v2_ptsz",
    "cuStreamBeginCaptureToGraph",
    "cuStreamBeginCaptureToGraph_ptsz",
    "cuStreamEndCapture",
    "cuStreamEndCapture_ptsz",
    # runtime API (PyTorch calls these directly)
    "cudaMalloc",
    "cudaFree",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaMemGetInfo",
    # the shim's own
    "cuarena_preload_version",
)
# May be a function or a variable; every other export must be a function.
EXPORTS_ANY_TYPE = {"cuarena_preload_version"}

# Symbols the static linker defines and exports by itself when no version script hides them.
LINKER_EXPORTS = {"_init", "_fini", "_edata", "_end", "__bss_start"}

# DT_NEEDED the shim may carry: the C and C++ runtimes and the dynamic loader.
ALLOWED_NEEDED = re.compile(
    r"^(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so(\.[0-9]+)*$"
    r"|^ld-linux[-\w.]*\.so(\.[0-9]+)*$")
CUDA_NEEDED = re.compile(r"^libcuda(rt)?[._]")  # libcuda.so.1, libcudart.so.13, libcudart_static
SANITIZER_NEEDED = re.compile(r"^lib(asan|ubsan|tsan|lsan|hwasan)\.so(\.[0-9]+)*$")

# The bad-configuration contract (shim/): one line on stderr naming the key, then this exit
# status. Adjust here if the contract changes.
BAD_CONF = "bogus_key:1"
BAD_CONF_KEY = "bogus_key"
BAD_CONF_EXIT_STATUS = 2
BAD_CONF_MESSAGE_PREFIX = "cuarena: CUARENA_CONF:"
# The shim reads CUARENA_CONF at load (a constructor, before the job's main), so even a program
# that never uses CUDA stops: "sh" checks that; "cuda_rt_shared" is a program whose cudaMalloc is
# the shim's. Drop "sh" if the shim ever reads its settings lazily.
BAD_CONF_PROGRAMS = ("sh", "cuda_rt_shared")

# ---------------------------------------------------------------------------------------------
# Paths and tools.

SANITIZER = os.environ.get("CUARENA_SHIM_SANITIZER", "none")  # none, address or thread


def _env_path(name, what):
    path = os.environ.get(name)
    if not path:
        pytest.fail(f"{name} is not set: run this through CTest (ctest --preset default -R shim), "
                    f"which passes the path of {what}")
    if not os.path.exists(path):
        pytest.fail(f"{name}={path}: no such file (build first: cmake --build --preset default)")
    return path


def _cuda_program(name):
    path = os.environ.get(name)
    if not path:
        pytest.skip(f"{name} not set: the CUDA toolkit was not found at configure time, so the "
                    "CUDA runtime probes were not built")
    return _env_path(name, "a CUDA runtime probe")


@pytest.fixture(scope="session")
def shim():
    return _env_path("CUARENA_PRELOAD_LIB", "libcuarena_preload.so")


@pytest.fixture(scope="session")
def readelf():
    tool = _find_readelf()
    if not tool:
        pytest.skip("readelf (binutils) not found: cannot read the shim's dynamic section")
    return tool


def _readelf(tool, args, path):
    proc = subprocess.run([tool, *args, path], capture_output=True, text=True,
                          env={**os.environ, "LC_ALL": "C"})
    assert proc.returncode == 0, f"readelf {' '.join(args)} {path} failed:\n{proc.stderr}"
    return proc.stdout


def dynamic_needed(tool, path):
    """DT_NEEDED entries, in order. Fails if the file has no dynamic section."""
    out = _readelf(tool, ["-d", "-W"], path)
    assert "Dynamic section" in out, f"{path} has no dynamic section:\n{out}"
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


@dataclass(frozen=True)
class Symbol:
    name: str      # without its version
    version: str   # "" when unversioned
    type: str      # FUNC, OBJECT, IFUNC, NOTYPE, ...
    bind: str      # GLOBAL, WEAK, LOCAL, UNIQUE
    vis: str       # DEFAULT, PROTECTED, HIDDEN, INTERNAL
    ndx: str       # section index, UND or ABS

    def __str__(self):
        v = f"@{self.version}" if self.version else ""
        return f"{self.name}{v} ({self.type} {self.bind} {self.vis} ndx {self.ndx})"


_SYM_LINE = re.compile(
    r"^\s*\d+:\s+[0-9a-fA-F]+\s+(?:0x)?[0-9a-fA-F]+\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)(?:\s+(.*))?$")


def dynamic_symbols(tool, path):
    """Every entry of .dynsym (readelf --dyn-syms -W), the null entry left out."""
    out = _readelf(tool, ["--dyn-syms", "-W"], path)
    symbols = []
    for line in out.splitlines():
        m = _SYM_LINE.match(line)
        if not m:
            continue
        type_, bind, vis, ndx, name = m.groups()
        name = re.sub(r"\s+\(\d+\)$", "", (name or "").strip())  # "dlsym@GLIBC_2.2.5 (2)"
        base, _, version = name.partition("@")
        version = version.lstrip("@")
        if not base and ndx == "UND":
            continue  # entry 0
        symbols.append(Symbol(base, version, type_, bind, vis, ndx))
    assert symbols, f"readelf found no dynamic symbols in {path}:\n{out}"
    return symbols


def exported(symbols):
    """Defined, non-local symbols: what the library offers to others."""
    return [s for s in symbols if s.ndx != "UND" and s.bind != "LOCAL"]


def export_problems(symbols):
    """What is wrong with a library's exports against EXPECTED_EXPORTS (empty when right)."""
    problems = []
    ours = exported(symbols)
    by_name = {}
    for s in ours:
        by_name.setdefault(s.name, []).append(s)
    versions = {s.version for s in symbols if s.version}
    for name in EXPECTED_EXPORTS:
        found = by_name.get(name)
        if not found:
            undefined = [s for s in symbols if s.name == name]
            problems.append(f"missing export {name}"
                            + (f" (present only as {', '.join(map(str, undefined))})" if undefined else ""))
            continue
        for s in found:
            if s.vis != "DEFAULT":
                problems.append(f"{s}: visibility is not DEFAULT")
            if name not in EXPORTS_ANY_TYPE and s.type not in ("FUNC", "IFUNC"):
                problems.append(f"{s}: not a function")
    for s in ours:
        if s.name in EXPECTED_EXPORTS or s.name in LINKER_EXPORTS:
            continue
        if s.ndx == "ABS" and s.name in versions:
            continue  # a version node's own symbol (from a version script)
        kind = " (a C++ symbol)" if s.name.startswith("_Z") else ""
        problems.append(f"unexpected export {s}{kind}")
    return problems


# ---------------------------------------------------------------------------------------------
# Running programs with and without the shim.


@dataclass(frozen=True)
class Run:
    argv: tuple
    preload: str
    returncode: int
    stdout: str
    stderr: str

    def describe(self):
        return (f"$ LD_PRELOAD={self.preload!r} {shlex.join(self.argv)}\n"
                f"exit status {self.returncode}\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}")


def _find_readelf():
    tool = os.environ.get("CUARENA_READELF") or shutil.which("readelf")
    return tool if tool and os.path.exists(tool) else None


@pytest.fixture(scope="session")
def sanitizer_runtimes(shim):
    """The sanitizer runtimes to preload before the shim (asan first), empty normally."""
    tool = _find_readelf()
    if not tool:
        if SANITIZER == "none":
            return []
        pytest.skip("readelf (binutils) not found: cannot tell which sanitizer runtimes the "
                    "sanitised shim needs preloaded before it")
    needed = dynamic_needed(tool, shim)
    runtimes = [n for n in needed if SANITIZER_NEEDED.match(n)]
    runtimes.sort(key=lambda n: 0 if n.startswith("libasan") else 1)
    return runtimes


@pytest.fixture(scope="session")
def runner(shim, sanitizer_runtimes):
    def run(argv, with_shim, env=None):
        # No CUARENA_* of the caller's (the shim reads its settings from them), no loader tracing.
        e = {k: v for k, v in os.environ.items()
             if not k.startswith("CUARENA_") and k not in ("LD_PRELOAD", "LD_DEBUG")}
        e["CUDA_VISIBLE_DEVICES"] = ""  # no GPU visible, even on a GPU machine
        e["LC_ALL"] = "C"
        if sanitizer_runtimes:
            e["ASAN_OPTIONS"] = ":".join(filter(None, [e.get("ASAN_OPTIONS"), "detect_leaks=0"]))
        e.update(env or {})
        preload = list(sanitizer_runtimes) + ([shim] if with_shim else [])
        if preload:
            e["LD_PRELOAD"] = ":".join(preload)
        argv = tuple(str(a) for a in argv)
        try:
            proc = subprocess.run(argv, env=e, capture_output=True, timeout=60)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"timed out after 60 s: LD_PRELOAD={e.get('LD_PRELOAD', '')!r} "
                        f"{shlex.join(argv)}\n{exc.stdout!r}\n{exc.stderr!r}")
        return Run(argv, e.get("LD_PRELOAD", ""), proc.returncode,
                   proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))
    return run


def _diff(a, b, what):
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                        f"{what} without the shim", f"{what} with the shim"))


def compare(runner, argv, env=None):
    """Runs argv without and with the shim; asserts identical stdout, stderr and exit status.
    Returns the run without the shim, for the caller to check that it printed what it should
    (two empty outputs compare equal and prove nothing)."""
    base = runner(argv, with_shim=False, env=env)
    shimmed = runner(argv, with_shim=True, env=env)
    problems = []
    if base.returncode != shimmed.returncode:
        problems.append(f"exit status {base.returncode} without the shim, "
                        f"{shimmed.returncode} with it")
    if base.stdout != shimmed.stdout:
        problems.append(_diff(base.stdout, shimmed.stdout, "stdout"))
    if base.stderr != shimmed.stderr:
        problems.append(_diff(base.stderr, shimmed.stderr, "stderr"))
    if SANITIZER == "address" and shimmed.returncode == -11 and base.returncode != -11:
        problems.append("(SIGSEGV under ASan with the shim only: is the shim's dlsym path "
                        "instrumented? ASan calls it before its shadow memory exists)")
    assert not problems, ("the shim changed the program's behaviour:\n" + "\n".join(problems)
                          + f"\n\n{base.describe()}\n{shimmed.describe()}")
    return base


# ---------------------------------------------------------------------------------------------
# 1. DT_NEEDED


def test_readers_work(readelf):
    """The ELF readers and the export check work on a known library: libshim_probe_wrap.so
    exports its two functions and needs libshim_probe_base.so, and export_problems reports the
    hooks it lacks and the names it should not export. (So a clean result below means something.)"""
    wrap = os.path.join(os.path.dirname(_env_path("CUARENA_SHIM_DLSYM_PROBE", "dlsym_probe")),
                        "libshim_probe_wrap.so")
    symbols = dynamic_symbols(readelf, wrap)
    names = {s.name for s in exported(symbols)}
    assert {"probe_layer", "probe_wrap_next"} <= names, names
    assert "dlsym" not in names and any(s.name == "dlsym" for s in symbols), symbols  # undefined
    problems = export_problems(symbols)
    assert any(p.startswith("missing export dlsym") for p in problems), problems
    assert any(p.startswith("missing export cudaMalloc") for p in problems), problems
    assert any(p.startswith("unexpected export probe_layer") for p in problems), problems
    assert "libshim_probe_base.so" in dynamic_needed(readelf, wrap)


def test_readers_see_cudart(readelf):
    """The shared-cudart probe needs libcudart, the static one does not: the DT_NEEDED check
    would see a cudart dependency, and the two probes test what they claim."""
    shared = dynamic_needed(readelf, _cuda_program("CUARENA_SHIM_CUDA_RT_SHARED"))
    assert any(CUDA_NEEDED.match(n) for n in shared), f"shared-cudart probe needs {shared}"
    static = dynamic_needed(readelf, _cuda_program("CUARENA_SHIM_CUDA_RT_STATIC"))
    assert not any(CUDA_NEEDED.match(n) for n in static), f"static-cudart probe needs {static}"


def test_no_cuda_needed(shim, readelf):
    needed = dynamic_needed(readelf, shim)
    cuda = [n for n in needed if CUDA_NEEDED.match(n)]
    assert not cuda, (f"the shim has DT_NEEDED {cuda}: it must resolve CUDA lazily "
                      f"(DT_NEEDED of {shim}: {needed})")


def test_needed_allowed(shim, readelf, sanitizer_runtimes):
    needed = dynamic_needed(readelf, shim)
    sanitized = SANITIZER != "none"
    bad = [n for n in needed
           if not ALLOWED_NEEDED.match(n) and not (sanitized and SANITIZER_NEEDED.match(n))]
    assert not bad, (f"DT_NEEDED outside the allowed set: {bad}\n"
                     f"all DT_NEEDED of {shim}: {needed}\n"
                     f"allowed: {ALLOWED_NEEDED.pattern}"
                     + (" and sanitizer runtimes" if sanitized else ""))


# ---------------------------------------------------------------------------------------------
# 2. Exports


def test_exports_exactly_the_hooks(shim, readelf):
    symbols = dynamic_symbols(readelf, shim)
    problems = export_problems(symbols)
    assert not problems, ("the shim's dynamic symbol table is not the expected interface:\n  "
                          + "\n  ".join(problems)
                          + "\nexported now:\n  " + "\n  ".join(map(str, exported(symbols))))


# ---------------------------------------------------------------------------------------------
# 3. Programs that never touch CUDA


def test_preload_takes_effect(runner):
    """The shim really is mapped in the runs 'with' it (else every comparison is vacuous)."""
    argv = [sys.executable, "-c",
            "print(any('libcuarena_preload' in l for l in open('/proc/self/maps')))"]
    base, shimmed = runner(argv, with_shim=False), runner(argv, with_shim=True)
    assert base.stdout == "False\n", base.describe()
    assert shimmed.stdout == "True\n", shimmed.describe()


def test_sh(runner):
    base = compare(runner, ["/bin/sh", "-c", "echo hi; echo oops >&2; exit 3"])
    assert (base.stdout, base.stderr, base.returncode) == ("hi\n", "oops\n", 3), base.describe()


PYTHON_PROGRAM = r"""
import ctypes, decimal, hashlib, json, sys
libm = ctypes.CDLL("libm.so.6")
libm.cos.restype = ctypes.c_double
libm.cos.argtypes = [ctypes.c_double]
print("cos(0.5) via ctypes:", libm.cos(0.5))
libc = ctypes.CDLL(None)
print("strlen via dlsym(RTLD_DEFAULT):", libc.strlen(b"cuarena"))
print("missing symbol:", hasattr(libc, "cuarena_no_such_symbol"))
print(json.dumps({"sha": hashlib.sha256(b"x").hexdigest()[:12], "d": str(decimal.Decimal(1) / 7)}))
print("to stderr", file=sys.stderr)
sys.exit(4)
"""


def test_python(runner):
    base = compare(runner, [sys.executable, "-c", PYTHON_PROGRAM])
    assert base.returncode == 4, base.describe()
    assert "cos(0.5) via ctypes: 0.8775825618903728" in base.stdout, base.describe()
    assert "strlen via dlsym(RTLD_DEFAULT): 7" in base.stdout, base.describe()
    assert "missing symbol: False" in base.stdout, base.describe()
    assert base.stderr == "to stderr\n", base.describe()


def test_dlsym_probe(runner):
    """dlopen/dlsym/dlvsym of ordinary symbols, misses, RTLD_DEFAULT and RTLD_NEXT (from the
    program and from inside a library) answer as without the shim."""
    base = compare(runner, [_env_path("CUARENA_SHIM_DLSYM_PROBE", "dlsym_probe")])
    out = base.stdout
    assert base.returncode == 0 and base.stderr.endswith("dlsym_probe: done\n"), base.describe()
    expect = [
        "dlsym(libm, cos): found in libm.so.6 as ",  # an IFUNC: dladdr may name no symbol
        "cos(0.5) = 0.877582561890",
        "dlsym(libm, cuarena_no_such_symbol): NULL, dlerror: ",
        "dlsym(RTLD_DEFAULT, cuarena_no_such_symbol): NULL, dlerror: ",
        "dlsym(RTLD_DEFAULT, probe_layer): found in libshim_probe_wrap.so as probe_layer",
        "dlsym(RTLD_NEXT, probe_layer): found in libshim_probe_wrap.so as probe_layer",
        # the trap: RTLD_NEXT from inside the wrap library skips the wrap library
        "wrap: dlsym(RTLD_NEXT, probe_layer): found in libshim_probe_base.so as probe_layer",
        "wrap: next probe_layer() = base",
        "wrap: dlsym(RTLD_NEXT, cuarena_no_such_symbol): NULL, dlerror: ",
    ]
    missing = [line for line in expect if line not in out]
    assert not missing, f"the probe (without the shim) did not print {missing}\n{base.describe()}"
    for line in out.splitlines():
        if ": NULL, dlerror: " in line:
            assert not line.endswith("dlerror: (null)"), f"a miss left no dlerror: {line}"
    assert re.search(r"^dlsym\(RTLD_DEFAULT, printf\): found in lib\S+ as \w*printf,", out, re.M), out


# ---------------------------------------------------------------------------------------------
# 4. CUDA programs that find no GPU


@pytest.mark.parametrize("which", ["STATIC", "SHARED"])
def test_cuda_runtime_without_gpu(runner, which):
    base = compare(runner, [_cuda_program(f"CUARENA_SHIM_CUDA_RT_{which}")])
    assert base.returncode == 0 and base.stderr == "cuda_rt_probe: done\n", base.describe()
    m = re.search(r"^cudaGetDeviceCount: (\d+) (\w+)$", base.stdout, re.M)
    assert m and int(m.group(1)) != 0, f"expected an error (no GPU visible):\n{base.describe()}"
    for call in ("cudaMalloc(1 MiB)", "cudaMemGetInfo", "cudaFree", "cudaMallocAsync(4 KiB)",
                 "cudaFreeAsync", "cudaGetDriverEntryPointByVersion(cuMemAlloc, 12000)"):
        assert re.search(rf"^{re.escape(call)}: -?\d+ \w+$", base.stdout, re.M), \
            f"{call} not reported:\n{base.describe()}"


def test_cuda_driver_without_gpu(runner):
    base = compare(runner, [_env_path("CUARENA_SHIM_CUDA_DRIVER_PROBE", "cuda_driver_probe")])
    assert base.returncode == 0 and base.stderr.endswith("cuda_driver_probe: done\n") \
        or base.stdout == "no libcuda\n", base.describe()
    if base.stdout == "no libcuda\n":
        assert "libcuda.so.1" in base.stderr, base.describe()
    else:
        m = re.search(r"^cuInit\(0\) = (-?\d+)$", base.stdout, re.M)
        assert m and int(m.group(1)) != 0, f"expected cuInit to fail (no GPU visible):\n{base.describe()}"


def test_torch_without_gpu(runner):
    """PyTorch (dlopen of its CUDA libraries, cudart's lazy dlopen of libcuda) with no GPU."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (CUARENA_NO_TORCH=1?)")
    base = compare(runner, [sys.executable, "-c",
                            "import torch; print('available', torch.cuda.is_available(), "
                            "'count', torch.cuda.device_count())"])
    assert base.returncode == 0 and "available False count 0" in base.stdout, base.describe()


def test_pytorch_drop_in_stays_off_under_the_shim(runner):
    """The shim sets CUARENA=0, so cuarena's pip-installed PyTorch drop-in does not also start and
    read the shim's CUARENA_CONF keys (memory_limit is the shim's alone) or its CUARENA_TRACE."""
    prog = [sys.executable, "-c", "import os; print(os.environ.get('CUARENA'))"]
    env = {"CUARENA": "1", "CUARENA_CONF": "memory_limit:40GiB"}
    plain = runner(prog, with_shim=False, env=env)
    assert plain.returncode == 0 and plain.stdout.strip() == "1", plain.describe()
    shimmed = runner(prog, with_shim=True, env=env)
    assert shimmed.returncode == 0 and shimmed.stdout.strip() == "0", shimmed.describe()


def test_trace_is_not_overwritten_by_a_process_without_memory_calls(runner, tmp_path):
    """CUARENA_TRACE is written only by a process that recorded events: a launcher or a shell
    command of the job must not replace the trace of the process that allocated."""
    kept = tmp_path / "job.cuat"
    kept.write_bytes(b"the job's trace")
    # (Python, not sh: dash leaves with _exit, which skips the shim's exit handler.)
    prog = [sys.executable, "-c", "pass"]
    run = runner(prog, with_shim=True, env={"CUARENA_TRACE": str(kept)})
    assert run.returncode == 0, run.describe()
    assert kept.read_bytes() == b"the job's trace"
    absent = tmp_path / "none.cuat"
    run = runner(prog, with_shim=True, env={"CUARENA_TRACE": str(absent)})
    assert run.returncode == 0 and not absent.exists(), run.describe()


# ---------------------------------------------------------------------------------------------
# 5. Bad configuration (the contract: BAD_CONF_*)


def _bad_conf_program(which):
    if which == "sh":
        return ["/bin/sh", "-c", "echo job ran"]
    return [_cuda_program("CUARENA_SHIM_CUDA_RT_SHARED")]


@pytest.mark.parametrize("which", BAD_CONF_PROGRAMS)
def test_bad_conf_fails_with_one_line(runner, which):
    """With CUARENA_CONF naming an unknown key, the shim says so on one line of stderr and the
    process exits with BAD_CONF_EXIT_STATUS, before the job starts."""
    program = _bad_conf_program(which)
    conf = {"CUARENA_CONF": BAD_CONF}
    # Without the shim the variable means nothing; with the shim and no variable, all is well:
    # so a failure below is the shim's answer to the key.
    plain = runner(program, with_shim=False, env=conf)
    assert plain.returncode == 0 and plain.stdout, plain.describe()
    good = runner(program, with_shim=True)
    assert good.returncode == 0 and good.stdout == plain.stdout, good.describe()

    bad = runner(program, with_shim=True, env=conf)
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == BAD_CONF_EXIT_STATUS, \
        f"expected exit status {BAD_CONF_EXIT_STATUS}:\n{bad.describe()}"
    assert len(lines) == 1, f"expected one line on stderr:\n{bad.describe()}"
    assert lines[0].startswith(BAD_CONF_MESSAGE_PREFIX) and BAD_CONF_KEY in lines[0], \
        f"expected '{BAD_CONF_MESSAGE_PREFIX} ...{BAD_CONF_KEY}...':\n{bad.describe()}"
    assert bad.stdout == "", f"the job started despite the bad setting:\n{bad.describe()}"


def test_an_unwritable_trace_path_is_said_once_at_start(runner, tmp_path):
    """CUARENA_TRACE in a folder that cannot be written: one line at the start naming it and
    where the recording goes instead; the job runs on and exits as it would."""
    prog = [sys.executable, "-c", "print('job ran')"]
    bad = tmp_path / "missing" / "t.cuat"
    run = runner(prog, with_shim=True, env={"CUARENA_TRACE": str(bad), "TMPDIR": str(tmp_path)})
    assert run.returncode == 0 and run.stdout == "job ran\n", run.describe()
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.describe()
    assert lines[0].startswith(f"cuarena: CUARENA_TRACE={bad}: cannot write in "
                               f"{bad.parent}: No such file or directory; recording to "
                               f"{tmp_path}/cuarena-trace."), lines[0]


@pytest.mark.parametrize("word", ["off", "no", "false", "0", "OFF"])
def test_switch_words_turn_log_and_summary_off(runner, tmp_path, word):
    """CUARENA_LOG=off writes no file named `off`; CUARENA_SUMMARY=no prints no summary."""
    prog = [sys.executable, "-c", "print('job ran')"]
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the job's working folder, where a file named `off` would appear
    try:
        run = runner(prog, with_shim=True, env={"CUARENA_LOG": word, "CUARENA_SUMMARY": word})
    finally:
        os.chdir(cwd)
    assert run.returncode == 0 and run.stdout == "job ran\n" and run.stderr == "", run.describe()
    assert not list(tmp_path.iterdir()), sorted(p.name for p in tmp_path.iterdir())


def test_a_switch_that_is_no_word_stops_the_job_with_one_line(runner):
    run = runner(["/bin/sh", "-c", "echo job ran"], with_shim=True,
                 env={"CUARENA_SUMMARY": "maybe"})
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == BAD_CONF_EXIT_STATUS and run.stdout == "", run.describe()
    assert len(lines) == 1 and lines[0].startswith("cuarena: CUARENA_SUMMARY=maybe: expected"), \
        run.describe()
