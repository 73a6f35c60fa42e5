"""Tests of the package `cuarena` through a C library, without a GPU.

- A stub library with the C API of cuarena/torch_c_api.h, compiled here, checks the ctypes
  layer (types, error messages, int64 results), enable() / is_enabled() / memory_available(),
  the torch-version check, the autoload hook in a fresh process, record() and CUARENA_TRACE.
- The real libcuarena_torch.so, when $CUARENA_TORCH_LIB names one (the CMake build sets it for
  CTest), checks bad values through cuarena_config_check and the whole
  PYTORCH_CUDA_ALLOC_CONF=backend:cuarena route with torch.cuda.get_allocator_backend().

All need torch (skipped without it); the stub's tests need a C compiler.
"""

import ctypes
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_package import PACKAGE_ROOT, REPO, clean_env  # also puts the package on sys.path

torch = pytest.importorskip("torch", reason="torch is not installed (CUARENA_NO_TORCH=1?)")

import cuarena  # noqa: E402
from cuarena import _api, _autoload, _conf, _lib  # noqa: E402

STUB_C = r"""
/* A stand-in for libcuarena_torch.so: the C API of cuarena/torch_c_api.h, no torch, no CUDA. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int installed;
static char last[4096];
const char* cuarena_torch_built_for(void) {
  const char* v = getenv("CUARENA_STUB_BUILT_FOR");
  return v ? v : "2.11.0+stub";
}
const char* cuarena_config_keys(void) {
  return "per_process_memory_fraction, stream_cache_bytes,upstream";
}
/* A value "bad" is rejected, naming the position of its item's key, like cuarena's parser. */
int cuarena_config_check(const char* c, char* err, size_t n) {
  const char* bad = strstr(c, "bad");
  if (!bad) return 0;
  const char* k = bad;
  while (k > c && k[-1] != ',') --k;
  while (*k == ' ') ++k;
  if (err) snprintf(err, n, "cuarena config: bad value \"bad\" at position %d", (int)(k - c));
  return 1;
}
int cuarena_torch_install(const char* c, char* err, size_t n) {
  if (strstr(c, "fail")) {
    if (err) snprintf(err, n, "stub: install refused");
    return 3;
  }
  snprintf(last, sizeof last, "%s", c);
  installed = 1;
  return 0;
}
int cuarena_torch_is_installed(void) { return installed; }
int64_t cuarena_memory_available(int d, char* err, size_t n) {
  if (d < 0 || d > 7) {
    if (err) snprintf(err, n, "stub: no CUDA device %d", d);
    return -1;
  }
  return ((int64_t)d << 40) + 12345; /* beyond 32 bits */
}
/* Two lines, the second past 32 bits; device 5 asks for a retry with a larger buffer. */
int64_t cuarena_stats(int d, char* buf, size_t n, char* err, size_t errn) {
  if (d < 0 || d > 7) {
    if (err) snprintf(err, errn, "stub: no CUDA device %d", d);
    return -1;
  }
  char text[20000];
  int len = snprintf(text, sizeof text, "cuarena.memory_first %d\nreserved_bytes.all.current %lld\n",
                     d % 2, (long long)d << 40);
  if (d == 5) {
    memset(text + len, 'x', 17000); /* a long key: more than the first buffer holds */
    len += 17000;
    len += snprintf(text + len, sizeof text - len, " 7\n");
  }
  if (buf && (size_t)len < n) memcpy(buf, text, len + 1);
  return len;
}
const char* stub_last_config(void) { return last; }
void stub_reset(void) { installed = 0; last[0] = 0; }
"""


@pytest.fixture(scope="session")
def stub_path(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stub library")
    d = tmp_path_factory.mktemp("stub")
    (d / "stub.c").write_text(STUB_C)
    path = d / "libcuarena_torch.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(path), str(d / "stub.c")],
                   check=True)
    return path


@pytest.fixture
def stub(stub_path, monkeypatch):
    """The stub loaded in this process as cuarena's library, with fresh package state."""
    monkeypatch.setenv("CUARENA_TORCH_LIB", str(stub_path))
    monkeypatch.setenv("CUARENA_STUB_BUILT_FOR", torch.__version__)
    _lib._reset_for_tests()
    monkeypatch.setattr(_api, "_enabled", None)
    dll = ctypes.CDLL(str(stub_path))
    dll.stub_last_config.restype = ctypes.c_char_p
    dll.stub_reset()
    yield dll
    _lib._reset_for_tests()


