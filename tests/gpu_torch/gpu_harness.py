"""Shared helpers of the GPU PyTorch suite (tests/gpu_torch).

cuarena has to be installed as PyTorch's CUDA allocator before CUDA initialises, and several
features (CUDA graphs, MemPool, OOM state, the pluggable allocator) leave a process in a state the
next scenario must not inherit. So the pytest process itself never touches CUDA: every scenario
runs in a fresh Python subprocess (`run_scenario`), which enables cuarena first, runs the
scenario's code, and hands its observations back as one JSON object (`emit(obj)` in the
scenario); the tests assert on that object.

Where things are found (all overridable through the environment):
  CUARENA_TORCH_LIB  libcuarena_torch.so (default: build-gpu/lib, build/lib, build-torch/lib)
  CUARENA_CLI        the `cuarena` executable (default: build-gpu/bin, build/bin)
  the package        allocator/torch/python/cuarena (put on PYTHONPATH), or a pip-installed one
A module whose prerequisites are missing (torch, a CUDA device, the library or the package)
skips with the reason; with CUARENA_GPU_TORCH_REQUIRED=1 (tools/gpu-test.sh sets it) it fails
instead, so a broken build cannot pass as "all skipped".
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO_ROOT / "allocator" / "torch" / "python"
RESULT_MARK = "@@CUARENA_SCENARIO_RESULT@@"
PYTHON = sys.executable

_LIB_CANDIDATES = ("build-gpu/lib", "build/lib", "build-torch/lib")
_CLI_CANDIDATES = ("build-gpu/bin", "build/bin")


class ScenarioError(AssertionError):
    """A scenario subprocess failed, timed out or emitted no result."""


def find_lib() -> tuple[Path | None, str]:
    """(path to libcuarena_torch.so or None, how it was found or why not)."""
    env = os.environ.get("CUARENA_TORCH_LIB")
    if env:
        p = Path(env)
        if p.is_file():
            return p.resolve(), "CUARENA_TORCH_LIB"
        return None, f"CUARENA_TORCH_LIB={env} does not exist"
    for d in _LIB_CANDIDATES:
        p = REPO_ROOT / d / "libcuarena_torch.so"
        if p.is_file():
            return p, d
    return None, ("libcuarena_torch.so not found: set CUARENA_TORCH_LIB or build with "
                  "-DCUARENA_WITH_TORCH=ON into " + " or ".join(_LIB_CANDIDATES))


def find_cli() -> Path | None:
    env = os.environ.get("CUARENA_CLI")
    if env:
        return Path(env) if Path(env).is_file() else None
    for d in _CLI_CANDIDATES:
        p = REPO_ROOT / d / "cuarena"
        if p.is_file():
            return p
    return None


def source_package_present() -> bool:
    return (PACKAGE_DIR / "cuarena" / "__init__.py").is_file()


def installed_distribution() -> str | None:
    """The version of a pip-installed `cuarena` distribution, or None."""
    try:
        return importlib.metadata.version("cuarena")
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_backend_entry_points() -> list[str]:
    """The `torch.backends` entry points that name cuarena (present once pip-installed)."""
    try:
        eps = importlib.metadata.entry_points(group="torch.backends")
    except Exception:  # noqa: BLE001 - a broken metadata dir must not break collection
        return []
    return [f"{ep.name} = {ep.value}" for ep in eps
            if "cuarena" in ep.name.lower() or "cuarena" in ep.value.lower()]


def scenario_env(extra: dict | None = None) -> dict:
    """The environment a scenario runs in: the suite's own variables, none of the user's
    allocator switches (CUARENA, CUARENA_TRACE, PYTORCH_*ALLOC_CONF) unless `extra` sets them;
    CUARENA_CONF is kept (run the suite under a cuarena configuration with it). A value of None
    in `extra` removes the variable."""
    env = dict(os.environ)
    for k in ("CUARENA", "CUARENA_TRACE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    lib, _ = find_lib()
    cli = find_cli()
    if cli is not None:
        env["CUARENA_CLI"] = str(cli)
    if lib is not None and source_package_present():
        # Source-tree mode: this library and the package's sources (ahead of any installed
        # copy). Without a library here, the pip-installed package runs with its own.
        env["CUARENA_TORCH_LIB"] = str(lib)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(PACKAGE_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    elif lib is not None:
        env["CUARENA_TORCH_LIB"] = str(lib)
    env["PYTHONUNBUFFERED"] = "1"
    env["CUARENA_REPO_ROOT"] = str(REPO_ROOT)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


@functools.lru_cache(maxsize=None)
def probe() -> dict:
    """What the Python running pytest offers, found in a subprocess (CUDA is not initialised
    there either: is_available and device_count leave it uninitialised)."""
    code = ("import json, torch; print(json.dumps({'torch': torch.__version__, "
            "'cuda': torch.cuda.is_available(), 'devices': torch.cuda.device_count()}))")
    try:
        r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                           env=scenario_env())
    except subprocess.TimeoutExpired:
        return {"error": "`import torch` took over 300 s"}
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"torch is not importable by {PYTHON}: {tail}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def skip_reason() -> str | None:
    """Why the GPU torch suite cannot run here, or None."""
    info = probe()
    if "error" in info:
        return info["error"]
    if not info["cuda"]:
        return f"torch {info['torch']}: torch.cuda.is_available() is False (no CUDA device)"
    lib, how = find_lib()
    if lib is None and installed_distribution() is None:
        return how
    if not source_package_present() and installed_distribution() is None:
        return (f"the Python package cuarena is neither at {PACKAGE_DIR}/cuarena nor "
                "pip-installed")
    return None


def require_gpu_torch() -> None:
    """Module-level guard: skip the module (or fail, under CUARENA_GPU_TORCH_REQUIRED=1)."""
    reason = skip_reason()
    if reason is None:
        return
    if os.environ.get("CUARENA_GPU_TORCH_REQUIRED") == "1":
        pytest.fail(f"GPU torch suite required but cannot run: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


_PRELUDE = '''\
import json as _json, os as _os, sys as _sys


def emit(obj):
    """Hands the scenario's result to the test (the last emitted object wins)."""
    _sys.stdout.write("\\n" + {mark!r} + _json.dumps(obj, default=repr) + "\\n")
    _sys.stdout.flush()


