"""Memory history and snapshots under cuarena: torch.cuda.memory._record_memory_history /
_snapshot / _dump_snapshot, torch's own viewers (_memory_viz trace_plot, segment_plot), and
`cuarena replay` on the dumped pickle; cuarena.record(path) likewise."""

import gzip
import json
import pickle

import pytest

from gpu_harness import (PYTHON, SEGMENTS_TO_JSON, block_containing, require_gpu_torch,
                         run_command, run_scenario)

require_gpu_torch()

SCENARIO = SEGMENTS_TO_JSON + '''
MiB = 1 << 20
torch.cuda.memory._record_memory_history(max_entries=100000)
metadata = hasattr(torch.cuda.memory, "_set_memory_metadata")  # torch 2.10 and later
a = torch.empty(MiB, device="cuda")                   # 4 MiB of float32, freed before the snapshot
if metadata:
    torch.cuda.memory._set_memory_metadata("phase=forward")  # this thread's entries carry it
b = torch.empty(1000, device="cuda")                  # 4000 bytes, small
if metadata:
    read_back = torch.cuda.memory._get_memory_metadata()
    torch.cuda.memory._set_memory_metadata("")
c = torch.empty(25 * MiB, dtype=torch.uint8, device="cuda")
annotate = hasattr(torch.cuda.memory, "_annotate_tensor")  # torch 2.14 and later
if annotate:
    torch.cuda.memory._annotate_tensor(c[1:], "packed for backward")  # a view: its base counts
a.fill_(1.0); b.fill_(2.0); c.fill_(3)
a_ptr, a_n = a.data_ptr(), a.nbytes
del a
torch.cuda.synchronize()
reserved_peak = torch.cuda.memory_stats()["reserved_bytes.all.peak"]
s = torch.cuda.memory._snapshot()
torch.cuda.memory._dump_snapshot("history.pickle")
traces = []
for dev_trace in s["device_traces"][:1]:
    for e in dev_trace:
        traces.append({"action": e["action"], "addr": e.get("addr"), "size": e.get("size"),
                       "stream": e.get("stream"), "user_metadata": e.get("user_metadata")})
torch.cuda.memory._record_memory_history(enabled=None)
emit({
    "segments": segments_json(s["segments"]),
    "n_device_traces": len(s["device_traces"]),
    "traces": traces,
    "a": [a_ptr, a_n], "b": [b.data_ptr(), b.nbytes], "c": [c.data_ptr(), c.nbytes],
    "metadata": metadata, "read_back": read_back if metadata else None, "annotate": annotate,
    "reserved_peak": reserved_peak,
})
'''

RECORD_SCENARIO = '''
with cuarena.record("record.pickle"):
    x = torch.randn(1024, 1024, device="cuda")
    y = x @ x
    z = [torch.empty(n, device="cuda") for n in (100, 10000, 1000000)]
    del x, z
    torch.cuda.synchronize()
emit({"y_sum_finite": bool(torch.isfinite(y.sum()).item())})
'''


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    d = tmp_path_factory.mktemp("snapshot")
    r = run_scenario(SCENARIO, workdir=d)
    r["path"] = d / "history.pickle"
    return r


def test_segments_are_consistent(snap):
    segs = snap["segments"]
    assert segs, "the snapshot has no segments"
    for s in segs:
        assert s["blocks"], s
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"], s
        assert {b["state"] for b in s["blocks"]} <= {"active_allocated", "active_pending_free",
                                                     "inactive"}, s


def test_live_tensors_are_active_blocks(snap):
    for name in ("b", "c"):
        ptr, n = snap[name]
        blk = block_containing(snap["segments"], ptr)
        assert blk is not None, f"{name} at {ptr:#x} is in no snapshot block"
        assert blk["state"] == "active_allocated", (name, blk)
        assert ptr + n <= blk["address"] + blk["size"], (name, blk)