# --- The loader ---------------------------------------------------------------------------------

def test_loads_and_types_the_c_api(stub):
    lib = _lib.load()
    assert lib.path == Path(os.environ["CUARENA_TORCH_LIB"])
    assert _lib.load() is lib  # once per process
    assert lib.built_for() == torch.__version__
    assert cuarena.config_keys() == ["per_process_memory_fraction", "stream_cache_bytes",
                                     "upstream"]
    assert lib.missing == list(_lib.PLUGGABLE_SIGNATURES)  # the stub has no pluggable ABI
    assert cuarena.library_path() == lib.path


def test_refuses_a_library_built_for_another_torch_minor(stub, monkeypatch):
    major, minor = _lib.minor_version(torch.__version__)
    monkeypatch.setenv("CUARENA_STUB_BUILT_FOR", f"{major}.{minor + 1}.0+cu130")
    with pytest.raises(cuarena.CuarenaError) as e:
        _lib.load()
    assert str(e.value) == (f"cuarena was built for torch {major}.{minor + 1} but torch "
                            f"{torch.__version__} is installed; reinstall cuarena (pip install .) "
                            f"against this torch")
    assert _lib.loaded() is None
    monkeypatch.setenv("CUARENA_STUB_BUILT_FOR", f"{major}.{minor}.9")  # patch level: fine
    assert _lib.load().built_for() == f"{major}.{minor}.9"


def test_a_library_for_another_minor_is_refused_before_loading(monkeypatch, tmp_path):
    # An installed library names its torch in a side file; one that would not even load (its
    # symbols are another torch's) is refused in one line without a dlopen.
    lib = tmp_path / "libcuarena_torch.so"
    lib.write_bytes(b"not an ELF file: loading it would fail")
    (tmp_path / "libcuarena_torch.so.torch").write_text("2.3.1+cu121\n")
    monkeypatch.setenv("CUARENA_TORCH_LIB", str(lib))
    _lib._reset_for_tests()
    with pytest.raises(cuarena.CuarenaError) as e:
        _lib.load()
    assert str(e.value) == (f"cuarena was built for torch 2.3 but torch {torch.__version__} is "
                            f"installed; reinstall cuarena (pip install .) against this torch")


def test_missing_library_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.setenv("CUARENA_TORCH_LIB", str(tmp_path / "nothing.so"))
    _lib._reset_for_tests()
    with pytest.raises(cuarena.CuarenaError,
                       match=r"nothing\.so \(named by \$CUARENA_TORCH_LIB\) does not exist; "
                             r".*pip install \..*CUARENA_TORCH_LIB"):
        _lib.load()
    monkeypatch.delenv("CUARENA_TORCH_LIB")
    assert _lib.library_path() == PACKAGE_ROOT / "cuarena" / "lib" / "libcuarena_torch.so"


def test_a_library_without_the_api_is_refused(monkeypatch, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "x.c").write_text("int unrelated(void) { return 0; }\n")
    path = tmp_path / "libx.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(path), str(tmp_path / "x.c")], check=True)
    monkeypatch.setenv("CUARENA_TORCH_LIB", str(path))
    _lib._reset_for_tests()
    with pytest.raises(cuarena.CuarenaError, match="does not export cuarena_torch_install"):
        _lib.load()
    (tmp_path / "garbage.so").write_text("not an ELF file")
    monkeypatch.setenv("CUARENA_TORCH_LIB", str(tmp_path / "garbage.so"))
    with pytest.raises(cuarena.CuarenaError, match="cannot load .*garbage.so"):
        _lib.load()


# --- enable() and friends -----------------------------------------------------------------------

