"""tools/speed_summary.py: medians of cuarena / torch-native ratios over runs, and the targets."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "speed_summary.py"


def row(trace, allocator, a50, a99, f50, f99, elapsed):
    return {"trace": trace, "allocator": allocator, "backend": "cuda", "elapsed_s": elapsed,
            "alloc_us": {"p50": a50, "p99": a99, "max": a99},
            "free_us": {"p50": f50, "p99": f99, "max": f99}}


def write_run(tmp_path, name, cuarena_elapsed):
    rows = [row("t", "torch-native", 0.4, 10.0, 0.4, 1.0, 1.0),
            row("t", "cuarena", 0.1, 5.0, 0.2, 2.0, cuarena_elapsed),
            # Rows the summary must ignore: the simulator and other allocators.
            dict(row("t", "cuarena", 9, 9, 9, 9, 9), backend="sim"),
            row("t", "cub", 9, 9, 9, 9, 9)]
    path = tmp_path / name
    path.write_text(json.dumps({"results": rows}))
    return path


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True)


def test_medians_and_targets(tmp_path):
    runs = [write_run(tmp_path, f"r{i}.json", e) for i, e in enumerate([0.5, 1.5, 0.9])]
    out = tmp_path / "summary.json"
    res = run(*runs, "--json", out)
    assert res.returncode == 0, res.stderr
    t = json.loads(out.read_text())["traces"]["t"]
    assert math.isclose(t["p50_alloc_free"]["median"], 0.375) and t["p50_alloc_free"]["met"]
    assert math.isclose(t["alloc_p99"]["median"], 0.5) and t["alloc_p99"]["met"]
    assert math.isclose(t["free_p99"]["median"], 2.0) and not t["free_p99"]["met"]
    assert t["replay"]["runs"] == [0.5, 1.5, 0.9]
    assert t["replay"]["median"] == 0.9 and t["replay"]["met"]
    assert "replay: target met on 1 of 1" in res.stdout


@pytest.mark.parametrize("content, message", [
    (json.dumps({"results": [row("t", "cuarena", 1, 1, 1, 1, 1)]}),
     "lacks cuarena or torch-native for t"),
    ("{not json", "bad.json is not JSON"),
    ("{}", "bad.json has no 'results' list"),
])
def test_bad_input_is_named(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    res = run(path)
    assert res.returncode != 0
    assert message in res.stderr