import torch
'''

_ENABLE = '''\
import cuarena
cuarena.enable(_os.environ.get("CUARENA_SCENARIO_CONFIG") or None)
'''


def scenario_script(code: str, enable: bool = True) -> str:
    """The full script of a scenario: the prelude (emit, import torch, and, with `enable`,
    `import cuarena; cuarena.enable()` before anything touches CUDA), then `code`. The prelude
    runs at import, so a spawned multiprocessing child enables cuarena too; the scenario
    guards its main part with `if __name__ == "__main__":` where it spawns."""
    return (_PRELUDE.format(mark=RESULT_MARK) + (_ENABLE if enable else "") + "\n"
            + textwrap.dedent(code))


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_scenario(code: str, env: dict | None = None, timeout: float = 300, *,
                 enable: bool = True, workdir: Path | str | None = None,
                 args: list[str] | None = None, expect_rc: int | None = 0) -> dict:
    """Runs `code` as a script in a fresh Python process and returns the JSON object it
    emitted last. `env` adds to (None: removes from) scenario_env(); the script runs in
    `workdir` (a fresh temporary directory by default), where it is written as scenario.py.
    Raises ScenarioError, with the output's tail, on a non-zero exit (unless `expect_rc` is
    None), a timeout, or no result."""
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="cuarena-scenario-")
        workdir = tmp.name
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "scenario.py"
    script.write_text(scenario_script(code, enable))
    cmd = [PYTHON, str(script)] + list(args or [])
    try:
        proc = subprocess.Popen(cmd, cwd=workdir, env=scenario_env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The scenario's process group: the script and any workers or children it started.
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise ScenarioError(f"scenario timed out after {timeout} s\n--- stdout:\n"
                                f"{_tail(out)}\n--- stderr:\n{_tail(err)}") from None
    finally:
        if tmp is not None:
            tmp.cleanup()
    result = None
    for line in out.splitlines():
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK):])
    if expect_rc is not None and proc.returncode != expect_rc:
        raise ScenarioError(f"scenario exited with {proc.returncode} (expected {expect_rc})\n"
                            f"--- stdout:\n{_tail(out)}\n--- stderr:\n{_tail(err)}")
    if result is None:
        raise ScenarioError(f"scenario emitted no result (exit {proc.returncode})\n"
                            f"--- stdout:\n{_tail(out)}\n--- stderr:\n{_tail(err)}")
    result.setdefault("_stderr_tail", _tail(err, 15))
    return result


def run_command(cmd: list[str], timeout: float = 300, env: dict | None = None,
                cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """Runs a helper command (no scenario prelude) in scenario_env(env); returns the result."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=scenario_env(env), cwd=cwd)


def ranges_containing(segments: list[dict], ptr: int) -> list[dict]:
    """The segments of a snapshot (as emitted by scenarios: address, total_size) holding ptr."""
    return [s for s in segments if s["address"] <= ptr < s["address"] + s["total_size"]]


def block_containing(segments: list[dict], ptr: int) -> dict | None:
    """The block (address, size, state) of a snapshot's segments that holds ptr, or None."""
    for s in segments:
        for b in s.get("blocks", []):
            if b["address"] <= ptr < b["address"] + b["size"]:
                return b
    return None


# Snippet the scenarios paste in to turn a snapshot's segments into plain JSON.
SEGMENTS_TO_JSON = '''
def segments_json(segments):
    out = []
    for s in segments:
        addr = s["address"]
        blocks = []
        for b in s.get("blocks", []):
            blocks.append({"address": b.get("address", addr), "size": b["size"],
                           "requested_size": b.get("requested_size"), "state": b["state"]})
            addr += b["size"]
        pid = s.get("segment_pool_id")
        out.append({"address": s["address"], "total_size": s["total_size"],
                    "allocated_size": s.get("allocated_size"), "stream": s.get("stream"),
                    "segment_type": s.get("segment_type"),
                    "segment_pool_id": list(pid) if pid is not None else None,
                    "is_expandable": s.get("is_expandable"), "blocks": blocks})
    return out
'''