def test_enable_installs_once_and_refuses_another_config(stub):
    assert not cuarena.is_enabled()
    cuarena.enable("stream_cache_bytes:0, upstream:async")
    assert cuarena.is_enabled()
    assert stub.stub_last_config() == b"stream_cache_bytes:0, upstream:async"
    assert cuarena.enabled_config() == "stream_cache_bytes:0, upstream:async"
    cuarena.enable({"upstream": "async", "stream_cache_bytes": 0})  # same config: no-op
    with pytest.raises(cuarena.CuarenaError) as e:
        cuarena.enable("stream_cache_bytes:1MiB")
    assert "'stream_cache_bytes:0, upstream:async'" in str(e.value)
    assert "'stream_cache_bytes:1MiB'" in str(e.value)
    assert not isinstance(e.value, cuarena.ConfigError)
    assert stub.stub_last_config() == b"stream_cache_bytes:0, upstream:async"


def test_enable_reads_cuarena_conf_when_given_no_config(stub, monkeypatch):
    monkeypatch.setenv("CUARENA_CONF", "upstream:malloc")
    cuarena.enable()
    assert stub.stub_last_config() == b"upstream:malloc"


def test_enable_bad_config_is_a_config_error_and_installs_nothing(stub):
    with pytest.raises(cuarena.ConfigError, match=r'^config: cuarena config: bad value "bad" at '
                                                  r'position 5$'):
        cuarena.enable("x:1, y:bad")
    assert not cuarena.is_enabled() and cuarena.enabled_config() is None
    with pytest.raises(cuarena.CuarenaError, match="^stub: install refused$") as e:
        cuarena.enable("upstream:fail")
    assert not isinstance(e.value, cuarena.ConfigError)
    with pytest.raises(cuarena.ConfigError, match=r"config\['a'\].*expected a str"):
        cuarena.enable({"a": [1]})
    with pytest.raises(TypeError):
        cuarena.enable(42)


def test_enable_refuses_after_cuda_initialised(stub, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(cuarena.CuarenaError) as e:
        cuarena.enable()
    message = str(e.value)
    for words in ("CUDA is already initialised", "cannot be swapped", "cuarena.enable() before",
                  "CUARENA=1", "PYTORCH_CUDA_ALLOC_CONF=backend:cuarena"):
        assert words in message
    assert not cuarena.is_enabled() and stub.stub_last_config() == b""


@pytest.mark.parametrize("device, error", [(-1, ValueError), ("0", TypeError), (True, TypeError),
                                           (1.0, TypeError)])
def test_enable_validates_device(stub, device, error):
    with pytest.raises(error):
        cuarena.enable(device=device)
    assert not cuarena.is_enabled()
    cuarena.enable(device=3)
    assert cuarena.is_enabled()


def test_config_dict_values():
    assert _api.config_string({"a": True, "b": False, "c": 0, "d": 0.25, "e": "2MiB"}) == \
        "a:True,b:False,c:0,d:0.25,e:2MiB"
    with pytest.raises(cuarena.ConfigError):
        _api.config_string({"": 1})


def test_stats_parse_int64_lines_retry_a_short_buffer_and_carry_errors(stub):
    s = cuarena.stats(3)
    assert s == {"cuarena.memory_first": 1, "reserved_bytes.all.current": 3 << 40}
    assert cuarena.stats(torch.device("cuda", 2))["cuarena.memory_first"] == 0
    long = cuarena.stats(5)
    assert long["x" * 17000] == 7 and long["reserved_bytes.all.current"] == 5 << 40
    with pytest.raises(cuarena.CuarenaError, match="stub: no CUDA device 9"):
        cuarena.stats(9)


def test_memory_available_is_int64_bytes_and_errors_carry_the_message(stub):
    assert cuarena.memory_available(3) == (3 << 40) + 12345
    assert cuarena.memory_available(torch.device("cuda", 2)) == (2 << 40) + 12345
    with pytest.raises(cuarena.CuarenaError, match="^stub: no CUDA device 9$"):
        cuarena.memory_available(9)
    with pytest.raises(ValueError):
        cuarena.memory_available(torch.device("cpu"))


def test_is_enabled_never_loads_the_library(monkeypatch):
    _lib._reset_for_tests()
    monkeypatch.setenv("CUARENA_TORCH_LIB", "/nonexistent/libcuarena_torch.so")
    assert cuarena.is_enabled() is False


# --- The environment route, in this process (activate) and in a fresh one (hook) ----------------

def test_activate_checks_each_source_at_its_own_positions(stub):
    text = "backend:cuarena,pinned_use_cuda_host_register:True, stream_cache_bytes:bad"
    env = {"PYTORCH_CUDA_ALLOC_CONF": text}
    with pytest.raises(cuarena.ConfigError) as e:
        _autoload.activate(env)
    assert str(e.value) == ('PYTORCH_CUDA_ALLOC_CONF: cuarena config: bad value "bad" at '
                            f'position {text.index("stream_cache_bytes")}')
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": text}  # untouched on failure
    env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena", "CUARENA_CONF": "upstream:bad"}
    with pytest.raises(cuarena.ConfigError, match='^CUARENA_CONF: .* at position 0$'):
        _autoload.activate(env)
    assert not cuarena.is_enabled()


def test_activate_rewrites_the_environment_it_is_given(stub, capfd):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,expandable_segments:True,upstream:async,"
                                      "pinned_use_cuda_host_register:True"}
    assert _autoload.activate(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True",
                   "CUARENA": "1", "CUARENA_CONF": "upstream:async"}
    assert stub.stub_last_config() == b"upstream:async"
    err = capfd.readouterr().err
    assert err.startswith("cuarena: expandable_segments has no effect: ") and err.count("\n") == 1
    assert not _autoload.activate({"PYTORCH_CUDA_ALLOC_CONF": "backend:native"})


