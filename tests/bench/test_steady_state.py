"""cuarena_steady_state (bench/steady_state.cpp): the training loop it builds from a trace.

Run by CTest with the binary's path in CUARENA_STEADY_STATE. It asserts what the tool must get
right whatever the policy does: every later pass returns the allocator to the same allocated
state (the loop frees exactly what it allocates), the first pass holds everything the trace
never frees, placement is compared only between passes, and bad input is one clear message and
a non-zero exit.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("CUARENA_STEADY_STATE", str(ROOT / "build" / "bin" / "cuarena_steady_state"))
TRACE = ROOT / "tests" / "data" / "traces" / "resnet50_amp.pickle.gz"


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_every_pass_ends_where_the_first_did(tmp_path):
    out = tmp_path / "s.json"
    p = run(TRACE, "--passes", 5, "--json", out)
    assert p.returncode == 0, p.stderr
    [doc] = json.loads(out.read_text())
    rows = doc["passes"]
    assert [r["pass"] for r in rows] == [1, 2, 3, 4, 5]
    ends = {r["allocated_end_bytes"] for r in rows}
    assert len(ends) == 1, f"the loop leaks or over-frees: allocated at pass ends {ends}"
    assert rows[0]["allocated_end_bytes"] >= doc["long_lived_requested_bytes"]
    for r in rows:
        assert r["reserved_peak_bytes"] >= r["reserved_end_bytes"] >= r["allocated_end_bytes"]
        # Where the memory is: every reserved byte in exactly one place (a retired alias's
        # granule is also active where it was re-used, so it is not added).
        held = (r["end_in_use_bytes"] + r["end_owned_cached_bytes"] +
                r["end_shared_cached_bytes"] + r["end_idle_bytes"])
        assert held == r["reserved_end_bytes"], r
    assert rows[0]["device_allocs"] > 0, "the first pass must create the pool"
    # Placement repeats only from one pass to the next: nothing to compare in the first.
    assert rows[0]["same_address_allocations"] == 0
    assert len({r["allocations"] for r in rows[1:]}) == 1
    for r in rows[1:]:
        assert 0 <= r["same_address_allocations"] <= r["allocations"]


def test_memory_first_config_is_applied(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run(TRACE, "--passes", 2, "--json", a).returncode == 0
    assert run(TRACE, "--passes", 2, "--config", "whole_chunk_min:0", "--json", b).returncode == 0
    da, db = json.loads(a.read_text())[0], json.loads(b.read_text())[0]
    assert db["config"] == "whole_chunk_min:0"
    assert da["passes"] != db["passes"], "a different policy must give different figures"


@pytest.mark.parametrize("args,needle", [
    (["/nonexistent/t.pickle"], "/nonexistent/t.pickle"),
    ([TRACE, "--config", "no_such_key:1"], "no_such_key"),
    ([TRACE, "--passes", "1"], "--passes"),
])
def test_bad_input_is_named(args, needle):
    p = run(*args)
    assert p.returncode != 0
    assert needle in (p.stderr + p.stdout)
