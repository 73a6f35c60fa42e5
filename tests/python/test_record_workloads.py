"""tools/trace/record_workloads.py: what it does without a GPU (its recordings run on one)."""
import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "trace" / "record_workloads.py"
MORE = ROOT / "tests" / "data" / "traces" / "more"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_unknown_workload_is_named_with_the_known_ones(tmp_path):
    p = run("--out", str(tmp_path), "--workloads", "llm_generate,bogus")
    assert p.returncode == 2
    assert "bogus" in p.stderr and "compile_train" in p.stderr
    assert not any(tmp_path.iterdir()), "nothing is written for a bad request"


def test_out_is_required():
    p = run()
    assert p.returncode == 2 and "--out" in p.stderr


def test_the_bundled_recordings_match_their_workloads():
    reserved = json.loads((MORE / "reserved.json").read_text())
    for name, modes in reserved.items():
        snap = pickle.load(gzip.open(MORE / f"{name}.pickle.gz"))
        events = snap["device_traces"][0]
        # The native run recorded the trace: its segment events rebuild the reserved peak exactly.
        held = peak = 0
        for e in events:
            if e["action"] == "segment_alloc":
                held += e["size"]
                peak = max(peak, held)
            elif e["action"] == "segment_free":
                held -= e["size"]
        assert peak == modes["native"], name
        assert isinstance(modes["expandable"], int), name