def test_history_has_alloc_and_free(snap):
    assert snap["n_device_traces"] >= 1
    tr = snap["traces"]
    a_ptr, a_n = snap["a"]
    allocs = [i for i, e in enumerate(tr) if e["action"] == "alloc" and e["addr"] == a_ptr]
    frees = [i for i, e in enumerate(tr) if e["action"] == "free_requested" and e["addr"] == a_ptr]
    assert allocs, f"no alloc entry at {a_ptr:#x}; actions: {sorted({e['action'] for e in tr})}"
    assert frees and frees[-1] > allocs[-1], "no free_requested after the alloc"
    for i in (allocs[-1], frees[-1]):
        size = tr[i]["size"]
        assert a_n <= size <= 1.25 * a_n + 512, tr[i]
    for name in ("b", "c"):
        ptr, n = snap[name]
        hits = [e for e in tr if e["action"] == "alloc" and e["addr"] == ptr]
        assert hits and n <= hits[-1]["size"] <= 1.25 * n + 512, (name, hits)


def test_user_metadata_is_stamped_on_the_threads_entries(snap):
    if not snap["metadata"]:
        pytest.skip("this torch has no torch.cuda.memory._set_memory_metadata (2.10 and later)")
    assert snap["read_back"] == "phase=forward"
    entry = {name: [e for e in snap["traces"] if e["action"] == "alloc"
                    and e["addr"] == snap[name][0]][-1] for name in ("a", "b", "c")}
    assert entry["b"]["user_metadata"] == "phase=forward", entry["b"]
    assert not entry["a"]["user_metadata"] and not entry["c"]["user_metadata"], entry


def test_annotation_is_an_entry_at_the_allocation(snap):
    if not snap["annotate"]:
        pytest.skip("this torch has no torch.cuda.memory._annotate_tensor (2.14 and later)")
    c_ptr, c_n = snap["c"]
    notes = [e for e in snap["traces"] if e["action"] == "annotate"]
    assert [(e["addr"], e["user_metadata"]) for e in notes] == [(c_ptr, "packed for backward")]
    assert c_n <= notes[0]["size"] <= 1.25 * c_n + 512, notes


def test_dump_is_a_snapshot_pickle(snap):
    with open(snap["path"], "rb") as f:
        data = pickle.load(f)
    assert data["segments"] and data["device_traces"]


@pytest.mark.parametrize("plot", ["trace_plot", "segment_plot"])
def test_memory_viz_reads_the_dump(snap, plot, tmp_path):
    out = tmp_path / f"{plot}.html"
    r = run_command([PYTHON, "-m", "torch.cuda._memory_viz", plot, snap["path"], "-o", out],
                    timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.stat().st_size > 1000


def test_cuarena_replay_reads_the_dump(snap, cuarena_cli):
    r = run_command([cuarena_cli, "replay", snap["path"]], timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])


def test_the_history_carries_cuarenas_reserved_memory(snap, cuarena_cli, tmp_path):
    # Segment map / unmap entries for the memory cuarena created and released: their running
    # sum is its reserved memory, so the replay's `recorded` row is cuarena itself.
    actions = [t["action"] for t in snap["traces"]]
    assert "segment_map" in actions, sorted(set(actions))
    out = tmp_path / "r.json"
    r = run_command([cuarena_cli, "replay", snap["path"], "--allocator", "recorded,cuarena",
                     "--json", out], timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    rows = {row["allocator"]: row for row in json.loads(out.read_text())["results"]}
    assert rows["recorded"]["peak_reserved_bytes"] == snap["reserved_peak"], rows["recorded"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    d = tmp_path_factory.mktemp("record")
    r = run_scenario(RECORD_SCENARIO, workdir=d)
    assert r["y_sum_finite"]
    return d / "record.pickle"


def test_cuarena_record_writes_a_snapshot(recorded):
    assert recorded.is_file() and recorded.stat().st_size > 0
    raw = recorded.read_bytes()
    data = pickle.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    actions = {e["action"] for t in data["device_traces"] for e in t}
    assert "alloc" in actions and "free_requested" in actions, actions


def test_cuarena_replay_reads_the_recording(recorded, cuarena_cli):
    r = run_command([cuarena_cli, "replay", recorded], timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