HOOK = """
import json, os, sys
import torch
import cuarena
from cuarena import _autoload
_autoload.hook()
print(json.dumps({"enabled": cuarena.is_enabled(), "config": cuarena.enabled_config(),
                  "backend": torch.cuda.get_allocator_backend(),
                  "cuda_initialized": torch.cuda.is_initialized(),
                  "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUARENA",
                                                         "CUARENA_CONF")}}))
"""
ROUTE = "backend:cuarena,pinned_use_cuda_host_register:True,stream_cache_bytes:0"


def run_hook(lib_path, **env):
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", HOOK],
                          env=clean_env(CUARENA_TORCH_LIB=str(lib_path), **env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_hook_enables_from_pytorch_variable_with_stub(stub_path):
    result, _ = run_hook(stub_path, PYTORCH_CUDA_ALLOC_CONF=ROUTE,
                         CUARENA_STUB_BUILT_FOR=torch.__version__)
    assert result["enabled"] and result["config"] == "stream_cache_bytes:0"
    assert result["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True",
                             "CUARENA": "1", "CUARENA_CONF": "stream_cache_bytes:0"}
    assert not result["cuda_initialized"]


@pytest.fixture(scope="session")
def entry_point_dir(tmp_path_factory):
    """A directory that, on PYTHONPATH, declares the package's torch.backends entry point as
    pyproject.toml does (what `pip install .` would register), for the source tree's package."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    d = tmp_path_factory.mktemp("site")
    info = d / f"cuarena-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: cuarena\n"
                                   f"Version: {project['version']}\n")
    lines = ["[torch.backends]"] + [f"{name} = {target}" for name, target in
                                    project["entry-points"]["torch.backends"].items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return d


ENTRY = """
import json, os
import torch  # nothing else: torch runs the entry point
import cuarena
print(json.dumps({"enabled": cuarena.is_enabled(), "backend": torch.cuda.get_allocator_backend(),
                  "cuda_initialized": torch.cuda.is_initialized(),
                  "env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}))
"""


def run_entry_point(entry_point_dir, lib_path, **env):
    env = clean_env(CUARENA_TORCH_LIB=str(lib_path), TORCH_DEVICE_BACKEND_AUTOLOAD="1", **env)
    env["PYTHONPATH"] = os.pathsep.join([str(entry_point_dir), env["PYTHONPATH"]])
    return subprocess.run([sys.executable, "-W", "ignore", "-c", ENTRY], env=env,
                          capture_output=True, text=True, timeout=300)


def test_import_torch_runs_the_entry_point(entry_point_dir, stub_path):
    proc = run_entry_point(entry_point_dir, stub_path, PYTORCH_CUDA_ALLOC_CONF=ROUTE,
                           CUARENA_STUB_BUILT_FOR=torch.__version__)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["enabled"] and not result["cuda_initialized"]
    assert result["env"] == "pinned_use_cuda_host_register:True"
    proc = run_entry_point(entry_point_dir, stub_path, CUARENA_STUB_BUILT_FOR=torch.__version__)
    assert proc.returncode == 0, proc.stderr  # not asked: nothing happens
    assert json.loads(proc.stdout.splitlines()[-1])["enabled"] is False
    proc = run_entry_point(entry_point_dir, stub_path, CUARENA="1",
                           CUARENA_STUB_BUILT_FOR="0.1")
    assert proc.returncode == 2  # asked and impossible: the process ends, saying why in a line
    assert proc.stderr.startswith("cuarena: cuarena was built for torch 0.1 but"), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("env, expected", [
    ({"CUARENA_CONF": "bogus:1"}, "cuarena: CUARENA_CONF: unknown key 'bogus' at position 0;"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,stream_cahce_bytes:0"},
     "cuarena: PYTORCH_CUDA_ALLOC_CONF: unknown key 'stream_cahce_bytes' at position 16 "
     "(did you mean 'stream_cache_bytes'?);"),
    ({"PYTORCH_ALLOC_CONF": "backend:cuarena,bogus:1"},
     "cuarena: PYTORCH_ALLOC_CONF: unknown key 'bogus' at position 16;"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cuarena,small_limit"},
     "cuarena: PYTORCH_CUDA_ALLOC_CONF: expected key:value at position 16, got 'small_limit'"),
])
def test_a_bad_entry_ends_import_torch_in_one_line(entry_point_dir, stub_path, env, expected):
    if "PYTORCH_ALLOC_CONF" in env and _conf.minor_of(torch.__version__) < 10:
        pytest.skip(f"torch {torch.__version__} does not read PYTORCH_ALLOC_CONF")
    proc = run_entry_point(entry_point_dir, stub_path, CUARENA_STUB_BUILT_FOR=torch.__version__,
                           **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(expected), proc.stderr
    assert len(proc.stderr.splitlines()) <= 3 and "Traceback" not in proc.stderr, proc.stderr


def test_info_with_a_bad_entry_reports_it_without_a_traceback(entry_point_dir, stub_path):
    env = clean_env(CUARENA_TORCH_LIB=str(stub_path), TORCH_DEVICE_BACKEND_AUTOLOAD="1",
                    CUARENA_STUB_BUILT_FOR=torch.__version__, CUARENA_CONF="bogus:1")
    env["PYTHONPATH"] = os.pathsep.join([str(entry_point_dir), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "cuarena", "info"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("enabling from the environment failed: CUARENA_CONF: unknown key 'bogus' at "
            "position 0") in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    assert "CUARENA_CONF=bogus:1\n" in proc.stdout, proc.stdout


def test_hook_failure_is_reported_with_the_key(stub_path):
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", "import torch\nfrom cuarena import _autoload\n"
                                               "_autoload.hook()"],
        env=clean_env(CUARENA_TORCH_LIB=str(stub_path), CUARENA_STUB_BUILT_FOR=torch.__version__,
                      PYTORCH_CUDA_ALLOC_CONF="backend:cuarena,max_split_size_mb:64,bogus:1"),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("cuarena: PYTORCH_CUDA_ALLOC_CONF: unknown key 'bogus' at "
                                  "position 37"), proc.stderr  # "backend:...:64," is 37 long


def test_cli_run_and_info_with_stub(stub_path, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys, cuarena\nprint(sys.argv[1:], cuarena.is_enabled(), "
                      "__name__)\nsys.exit(7)\n")
    env = clean_env(CUARENA_TORCH_LIB=str(stub_path), CUARENA_STUB_BUILT_FOR=torch.__version__)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "cuarena", "run", "--config",
                           "upstream:async", str(script), "a", "--flag"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == "['a', '--flag'] True __main__"
    (tmp_path / "jobmod.py").write_text(script.read_text())
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "cuarena", "run", "-m", "jobmod",
                           "b"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == "['b'] True __main__"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "cuarena", "info"],
                          env=dict(env, CUARENA="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"library: {stub_path}\n" in proc.stdout
    assert f"built for torch: {torch.__version__}\n" in proc.stdout
    assert "enabled: yes" in proc.stdout
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "cuarena", "run", str(script)],
                          env=dict(env, CUARENA_STUB_BUILT_FOR="1.0"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1
    assert "cuarena: error: cuarena was built for torch 1.0 but" in proc.stderr
    for args, expected in [
        (["--config", "bogus:1", str(script)],
         "cuarena: error: --config: unknown key 'bogus' at position 0;"),
        (["-m", "no_such_module_here"],
         "cuarena: error: no module named 'no_such_module_here'"),
    ]:
        proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "cuarena", "run", *args],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith(expected) and proc.stderr.count("\n") == 1, proc.stderr


# --- record() and CUARENA_TRACE ------------------------------------------------------------------

class FakeHistory:
    """Stands in for torch.cuda.memory's recorder (it needs a GPU)."""

    def __init__(self, snapshot):
        self.calls = []
        self.snapshot = snapshot

    def record(self, enabled="all", **kwargs):
        self.calls.append((enabled, kwargs))

    def take(self):
        return self.snapshot

    def init(self):  # torch.cuda.init(): CUDA is initialised before recording starts
        self.calls.append(("init", {}))


@pytest.fixture
def history(monkeypatch):
    sys.path.insert(0, str(REPO / "tools" / "trace"))
    snapshot_file = REPO / "tests" / "data" / "traces" / "edge" / "expandable_segments.pickle"
    fake = FakeHistory(pickle.loads(snapshot_file.read_bytes()))
    fake.source = snapshot_file
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake.take)
    monkeypatch.setattr(torch.cuda, "init", fake.init)
    return fake


@pytest.mark.parametrize("name", ["job.pickle", "job.pickle.gz"])
def test_record_writes_a_snapshot_cuarena_replay_reads(history, tmp_path, name):
    import cuarena_trace
    path = tmp_path / name
    with cuarena.record(path, max_entries=1000) as rec:
        assert history.calls == [("init", {}), ("all", {"context": None, "max_entries": 1000})]
        assert rec.path == path
    assert history.calls[-1] == (None, {})
    data = path.read_bytes()
    assert (data[:2] == b"\x1f\x8b") == name.endswith(".gz")
    assert cuarena_trace.load_trace(str(path)) == cuarena_trace.load_trace(str(history.source))
    assert os.listdir(tmp_path) == [name]  # no temporary file left


def test_record_nests_and_stops_even_when_writing_fails(history, tmp_path):
    outer = cuarena.record(tmp_path / "a-{pid}-{rank}.pickle", stacks=True).start()
    assert history.calls[1] == ("all", {"context": "all", "stacks": "all",
                                        "max_entries": cuarena.DEFAULT_MAX_ENTRIES})
    assert outer.path.name == f"a-{os.getpid()}-{os.environ.get('RANK', '0')}.pickle"
    with pytest.raises(cuarena.CuarenaError, match="already started"):
        outer.start()
    calls = len(history.calls)
    with cuarena.record(tmp_path / "inner.pickle") as inner:  # nested: records nothing new
        assert [c for c in history.calls[calls:] if c[0] != "init"] == []
    assert inner.path.is_file()
    assert [c for c in history.calls[calls:] if c[0] != "init"] == []  # outer still recording
    good, history.snapshot = history.snapshot, {"unpicklable": lambda: 0}
    with pytest.raises(AttributeError, match="pickle"):
        outer.stop()
    history.snapshot = good
    assert history.calls[-1] == (None, {})  # stopped even though writing failed
    assert os.listdir(tmp_path) == ["inner.pickle"]
    with cuarena.record(tmp_path / "c.pickle"):  # a new recording starts afresh
        assert history.calls[-1] == ("all", {"context": None,
                                             "max_entries": cuarena.DEFAULT_MAX_ENTRIES})
    with pytest.raises(ValueError):
        cuarena.record(tmp_path / "d.pickle", max_entries=0)


def test_trace_starts_at_cuda_init_not_at_import(tmp_path):
    # CUARENA_TRACE without cuarena: the hook queues the start for CUDA's lazy init (no GPU
    # here, so starting then fails: reported on stderr, never raised) and writes nothing.
    code = """
import torch
from cuarena import _autoload, _record
n = len(torch.cuda._queued_calls)
_autoload.hook()
assert not torch.cuda.is_initialized()
assert len(torch.cuda._queued_calls) == n + 1
torch.cuda._queued_calls[-1][0]()  # what CUDA's lazy init would run
print("survived")
"""
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code],
                          env=clean_env(CUARENA_TRACE=str(tmp_path / "t.pickle")),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "survived"
    if not torch.cuda.is_available():
        assert "cuarena: CUARENA_TRACE: could not start recording: " in proc.stderr
    assert not (tmp_path / "t.pickle").exists() or torch.cuda.is_available()


# --- The real library ($CUARENA_TORCH_LIB) --------------------------------------------------

REAL = os.environ.get("CUARENA_TORCH_LIB", "")
needs_real = pytest.mark.skipif(
    not REAL or not Path(REAL).is_file(),
    reason=("CUARENA_TORCH_LIB is not set" if not REAL else f"CUARENA_TORCH_LIB={REAL} does not "
            "exist") + ": build libcuarena_torch.so (CUARENA_TORCH_ADAPTER=ON) to run these")


def run_real(code, **env):
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code],
                          env=clean_env(CUARENA_TORCH_LIB=REAL, **env), capture_output=True,
                          text=True, timeout=300)


