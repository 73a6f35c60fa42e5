"""`python -m cuarena top` watching a real job on the GPU: a process under the PyTorch drop-in
publishes its page, and the monitor's numbers equal torch.cuda.memory_stats() while the job
holds still. The captured screen is written to $CUARENA_MONITOR_SCREEN when set (the README's
screenshot and the closing notes come from it)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_harness import PYTHON, require_gpu_torch, scenario_env, scenario_script

require_gpu_torch()

JOB = '''
MiB = 1 << 20
keep = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (3, 40, 100, 7)]
tmp = [torch.empty(n * MiB, dtype=torch.uint8, device="cuda") for n in (64, 16)]
del tmp  # some cached, reusable memory
torch.cuda.synchronize()
s = torch.cuda.memory_stats()
with open(_os.environ["JOB_STATS"], "w") as f:
    _json.dump({"pid": _os.getpid(), "reserved": s["reserved_bytes.all.current"],
                "allocated": s["allocated_bytes.all.current"],
                "requested": s["requested_bytes.all.current"]}, f)
import time
deadline = time.time() + 120
while not _os.path.exists(_os.environ["JOB_DONE"]) and time.time() < deadline:
    time.sleep(0.1)
'''


def top(*args, env):
    return subprocess.run([PYTHON, "-m", "cuarena", "top", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_top_lists_a_running_job_with_its_memory_stats(tmp_path):
    stats, done = tmp_path / "stats.json", tmp_path / "done"
    script = tmp_path / "job.py"
    script.write_text(scenario_script(JOB))
    env = scenario_env({"JOB_STATS": stats, "JOB_DONE": done})
    job = subprocess.Popen([PYTHON, str(script)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not stats.exists() and job.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert stats.exists(), job.communicate(timeout=30)[0][-3000:]
        want = json.loads(stats.read_text())
        time.sleep(1.0)  # one refresh of the page (a few a second)
        r = top("--once", "--json", env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        rows = doc["processes"] if isinstance(doc, dict) else doc
        mine = [p for p in rows if p.get("pid") == want["pid"]]
        assert mine, (want["pid"], r.stdout[-3000:])
        row = mine[0]
        assert row["kind"] in ("torch", 1), row
        assert row["reserved_bytes"] == want["reserved"], (row, want)
        assert row["allocated_bytes"] == want["allocated"], (row, want)
        assert row["requested_bytes"] == want["requested"], (row, want)
        screen = top("--once", env=env)
        assert screen.returncode == 0, screen.stderr
        assert str(want["pid"]) in screen.stdout, screen.stdout
        if os.environ.get("CUARENA_MONITOR_SCREEN"):
            Path(os.environ["CUARENA_MONITOR_SCREEN"]).write_text(screen.stdout)
    finally:
        done.touch()
        try:
            job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
    # The page goes with its process.
    r = top("--once", "--json", env=env)
    doc = json.loads(r.stdout)
    rows = doc["processes"] if isinstance(doc, dict) else doc
    assert not [p for p in rows if p.get("pid") == want["pid"]], r.stdout[-2000:]
