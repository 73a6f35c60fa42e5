"""Runs one command in a fresh process and measures it from outside: wall time, and the peak
device memory it used, read with NVML (nvmlDeviceGetMemoryInfo(handle).used, what nvidia-smi
shows) by a sampling thread every few milliseconds, minus the used memory just before the start.

Measured from outside because under the LD_PRELOAD shim the job's own figures mean little:
PyTorch runs uncached (torch.cuda.max_memory_reserved() is 0) and cuMemGetInfo counts cuarena's
cached-but-unused memory as free. NVML counts every process on the GPU: run on an idle one.

Used by bench/shim/compare.py and tests/shim/jobs/test_jobs.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

MiB = 1 << 20
SUMMARY_RE = re.compile(r"^cuarena: summary: (.*)$", re.M)


class Nvml:
    """One GPU seen through pynvml (package nvidia-ml-py)."""

    def __init__(self, index: int | None = None):
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        if index is None:
            index = self.default_index()
        if isinstance(index, str):
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(index)
        else:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.index = index

    @staticmethod
    def default_index() -> int | str:
        """The first device CUDA_VISIBLE_DEVICES names (an index or a GPU- UUID), else 0."""
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if first.isdigit():
            return int(first)
        return first if first.startswith("GPU-") else 0

    def used(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.handle).used)

    def info(self) -> dict:
        def text(v):
            return v.decode() if isinstance(v, bytes) else v
        return {"gpu": text(self.nv.nvmlDeviceGetName(self.handle)),
                "driver": text(self.nv.nvmlSystemGetDriverVersion()),
                "total_bytes": int(self.nv.nvmlDeviceGetMemoryInfo(self.handle).total),
                "nvml_index": self.index}


class PeakSampler:
    """A thread that reads used() every interval_s and keeps the largest value."""

    def __init__(self, used, interval_s: float = 0.005):
        self.used, self.interval_s = used, interval_s
        self.peak, self.samples, self.max_gap_s, self.gaps_over_20ms = 0, 0, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        last = time.perf_counter()
        while True:
            self.peak = max(self.peak, self.used())
            self.samples += 1
            now = time.perf_counter()
            self.max_gap_s = max(self.max_gap_s, now - last)
            self.gaps_over_20ms += now - last > 0.02
            last = now
            if self._stop.wait(self.interval_s):
                break

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.used())  # one last read after the job's exit


def wait_idle(used, idle_bytes: int, tolerance: int = 16 * MiB, timeout_s: float = 20.0) -> int:
    """Waits until used() is back within tolerance of idle_bytes (the memory of a process that
    just exited can take a moment to return), then returns the baseline: the smallest of a few
    reads over 50 ms."""
    deadline = time.monotonic() + timeout_s
    while used() > idle_bytes + tolerance and time.monotonic() < deadline:
        time.sleep(0.05)
    reads = []
    for _ in range(6):
        reads.append(used())
        time.sleep(0.01)
    return min(reads)


def parse_summary(text: str) -> dict | None:
    """The last `cuarena: summary: key=value ...` line of a log, values as int/float/str."""
    found = SUMMARY_RE.findall(text)
    if not found:
        return None
    out = {}
    for field in found[-1].split():
        key, _, value = field.partition("=")
        for conv in (int, float):
            try:
                value = conv(value)
                break
            except ValueError:
                pass
        out[key] = value
    return out


def run_measured(cmd: list[str], env: dict, log_path: Path, nvml: Nvml | None,
                 idle_bytes: int | None = None, cwd: str | None = None,
                 timeout_s: float = 900, interval_s: float = 0.005) -> dict:
    """Runs cmd (stdout and stderr into log_path) and returns rc, wall_s, the NVML figures
    (baseline_bytes, peak_used_bytes, peak_bytes = peak - baseline, samples, max_gap_s,
    gaps_over_20ms), the parsed cuarena summary line, and the log's last lines."""
    res: dict = {"command": cmd}
    if nvml is not None:
        res["baseline_bytes"] = wait_idle(nvml.used, idle_bytes if idle_bytes is not None
                                          else nvml.used())
    sampler = PeakSampler(nvml.used, interval_s) if nvml is not None else None
    log_path = Path(log_path)
    with open(log_path, "w") as log:
        if sampler:
            sampler.start()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
            res["rc"] = proc.returncode
        except subprocess.TimeoutExpired:
            res["rc"] = "timeout"
        finally:
            res["wall_s"] = time.perf_counter() - t0
            if sampler:
                sampler.stop()
    if sampler:
        res.update(peak_used_bytes=sampler.peak, samples=sampler.samples,
                   max_gap_s=sampler.max_gap_s, gaps_over_20ms=sampler.gaps_over_20ms,
                   peak_bytes=sampler.peak - res["baseline_bytes"])
    text = log_path.read_text(errors="replace")
    res["summary"] = parse_summary(text)
    res["log_tail"] = text.splitlines()[-20:]
    return res


def canonical(value):
    """Results in a form that compares bitwise: floats as their hex, recursively."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def max_rel_diff(a, b) -> float | None:
    """The largest relative difference between the float lists found under the same keys of two
    results (None when nothing is comparable)."""
    worst = None
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() & b.keys():
            d = max_rel_diff(a[k], b[k])
            if d is not None:
                worst = d if worst is None else max(worst, d)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a and all(
            isinstance(x, (int, float)) for x in a + b):
        worst = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))
    return worst