@needs_real
def test_real_library_keys_version_and_bad_values():
    code = """
import json, torch, cuarena
out = {"keys": cuarena.config_keys(), "built_for": cuarena.built_for(), "torch": torch.__version__}
for text in ("stream_cache_bytes:lots", "upstream:vmm, stream_alias:maybe", "stream_cache_bytes:0"):
    try:
        cuarena.check_config(text)
        out[text] = "ok"
    except cuarena.ConfigError as e:
        out[text] = str(e)
print(json.dumps(out))
"""
    proc = run_real(code)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert {"per_process_memory_fraction", "stream_cache_bytes", "upstream"} <= set(out["keys"])
    assert _lib.minor_version(out["built_for"]) == _lib.minor_version(out["torch"])
    assert "'stream_cache_bytes'" in out["stream_cache_bytes:lots"]
    assert "position 0" in out["stream_cache_bytes:lots"]
    assert "'stream_alias' at position 14" in out["upstream:vmm, stream_alias:maybe"]
    assert out["stream_cache_bytes:0"] == "ok"


@needs_real
def test_real_library_bad_value_in_pytorch_variable_names_its_position():
    text = "backend:cuarena,pinned_use_cuda_host_register:True,stream_cache_bytes:lots"
    proc = run_real("import torch\nfrom cuarena import _autoload\n_autoload.hook()",
                    PYTORCH_CUDA_ALLOC_CONF=text)
    assert proc.returncode == 2
    assert proc.stderr.startswith("cuarena: PYTORCH_CUDA_ALLOC_CONF: "), proc.stderr
    assert f"position {text.index('stream_cache_bytes')}" in proc.stderr


@needs_real
def test_real_library_pytorch_variable_route():
    result, _ = run_hook(REAL, PYTORCH_CUDA_ALLOC_CONF=ROUTE)
    assert result["backend"] == "cuarena"  # torch.cuda.get_allocator_backend() needs no GPU
    assert result["enabled"] and result["config"] == "stream_cache_bytes:0"
    assert result["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "pinned_use_cuda_host_register:True"
    assert not result["cuda_initialized"]


@needs_real
def test_real_library_import_torch_alone_enables_cuarena(entry_point_dir):
    proc = run_entry_point(entry_point_dir, REAL, PYTORCH_CUDA_ALLOC_CONF=ROUTE)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"enabled": True, "backend": "cuarena", "cuda_initialized": False,
                      "env": "pinned_use_cuda_host_register:True"}


@needs_real
def test_real_library_cuarena_1_is_harmless_without_a_gpu(entry_point_dir):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this checks the machines without one")
    code = ("import torch, cuarena\nx = torch.arange(6.0).reshape(2, 3)\n"
            "print(float(x.sum()), cuarena.is_enabled(), torch.cuda.is_available())")
    env = clean_env(CUARENA_TORCH_LIB=REAL, TORCH_DEVICE_BACKEND_AUTOLOAD="1", CUARENA="1")
    env["PYTHONPATH"] = os.pathsep.join([str(entry_point_dir), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["15.0", "True", "False"], proc.stdout + proc.stderr
    assert "cuarena" not in proc.stderr, proc.stderr
