"""End-to-end tests of `cuarena replay` / `cuarena convert`: real traces, JSON output, the
capacity search, and bad input (one clear stderr line, non-zero exit, never a crash)."""

import gzip
import functools
import json
import os
import pickle
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "tests" / "data" / "traces"
NATIVE_RESERVED = {  # shared/traces/README.md: reserved_bytes.all.peak under PyTorch native
    "gpt2_train": 15286140928,
    "resnet50_amp": 7295991808,
    "bert_varlen_infer": 1497366528,
    "vit_multistream": 8577351680,
    "moe_train": 12396265472,
}
MiB = 1 << 20


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test converts into a cache of its own (not ~/.cache), so none sees another's."""
    monkeypatch.setenv("CUARENA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def cli():
    path = os.environ.get("CUARENA_CLI") or str(REPO / "build" / "bin" / "cuarena")
    if not Path(path).exists():
        pytest.fail(f"cuarena binary not found at {path}: build first (see README)")
    return path


def run(*args, check=False):
    proc = subprocess.run([cli(), *map(str, args)], capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def replay_json(tmp_path, *args):
    out = tmp_path / "out.json"
    run("replay", *args, "--json", out, check=True)
    return json.loads(out.read_text())["results"]


def snapshot(tmp_path, device_traces, name="snap.pickle"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": device_traces}))
    return path


def ev(action, addr, size, stream=0, t=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t}


# tests/data/traces/jobs/README.md: the benchmark's whole jobs, memory_stats() of the recording
JOBS = {  # trace: (peak requested, native reserved_bytes.all.peak)
    "gpt2": (8459822804, 9573498880),
    "gpt2_varlen": (13651892564, 15552479232),
    "resnet50": (3192592928, 3655335936),
}


def test_whole_jobs_replay_to_what_the_recording_run_measured(tmp_path):
    results = replay_json(tmp_path, *sorted((TRACES / "jobs").glob("*.pickle.gz")),
                          "--allocator", "recorded,cuarena")
    by = {(r["trace"], r["allocator"]): r for r in results}
    assert {t for t, _ in by} == set(JOBS)
    for name, (requested, native) in JOBS.items():
        rec, cua = by[(name, "recorded")], by[(name, "cuarena")]
        assert rec["peak_requested_bytes"] == requested
        assert rec["peak_reserved_bytes"] == native
        assert cua["ooms"] == 0 and cua["reserved_ratio"] < rec["reserved_ratio"]


def test_replay_all_shared_traces_matches_native_and_beats_it(tmp_path):
    files = sorted(TRACES.glob("*.pickle.gz"))
    results = replay_json(tmp_path, *files)
    by = {(r["trace"], r["allocator"]): r for r in results}
    assert len(results) == 2 * len(NATIVE_RESERVED)
    required = {"trace", "allocator", "backend", "peak_requested_bytes", "peak_reserved_bytes",
                "reserved_ratio", "external_fragmentation", "ooms", "allocs", "frees",
                "skipped_events", "elapsed_s"}
    for name, native in NATIVE_RESERVED.items():
        rec, cua = by[(name, "recorded")], by[(name, "cuarena")]
        assert required <= rec.keys() and required <= cua.keys()
        assert rec["peak_reserved_bytes"] == native
        assert cua["ooms"] == 0
        assert cua["backend"] == "sim"
        assert cua["peak_requested_bytes"] == rec["peak_requested_bytes"]
        assert cua["reserved_ratio"] < rec["reserved_ratio"]
        assert 0.0 <= cua["external_fragmentation"] <= 1.0


def test_table_is_printed(tmp_path):
    proc = run("replay", TRACES / "resnet50_amp.pickle.gz", check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["trace", "allocator", "backend"]
    assert any("recorded" in l and "resnet50_amp" in l for l in lines)
    assert any("cuarena" in l and "resnet50_amp" in l for l in lines)


def test_replay_is_deterministic(tmp_path):
    a = replay_json(tmp_path, TRACES / "bert_varlen_infer.pickle.gz", "--allocator", "cuarena")
    b = replay_json(tmp_path, TRACES / "bert_varlen_infer.pickle.gz", "--allocator", "cuarena")
    strip = lambda rs: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rs]
    assert strip(a) == strip(b)


def test_min_capacity_is_the_boundary(tmp_path):
    trace = TRACES / "bert_varlen_infer.pickle.gz"
    [r] = replay_json(tmp_path, trace, "--allocator", "cuarena", "--min-capacity")
    cap = r["min_capacity_bytes"]
    assert r["peak_requested_bytes"] <= cap <= r["peak_reserved_bytes"] + 2 * MiB
    assert cap % (2 * MiB) == 0
    [at] = replay_json(tmp_path, trace, "--allocator", "cuarena", "--capacity", cap)
    assert at["ooms"] == 0
    [below] = replay_json(tmp_path, trace, "--allocator", "cuarena", "--capacity", cap - 2 * MiB)
    assert below["ooms"] > 0
    # The answer was checked above: 2 MiB steps to +16 MiB, +1% and +5%, all fitting here.
    probes = [p["capacity_bytes"] for p in r["min_capacity_probes"]]
    assert probes[:8] == [cap + k * 2 * MiB for k in range(1, 9)] and max(probes) > cap * 1.04
    assert all(p["ooms"] == 0 for p in r["min_capacity_probes"])
    assert r["min_capacity_search_bytes"] == cap


def test_capacity_below_the_need_reports_ooms_not_a_crash(tmp_path):
    [r] = replay_json(tmp_path, TRACES / "resnet50_amp.pickle.gz", "--allocator", "cuarena",
                      "--capacity", "4GiB")
    assert r["ooms"] > 0
    assert r["peak_reserved_bytes"] <= 4 << 30


def test_edge_traces_replay(tmp_path):
    results = replay_json(tmp_path, *sorted((TRACES / "edge").glob("*.pickle")))
    recorded = {r["trace"]: r for r in results if r["allocator"] == "recorded"}
    assert recorded["record_stream_oom_empty_cache"]["ooms"] == 1  # the deliberate OOM
    assert all(r["ooms"] == 0 for r in results if r["allocator"] == "cuarena")


def test_ring_buffer_frees_of_unseen_blocks_are_skipped(tmp_path):
    path = snapshot(tmp_path, [[
        ev("free_requested", 0x1000, 512), ev("free_completed", 0x1000, 512),  # never allocated
        ev("segment_alloc", 0x10000, 20 * MiB),
        ev("alloc", 0x10000, 4 * MiB), ev("free_completed", 0x10000, 4 * MiB),
        ev("mystery_action", 0, 0),
    ]])
    results = replay_json(tmp_path, path)
    for r in results:
        assert r["skipped_events"] == 2
        assert r["allocs"] == 1 and r["frees"] == 1
        assert r["peak_requested_bytes"] == 4 * MiB
    assert results[0]["peak_reserved_bytes"] == 20 * MiB


def test_two_devices_replay_separately(tmp_path):
    path = snapshot(tmp_path, [
        [ev("segment_alloc", 0x10000, 2 * MiB), ev("alloc", 0x10000, 1 * MiB)],
        [ev("segment_alloc", 0x90000, 20 * MiB), ev("alloc", 0x90000, 12 * MiB)],
    ])
    results = replay_json(tmp_path, path, "--allocator", "recorded")
    assert [(r["trace"], r["peak_reserved_bytes"]) for r in results] == [
        ("snap:cuda0", 2 * MiB), ("snap:cuda1", 20 * MiB)]


def test_rmm_csv_replays(tmp_path):
    csv = tmp_path / "rmm.csv"
    csv.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,10:00:00.000001,allocate,0x7f0000000000,8388608,0x0\n"
                   "1,10:00:00.000002,allocate,0x7f0000800000,1024,0x0\n"
                   "1,10:00:00.000003,free,0x7f0000000000,8388608,0x0\n")
    [r] = replay_json(tmp_path, csv, "--allocator", "cuarena")
    assert r["allocs"] == 2 and r["frees"] == 1 and r["ooms"] == 0
    assert r["peak_requested_bytes"] == 8 * MiB + 1024
    # No segment events: no meaningless 'recorded' row, and a note saying why.
    proc = run("replay", csv, check=True)
    assert "no 'recorded' row" in proc.stderr
    assert "recorded" not in proc.stdout.split("\n", 2)[2]


def test_convert_then_replay_cuat_gives_the_same_numbers(tmp_path):
    src = TRACES / "resnet50_amp.pickle.gz"
    cuat = tmp_path / "resnet50_amp.cuat"
    run("convert", src, cuat, check=True)
    assert cuat.read_bytes()[:8] == b"CUATRACE"
    a = replay_json(tmp_path, src)
    b = replay_json(tmp_path, cuat)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rs]
    assert strip(a) == strip(b)


def record(action=0, pad8=0, device=0, pad32=0, stream=0, addr=0x1000, size=512, time_us=0):
    """One .cuat event record (trace/FORMAT.md), fields as given."""
    import struct
    return struct.pack("<BBHIQQQq", action, pad8, device, pad32, stream, addr, size, time_us)


def cuat_file(tmp_path, records, name=None):
    path = tmp_path / (name or f"case{len(list(tmp_path.glob('case*.cuat')))}.cuat")
    path.write_bytes(b"CUATRACE" + (1).to_bytes(4, "little") + (40).to_bytes(4, "little")
                     + len(records).to_bytes(8, "little") + bytes(8) + b"".join(records))
    return path


def test_cpp_and_python_readers_agree_on_validity(tmp_path):
    """The replayer (C++) and the converter (Python) refuse the same malformed records."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "trace"))
    import cuarena_trace
    for recs in ([record(action=9)], [record(pad32=7)], [record(device=2), record(device=1)]):
        path = cuat_file(tmp_path, recs)
        with pytest.raises(cuarena_trace.TraceError):
            cuarena_trace.read_cuat(path.read_bytes())
        assert run("replay", path).returncode == 2
    good = cuat_file(tmp_path, [record(), record(action=2)])
    cuarena_trace.read_cuat(good.read_bytes())
    assert run("replay", good).returncode == 0


def test_convert_to_a_full_device_fails_and_leaves_nothing(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    proc = run("convert", TRACES / "resnet50_amp.pickle.gz", "/dev/full")
    assert proc.returncode != 0, proc.stderr
    assert "/dev/full" in proc.stderr and "failed" in proc.stderr, proc.stderr
    out = tmp_path / "sub" / "out.cuat"  # its directory does not exist: cannot be written
    proc = run("convert", TRACES / "resnet50_amp.pickle.gz", out)
    assert proc.returncode != 0 and not out.exists()
    assert not list(tmp_path.rglob("*.partial"))


def test_json_is_not_created_when_the_trace_fails(tmp_path):
    out = tmp_path / "results.json"
    proc = run("replay", tmp_path / "missing.pickle.gz", "--json", out)
    assert proc.returncode == 2
    assert not out.exists()


def bad_inputs(tmp_path):
    gz = (TRACES / "resnet50_amp.pickle.gz").read_bytes()
    truncated = tmp_path / "truncated.pickle.gz"
    truncated.write_bytes(gz[: len(gz) // 2])
    text = tmp_path / "notes.txt"
    text.write_text("hello, I am not a trace\n")
    a_list = tmp_path / "list.pickle"
    a_list.write_bytes(pickle.dumps([1, 2, 3]))
    negative = snapshot(tmp_path, [[ev("alloc", 0x1000, -5)]], "negative.pickle")
    cuat = tmp_path / "short.cuat"
    cuat.write_bytes(b"CUATRACE" + (1).to_bytes(4, "little") + (40).to_bytes(4, "little")
                     + (3).to_bytes(8, "little") + bytes(8) + bytes(50))
    missing = tmp_path / "missing.pickle.gz"
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)  # no writer: reading it would block forever
    return {
        "unknown_action_code": ([cuat_file(tmp_path, [record(action=9)])], "unknown action code 9"),
        "nonzero_padding": ([cuat_file(tmp_path, [record(pad8=1)])], "padding"),
        "devices_out_of_order": ([cuat_file(tmp_path, [record(device=1), record(device=0)])],
                                 "device 0 after device 1"),
        "size_beyond_any_device": ([cuat_file(tmp_path, [record(size=1 << 50)])],
                                   "implausible size"),
        "fifo": ([fifo], "not a regular file"),
        "json_is_a_directory": ([TRACES / "resnet50_amp.pickle.gz", "--json", tmp_path],
                                "is a directory"),
        "missing": ([missing], str(missing)),
        "truncated_gzip": ([truncated], str(truncated)),
        "not_a_snapshot": ([text], str(text)),
        "pickle_not_a_dict": ([a_list], str(a_list)),
        "negative_size": ([negative], str(negative)),
        "truncated_cuat": ([cuat], str(cuat)),
        "directory": ([tmp_path], str(tmp_path)),
        "unknown_option": ([TRACES / "resnet50_amp.pickle.gz", "--frobnicate"], "--frobnicate"),
        "bad_capacity": ([TRACES / "resnet50_amp.pickle.gz", "--capacity", "12XB"], "--capacity"),
        "negative_capacity": ([TRACES / "resnet50_amp.pickle.gz", "--capacity", "-1GiB"], "--capacity"),
        "ambiguous_capacity_unit": ([TRACES / "resnet50_amp.pickle.gz", "--capacity", "80G"], "--capacity"),
        "huge_capacity": ([TRACES / "resnet50_amp.pickle.gz", "--capacity", "29TiB"], "--capacity"),
        "bad_config_key": ([TRACES / "resnet50_amp.pickle.gz", "--config", "colour:blue"], "colour"),
        "bad_config_value": ([TRACES / "resnet50_amp.pickle.gz", "--config", "small_limit:lots"],
                             "small_limit"),
        "bad_backend": ([TRACES / "resnet50_amp.pickle.gz", "--backend", "quantum"], "quantum"),
        "verify_without_gpu_backend": ([TRACES / "resnet50_amp.pickle.gz", "--verify"], "--verify"),
        "gpu_lag_without_gpu_backend": ([TRACES / "resnet50_amp.pickle.gz", "--gpu-lag", "64"],
                                        "--gpu-lag"),
        "negative_gpu_lag": ([TRACES / "resnet50_amp.pickle.gz", "--gpu-lag", "-1"], "--gpu-lag"),
        "torch_allocator_on_sim": ([TRACES / "resnet50_amp.pickle.gz", "--allocator", "torch-native"],
                                   "torch-native"),
        "rmm_allocator_on_sim": ([TRACES / "resnet50_amp.pickle.gz", "--allocator", "rmm-pool"],
                                 "rmm-pool"),
        "cub_allocator_on_sim": ([TRACES / "resnet50_amp.pickle.gz", "--allocator", "cuarena,cub"],
                                 "cub"),
        "cuarena_upstream_row_on_sim": ([TRACES / "resnet50_amp.pickle.gz", "--allocator",
                                         "cuarena-async"], "cuarena-async"),
        "unknown_allocator": ([TRACES / "resnet50_amp.pickle.gz", "--allocator", "rmm-binning"],
                              "rmm-binning"),
    }


@pytest.mark.parametrize("case", ["unknown_action_code", "nonzero_padding", "devices_out_of_order",
                                  "size_beyond_any_device", "fifo", "json_is_a_directory",
                                  "missing", "truncated_gzip", "not_a_snapshot", "pickle_not_a_dict",
                                  "negative_size", "truncated_cuat", "directory", "unknown_option",
                                  "bad_capacity", "negative_capacity", "ambiguous_capacity_unit", "huge_capacity",
                                  "bad_config_key",
                                  "bad_config_value", "bad_backend", "verify_without_gpu_backend",
                                  "gpu_lag_without_gpu_backend", "negative_gpu_lag",
                                  "torch_allocator_on_sim", "rmm_allocator_on_sim",
                                  "cub_allocator_on_sim", "cuarena_upstream_row_on_sim",
                                  "unknown_allocator"])
def test_bad_input_is_one_clear_line(case, tmp_path):
    args, named = bad_inputs(tmp_path)[case]
    proc = run("replay", *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cuarena: error: "), lines[0]
    assert named in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "terminate" not in proc.stderr
    assert proc.stdout == ""


def test_bad_environment_config_is_reported(tmp_path):
    env = dict(os.environ, CUARENA_CONF="small_limit:1MiB,typo_key:1")
    proc = subprocess.run([cli(), "replay", TRACES / "resnet50_amp.pickle.gz"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 2
    assert "typo_key" in proc.stderr and "position 17" in proc.stderr
    assert "CUARENA_CONF" in proc.stderr


def test_unwritable_json_fails_before_replaying(tmp_path):
    proc = run("replay", TRACES / "resnet50_amp.pickle.gz", "--json", tmp_path / "no" / "dir.json")
    assert proc.returncode == 2
    assert "cannot write in" in proc.stderr and "No such file or directory" in proc.stderr
    assert proc.stdout == ""


def test_gpu_backend_without_a_gpu_says_so(tmp_path):
    proc = run("replay", TRACES / "resnet50_amp.pickle.gz", "--backend", "cuda")
    if proc.returncode == 0:
        pytest.skip("this machine has a GPU: the no-GPU message cannot be checked here")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cuarena: error: --backend cuda: "), lines


def test_gpu_min_capacity_is_not_refused_for_want_of_the_simulator(tmp_path):
    # --min-capacity works with --backend cuda alone now; without a GPU the only complaint is that.
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine may have a GPU: a full GPU capacity search is too slow here")
    proc = run("replay", TRACES / "bert_varlen_infer.pickle.gz", "--backend", "cuda",
               "--min-capacity")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cuarena: error: --backend cuda"), lines
    assert "--min-capacity" not in lines[0]


def test_version_and_results_table_help(tmp_path):
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip().startswith("cuarena 0."), proc
    script = Path(__file__).resolve().parents[2] / "tools" / "results_table.py"
    helped = subprocess.run(["python3", script, "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "cuarena replay --json" in helped.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    refused = subprocess.run(["python3", script, bad], capture_output=True, text=True)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert str(bad) in refused.stderr


def test_replay_readme_documents_every_option():
    """tools/replay/README.md's usage block names exactly the options `cuarena replay --help`
    lists, and the text below it describes each."""
    helped = run("replay", "--help", check=True).stdout
    options = set(re.findall(r"^  (?:-h,)?(--[a-z-]+)", helped, re.M)) - {"--help"}
    assert {"--allocator", "--capacity", "--report"} <= options, helped
    readme = (REPO / "tools" / "replay" / "README.md").read_text()
    _, usage, rest = readme.split("```", 2)
    replay_usage = usage[: usage.index("cuarena convert")]
    assert set(re.findall(r"--[a-z-]+", replay_usage)) == options
    undescribed = [o for o in sorted(options) if not re.search(rf"`{o}[` ]", rest)]
    assert not undescribed, undescribed


def test_one_bad_trace_among_several_is_reported_and_the_others_replay(tmp_path):
    good = TRACES / "resnet50_amp.pickle.gz"
    missing = tmp_path / "missing.pickle.gz"
    not_a_trace = tmp_path / "notes.txt"
    not_a_trace.write_text("hello, I am not a trace\n")
    out = tmp_path / "out.json"
    proc = run("replay", missing, good, not_a_trace, "--json", out)
    assert proc.returncode == 2, proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 2, proc.stderr
    assert errors[0].startswith(f"cuarena: error: {missing}: ")
    assert errors[1].startswith(f"cuarena: error: {not_a_trace}: ")
    assert "resnet50_amp" in proc.stdout  # the good trace is replayed and printed
    results = json.loads(out.read_text())["results"]
    assert {r["trace"] for r in results} == {"resnet50_amp"} and len(results) == 2


def test_snapshot_without_history_says_how_to_record_one(tmp_path):
    path = tmp_path / "no_history.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"total_size": 20 * MiB}], "device_traces": [[]]}))
    proc = run("replay", path)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"cuarena: error: {path}: "), line
    assert "has no allocation history: record it with " \
           "torch.cuda.memory._record_memory_history() before the workload and " \
           "torch.cuda.memory._dump_snapshot(path) after" in line
    assert proc.stdout == ""


def test_implausible_sizes_are_reported_against_the_users_file(tmp_path):
    # The converter itself names the snapshot's event ...
    path = snapshot(tmp_path, [[ev("alloc", 0x1000, 1 << 50)]])
    proc = run("replay", path)
    assert proc.returncode == 2
    assert f"{path}: device_traces[0][0]: implausible size" in proc.stderr, proc.stderr
    # ... and what the C++ reader still finds in converted events (here from a converter that
    # lets the size through) is reported against the input too, never the temporary file.
    lax = tmp_path / "lax_converter.py"
    lax.write_text("import struct, sys\n"
                   "rec = struct.pack('<BBHIQQQq', 0, 0, 0, 0, 0, 16, 1 << 50, 0)\n"
                   "open(sys.argv[3], 'wb').write(b'CUATRACE' + struct.pack('<IIQQ', 1, 40, 1, 0)"
                   " + rec)\n")
    env = dict(os.environ, CUARENA_TRACE_SCRIPT=str(lax))
    proc = subprocess.run([cli(), "replay", str(path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"cuarena: error: {path}: record 0 has an implausible size"), line
    assert "cuarena-trace-" not in line


def test_error_lines_quoting_huge_fields_are_clipped(tmp_path):
    path = snapshot(tmp_path, [[ev("alloc", 0x1000, "9" * 10**7)]])
    csv = tmp_path / "huge.csv"
    csv.write_bytes(b"Thread,Time,Action,Pointer,Size,Stream\n1,5,allocate,0x10,8,"
                    + b"s" * 100_000 + b"\n")
    for args in ([path], [csv], [TRACES / "resnet50_amp.pickle.gz", "--config",
                                 "small_limit:" + "7" * 100_000],  # an argument's limit: 128 KiB
                 [TRACES / "resnet50_amp.pickle.gz", "--config", "x" * 100_000 + ":1"]):
        proc = run("replay", *args)
        assert proc.returncode == 2
        [line] = proc.stderr.strip().splitlines()
        assert "\u2026 (" in line and len(line) < 800, line[:1000]


TiB = 1 << 40


@functools.lru_cache(maxsize=None)
def sanitized(path):
    """The binary was built with AddressSanitizer, whose shadow memory needs terabytes of address
    space: no address-space cap can apply to it."""
    return b"__asan_init" in Path(path).read_bytes()


def limited(max_bytes):
    """preexec_fn: the child's address space capped, so a runaway allocation fails fast (not
    under AddressSanitizer, where the exit codes and messages are still checked)."""
    import resource
    if sanitized(cli()):
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))


def test_sums_beyond_any_device_are_refused_not_wrapped(tmp_path):
    # Each size is allowed (at most 16 TiB); their sums are not: 2^20 of them would wrap 64 bits.
    live = cuat_file(tmp_path, [record(addr=0x1000, size=16 * TiB), record(addr=0x2000)])
    segments = cuat_file(tmp_path, [record(action=3, addr=1 << 46, size=16 * TiB),
                                    record(action=3, addr=1 << 47, size=16 * TiB), record()])
    released = cuat_file(tmp_path, [record(action=4, addr=1 << 46, size=16 * TiB),
                                    record(action=4, addr=1 << 47, size=16 * TiB), record()])
    for path, what in ((live, "the live allocations"), (segments, "the recorded segments"),
                       (released, "the recorded segments")):
        proc = run("replay", path, "--allocator", "recorded,cuarena")
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line == f"cuarena: error: {path}: device 0, event 1: {what} add up to more than " \
                       "any device holds (16 TiB)", line
    # Exactly 16 TiB live is a device's worth, not refused.
    full = cuat_file(tmp_path, [record(addr=0x1000, size=16 * TiB - 512), record(addr=0x2000)])
    assert run("replay", full, "--allocator", "torch-native-sim").returncode == 0


def test_min_capacity_above_the_largest_device_is_a_note_not_a_crash(tmp_path):
    # 16 TiB requested, but cuarena needs one more granule for the small block: no simulated
    # device fits. The search stops at 16 TiB (it went on to 32 TiB and ran out of simulated
    # address space, exit 3). 1 GiB granules keep the 16 TiB replay cheap.
    path = cuat_file(tmp_path, [record(addr=1 << 30, size=16 * TiB - 512), record(addr=16)])
    proc = run("replay", path, "--min-capacity", "--allocator", "cuarena", "--config",
               "sim_granularity:1GiB")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith(
        "cuarena: no capacity up to 16.00 TiB (the largest simulated device) replays without "
        "out-of-memory"), proc.stderr


def test_fine_granules_are_bounded_by_the_device_not_the_address_space(tmp_path):
    # Too many granules for the simulator: refused, naming the option and the bound ...
    proc = run("replay", TRACES / "resnet50_amp.pickle.gz", "--capacity", "16TiB", "--config",
               "sim_granularity:64KiB")
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("cuarena: error: --capacity 16TiB is 268435456 granules") \
        and "at most 8388608 (512.00 GiB at this granularity)" in line, line
    # ... while a large address-space reservation costs nothing until it is mapped (the
    # simulator kept three words per reserved granule: 17 GB here).
    proc = subprocess.run([cli(), "replay", TRACES / "resnet50_amp.pickle.gz", "--allocator",
                           "cuarena", "--config", "va_reserve:64TiB,sim_granularity:64KiB"],
                          capture_output=True, text=True, preexec_fn=limited(2 << 30))
    assert proc.returncode == 0, proc.stderr


def test_decompression_bombs_are_refused_in_bounded_memory_and_time(tmp_path):
    z = gzip.compress(bytes(512 << 20), compresslevel=1)  # 512 MiB of zeros, about 0.5 MB
    pickle_bomb = tmp_path / "bomb.pickle.gz"  # a pickle's first byte, then zeros
    pickle_bomb.write_bytes(gzip.compress(b"\x80\x04") + z)
    not_a_trace = tmp_path / "zeros.gz"
    not_a_trace.write_bytes(z)
    blank = tmp_path / "blank.csv.gz"  # a header, then blank lines
    blank.write_bytes(gzip.compress(b"Thread,Time,Action,Pointer,Size,Stream\n" + b"\n" * 20001))
    claims = tmp_path / "claims.cuat.gz"  # 40 bytes that claim 10^8 records
    claims.write_bytes(gzip.compress(b"CUATRACE" + (1).to_bytes(4, "little")
                                     + (40).to_bytes(4, "little")
                                     + (10**8).to_bytes(8, "little") + bytes(8)))
    for path, problem in ((pickle_bomb, "pickle"), (not_a_trace, "not a PyTorch snapshot"),
                          (blank, "line 10002: more than 10000 blank lines: not an RMM log"),
                          (claims, "header promises 100000000 events, a ")):
        # The converter decompressed the whole input first (512 MiB here, 6 GiB in the wild).
        proc = subprocess.run([cli(), "replay", path], capture_output=True, text=True,
                              timeout=60, preexec_fn=limited(384 << 20),
                              env=dict(os.environ, CUARENA_CACHE_DIR=""))
        assert proc.returncode == 2, (path, proc.stderr)
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"cuarena: error: {path}: ") and problem in line, line


def test_many_streams_replay_in_linear_time(tmp_path):
    # 100,000 streams, one block each: every allocation raises torch-native-sim's peak, which
    # was measured there by a pass over every cached block (27 s here, 0.2 s now).
    import time
    n = 100_000
    path = cuat_file(tmp_path, [r for s in range(1, n + 1)
                                for r in (record(stream=s, addr=16 * s),
                                          record(action=2, stream=s, addr=16 * s))])
    start = time.monotonic()
    [row] = replay_json(tmp_path, path, "--allocator", "torch-native-sim")
    # A bound for the quadratic pass only (27 s uninstrumented, far more under ASan), not a speed
    # figure: a loaded CI machine under ASan took 6.4 s for the linear one.
    assert time.monotonic() - start < 25
    assert row["allocs"] == n and row["ooms"] == 0


def test_notes_for_many_devices_are_one_line(tmp_path):
    # No segment events on any device: one note for all 40, not 40 notes.
    path = snapshot(tmp_path, [[ev("alloc", 0x1000, 512), ev("free_completed", 0x1000, 512)]] * 40)
    proc = run("replay", path, "--allocator", "recorded,cuarena", check=True)
    notes = proc.stderr.strip().splitlines()
    assert notes == ["cuarena replay: snap: 40 devices (cuda0, cuda1, cuda2, \u2026, cuda39): no "
                     "'recorded' row: the trace has no segment events (RMM logs and cuarena "
                     "recordings do not hold the upstream's reservations)"], notes
    assert sum("snap:cuda" in line for line in proc.stdout.splitlines()) == 40


def verdicts(stdout):
    """The verdict lines after the table: {(trace, allocator words): verdict}."""
    lines = stdout.split("\n\n", 1)[1].strip().splitlines()
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines}


def test_capacity_gives_one_verdict_per_row(tmp_path):
    trace = TRACES / "resnet50_amp.pickle.gz"
    out = tmp_path / "out.json"
    proc = run("replay", trace, "--capacity", "8GiB", "--json", out, check=True)
    v = verdicts(proc.stdout)
    results = {r["allocator"]: r for r in json.loads(out.read_text())["results"]}
    for allocator, row in results.items():
        spare = (8 << 30) - row["peak_reserved_bytes"]
        assert row["capacity_bytes"] == 8 << 30
        assert row["verdict"].startswith("fits with ") and row["verdict"].endswith(" to spare")
        assert v[f"resnet50_amp {allocator}" + (" on sim" if allocator == "cuarena" else "")] \
            == row["verdict"]
        assert abs(float(row["verdict"].split()[2]) * (1 << 20 if "MiB" in row["verdict"]
                                                        else 1 << 30) - spare) < 0.01 * (1 << 30)
    # Without --capacity or --check: no verdicts, in the table or the JSON.
    [r] = replay_json(tmp_path, trace, "--allocator", "cuarena")
    assert "verdict" not in r


def test_out_of_memory_verdict_names_the_event_the_request_and_what_was_free(tmp_path):
    import cuarena_trace
    trace = TRACES / "resnet50_amp.pickle.gz"
    out = tmp_path / "out.json"
    args = ("replay", trace, "--allocator", "cuarena", "--capacity", "4GiB", "--json", out)
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr  # out of memory is a result, not a failure ...
    [r] = json.loads(out.read_text())["results"]
    first = r["first_oom"]
    event = cuarena_trace.load_events(str(trace))[first["event"]]
    assert event.action == 0 and event.size == first["request_bytes"]  # an alloc of that size
    assert first["cached_free_bytes"] + first["unreserved_bytes"] < (4 << 30)
    assert first["free_pieces"] >= 1 and first["largest_free_piece_bytes"] < first["request_bytes"]
    assert r["verdict"].startswith(f"runs out of memory at event {first['event']}: a ")
    assert f" in {first['free_pieces']} pieces" in r["verdict"]
    assert f"{r['ooms']} failed allocations in all" in r["verdict"]
    assert verdicts(proc.stdout)["resnet50_amp cuarena on sim"] == r["verdict"]
    checked = run(*args, "--check")  # ... unless asked: --check makes it exit 1
    assert checked.returncode == 1, checked.stderr
    fits = run("replay", trace, "--allocator", "cuarena", "--check")
    assert fits.returncode == 0 and "fits with" in fits.stdout
    bad = run("replay", trace, tmp_path / "missing.pickle", "--capacity", "4GiB", "--check")
    assert bad.returncode == 2  # bad input stays 2, whatever else happened


def test_recorded_out_of_memory_is_reported_but_not_checked(tmp_path):
    trace = TRACES / "edge" / "record_stream_oom_empty_cache.pickle"
    proc = run("replay", trace, "--check")
    assert proc.returncode == 0, proc.stderr  # the recording's own OOM is not a replay's
    v = verdicts(proc.stdout)["record_stream_oom_empty_cache recorded"]
    assert v.startswith("ran out of memory when recorded at event 15: a 256.00 TiB request "
                        "with "), v
    assert "pieces" in v and "does not hold the device's own free memory" in v


def test_min_capacity_checks_its_answer_above_the_search(tmp_path):
    """A synthetic trace (16 events, found by a random search and shrunk) on which cuarena with
    whole chunks fits at 94 MiB, runs out of memory from 102 to 108 MiB and fits again from
    110 MiB: the binary search alone would report 94 MiB; the probes above it find the
    failures."""
    M = MiB
    events = [(0, 0, 0x140000000, 4 * M), (0, 0, 0x180000000, 8 * M), (0, 0, 0x1c0000000, 16653751),
              (0, 7, 0x200000000, 8 * M), (2, 0, 0x180000000, 8 * M), (2, 0, 0x1c0000000, 16653751),
              (0, 0, 0x2c0000000, 26851118), (2, 0, 0x2c0000000, 26851118),
              (2, 0, 0x140000000, 4 * M), (0, 0, 0x300000000, 261120),
              (0, 7, 0x380000000, 33168641), (2, 0, 0x300000000, 261120),
              (0, 0, 0x400000000, 28875765), (0, 0, 0x480000000, 473088),
              (0, 0, 0x4c0000000, 7 * M), (2, 7, 0x380000000, 33168641)]
    path = cuat_file(tmp_path, [record(action=a, stream=s, addr=addr, size=size, time_us=t)
                                for t, (a, s, addr, size) in enumerate(events)], "nonmonotone.cuat")
    out = tmp_path / "out.json"
    proc = run("replay", path, "--allocator", "cuarena", "--min-capacity", "--json", out,
               "--config", "whole_chunk_min:4MiB,loop_plan:False", check=True)
    [r] = json.loads(out.read_text())["results"]
    assert r["min_capacity_search_bytes"] == 94 * M
    probes = {p["capacity_bytes"]: p["ooms"] for p in r["min_capacity_probes"]}
    assert all(c > 94 * M for c in probes)
    assert [c // M for c, ooms in sorted(probes.items()) if ooms] == [102, 104, 106, 108]
    assert r["min_capacity_bytes"] == 110 * M  # the smallest capacity above which all fit
    assert all(ooms == 0 for c, ooms in probes.items() if c >= 110 * M)
    [note] = proc.stderr.strip().splitlines()
    assert note == ("cuarena replay: nonmonotone: cuarena: the capacity search found 94.00 MiB, "
                    "but 108.00 MiB (above it) runs out of memory (1 failed allocation): min "
                    "capacity 110.00 MiB, the smallest capacity above which every probe fits "
                    "(min_capacity_probes in the JSON)"), note
    for capacity, fails in ((94 * M, False), (104 * M, True), (110 * M, False)):
        [at] = replay_json(tmp_path, path, "--allocator", "cuarena", "--capacity", capacity,
                           "--config", "whole_chunk_min:4MiB,loop_plan:False")
        assert (at["ooms"] > 0) == fails, capacity


def run_env(*args, **env):
    """run() with environment variables set (None: removed)."""
    environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True, env=environ,
                          timeout=600)


def no_elapsed(results):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in results]


def test_converted_snapshots_are_cached_by_content(tmp_path, private_cache):
    failing = tmp_path / "no_python.sh"  # stands in for Python: any conversion now fails
    failing.write_text("#!/bin/sh\necho 'cuarena-trace: conversion attempted' >&2\nexit 3\n")
    failing.chmod(0o755)
    trace = tmp_path / "snap.pickle.gz"
    shutil.copy(TRACES / "bert_varlen_infer.pickle.gz", trace)
    out = tmp_path / "out.json"
    run("replay", trace, "--json", out, check=True)
    first = json.loads(out.read_text())
    [entry] = private_cache.iterdir()
    assert entry.name.endswith(".cuat.gz") and len(entry.name.split("-")[0]) == 64
    assert gzip.decompress(entry.read_bytes())[:8] == b"CUATRACE"
    # The second load reads the cache in C++: no converter runs, and the results are the same.
    proc = run_env("replay", trace, "--json", out, CUARENA_PYTHON=str(failing))
    assert proc.returncode == 0, proc.stderr
    assert no_elapsed(json.loads(out.read_text())["results"]) == no_elapsed(first["results"])
    # The key is the content, not the name ...
    renamed = tmp_path / "other_name.pickle.gz"
    shutil.copy(trace, renamed)
    assert run_env("replay", renamed, CUARENA_PYTHON=str(failing)).returncode == 0
    # ... so a changed file converts again.
    changed = tmp_path / "changed.pickle"
    changed.write_bytes(gzip.decompress(trace.read_bytes()))
    proc = run_env("replay", changed, CUARENA_PYTHON=str(failing))
    assert proc.returncode == 2 and "conversion attempted" in proc.stderr
    assert not list(private_cache.glob("*.XXXXXX")) and not list(private_cache.glob("*.cuat.gz.*"))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped_byte", "empty"])
def test_a_corrupt_cache_entry_is_ignored_and_rewritten(tmp_path, private_cache, damage):
    failing = tmp_path / "no_python.sh"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    trace = TRACES / "resnet50_amp.pickle.gz"
    good = replay_json(tmp_path, trace)
    [entry] = private_cache.iterdir()
    data = entry.read_bytes()
    entry.write_bytes({"garbage": b"not a trace at all",
                       "truncated": data[: len(data) // 2],
                       "flipped_byte": data[:5000] + bytes([data[5000] ^ 0x40]) + data[5001:],
                       "empty": b""}[damage])
    # The damaged entry is not used: without a converter the load fails ...
    assert run_env("replay", trace, CUARENA_PYTHON=str(failing)).returncode == 2
    # ... with one, it converts again, gives the same results and rewrites the entry.
    assert no_elapsed(replay_json(tmp_path, trace)) == no_elapsed(good)
    assert entry.read_bytes() == data
    assert run_env("replay", trace, CUARENA_PYTHON=str(failing)).returncode == 0


def test_cache_location_and_switching_it_off(tmp_path):
    trace = TRACES / "bert_varlen_infer.pickle.gz"
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    assert run_env("replay", trace, CUARENA_CACHE_DIR=None, XDG_CACHE_HOME=None,
                   HOME=str(home)).returncode == 0
    assert len(list((home / ".cache" / "cuarena").glob("*.cuat.gz"))) == 1
    assert run_env("replay", trace, CUARENA_CACHE_DIR=None, XDG_CACHE_HOME=str(xdg),
                   HOME=str(home)).returncode == 0
    assert len(list((xdg / "cuarena").glob("*.cuat.gz"))) == 1
    # CUARENA_CACHE_DIR= (empty) turns the cache off: nothing written, every load converts.
    off = tmp_path / "off_home"
    assert run_env("replay", trace, CUARENA_CACHE_DIR="", XDG_CACHE_HOME=None,
                   HOME=str(off)).returncode == 0
    assert not off.exists()
    # An unwritable cache is no error: the replay goes on without it.
    assert run_env("replay", trace, CUARENA_CACHE_DIR="/proc/no/such/dir").returncode == 0


def small_files(limit):
    """preexec_fn: writes past `limit` bytes fail with EFBIG ("File too large"), as on a full
    disk, instead of the process being killed."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def run_limited(limit, *args):
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True, timeout=600,
                          preexec_fn=small_files(limit))


def one_error_line(proc):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cuarena: error: "), proc.stderr
    return lines[0]


def small_trace(tmp_path):
    """A .cuat of a few events: its results JSON is about 2 KB, and no conversion (whose
    temporary files the size limit would stop first) is needed."""
    return cuat_file(tmp_path, [record(action=3, addr=1 << 30, size=20 * MiB),
                                record(addr=1 << 30, size=4 * MiB),
                                record(addr=(1 << 30) + 4 * MiB, size=512),
                                record(action=2, addr=1 << 30, size=4 * MiB)], "small.cuat")


def test_a_failed_json_write_leaves_the_earlier_file(tmp_path):
    trace = small_trace(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "results.json"
    out.write_text('{"results": []}\n')
    # The JSON (about 2 KB) does not fit under 1 KB: it was rewritten in place, leaving 1 KB of
    # broken JSON and "results.json: write failed".
    line = one_error_line(run_limited(1024, "replay", trace, "--json", out))
    assert line == f"cuarena: error: --json {out}: write failed: File too large; the earlier " \
                   "file is unchanged", line
    assert out.read_text() == '{"results": []}\n'
    assert [p.name for p in out_dir.iterdir()] == ["results.json"]  # no temporary left
    # Written whole, it keeps the earlier file's mode and leaves nothing beside it.
    out.chmod(0o640)
    run("replay", trace, "--json", out, check=True)
    assert json.loads(out.read_text())["results"] and (out.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in out_dir.iterdir()] == ["results.json"]


def test_convert_writes_through_a_name_of_its_own(tmp_path):
    trace = small_trace(tmp_path)
    out = tmp_path / "out" / "t.cuat"
    out.parent.mkdir()
    partial = out.parent / "t.cuat.partial"
    partial.write_text("the user's own file")  # the fixed temporary name took it, then removed it
    out.write_bytes(b"earlier")
    run("convert", trace, out, check=True)
    assert out.read_bytes() == trace.read_bytes()
    assert partial.read_text() == "the user's own file"
    # A failed write: the earlier file stays, no temporary is left, and the line says why.
    out.write_bytes(b"earlier")
    big = tmp_path / "big.cuat"
    run("convert", TRACES / "resnet50_amp.pickle.gz", big, check=True)
    line = one_error_line(run_limited(64 << 10, "convert", big, out))
    assert line.startswith(f"cuarena: error: convert output {out}: write failed: File too large")
    assert line.endswith("; the earlier file is unchanged"), line
    assert out.read_bytes() == b"earlier"
    assert sorted(p.name for p in out.parent.iterdir()) == ["t.cuat", "t.cuat.partial"]


def test_a_failed_report_write_leaves_the_earlier_file(tmp_path):
    if subprocess.run([os.environ.get("CUARENA_PYTHON", "python3"), "-c", "import matplotlib"],
                      capture_output=True).returncode != 0:
        pytest.skip("matplotlib not installed (tools/install-deps.sh installs it)")
    trace = small_trace(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "r.png"
    out.write_bytes(b"earlier picture")
    # The rows' JSON (a few KB) fits under 16 KB; the picture (tens of KB) does not.
    line = one_error_line(run_limited(16 << 10, "replay", trace, "--report", out))
    assert line.startswith(f"cuarena: error: --report {out}: ") and "File too large" in line, line
    assert line.endswith("; the earlier file is unchanged") and ".r." not in line, line
    assert out.read_bytes() == b"earlier picture"
    assert [p.name for p in out_dir.iterdir()] == ["r.png"]
    run("replay", trace, "--report", out, check=True)
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in out_dir.iterdir()] == ["r.png"]


@pytest.mark.parametrize("option", ["--json", "--capacity", "--report", "--allocator", "--backend",
                                    "--device", "--gpu-lag", "--torch-conf", "TRACE"])
def test_an_empty_value_is_an_error_naming_the_option(tmp_path, option):
    trace = small_trace(tmp_path)
    args = ["replay", ""] if option == "TRACE" else ["replay", trace, option, ""]
    proc = run(*args)
    line = one_error_line(proc)
    assert line.startswith(f"cuarena: error: {option}: empty value"), line
    assert proc.stdout == ""
    assert list(tmp_path.iterdir()) == [trace]  # nothing written


def test_an_empty_config_is_the_defaults_not_the_environment(tmp_path):
    trace = TRACES / "bert_varlen_infer.pickle.gz"
    defaults = replay_json(tmp_path, trace, "--allocator", "cuarena")
    out = tmp_path / "env.json"
    # $CUARENA_CONF applies without --config, and --config '' sets it aside.
    proc = run_env("replay", trace, "--allocator", "cuarena", "--json", out,
                   CUARENA_CONF="whole_chunk_min:4MiB")
    assert proc.returncode == 0, proc.stderr
    assert no_elapsed(json.loads(out.read_text())["results"]) != no_elapsed(defaults)
    proc = run_env("replay", trace, "--allocator", "cuarena", "--config", "", "--json", out,
                   CUARENA_CONF="whole_chunk_min:4MiB")
    assert proc.returncode == 0, proc.stderr
    assert no_elapsed(json.loads(out.read_text())["results"]) == no_elapsed(defaults)
    broken = run_env("replay", trace, "--config", "", CUARENA_CONF="typo_key:1")
    assert broken.returncode == 0, broken.stderr
    assert "--config ''" in run("replay", "--help", check=True).stdout


def test_every_quoted_argument_is_clipped_and_escaped(tmp_path):
    trace = small_trace(tmp_path)
    big = "x" * 100_000  # an argument's limit is 128 KiB
    cases = [
        ["replay", trace, "--capacity", "9" + big],
        ["replay", trace, "--capacity=9" + big],
        ["replay", trace, "--allocator", "torch-native-sim", "--torch-conf", big + ":1"],
        ["replay", trace, "--json", big],
        ["replay", trace, "--json", tmp_path / big[:200] / "r.json"],
        ["replay", trace, "--report", big + ".png"],
        ["replay", trace, "--report", big],
        ["replay", trace, "--backend", big],
        ["replay", trace, "--allocator", big],
        ["replay", trace, "--device", big],
        ["replay", trace, "--config", big],
        ["replay", tmp_path / big[:250]],
        ["convert", trace, big + "/t.cuat"],
        [big],
    ]
    for args in cases:
        line = one_error_line(run(*args))
        assert "\u2026 (" in line and len(line) < 800, (args[1:3], line[:1000])
    # A control character would split the line or drive the terminal: escaped.
    odd = "a\nb\x1b[31m"
    for args in (["replay", trace, "--json", tmp_path / odd / "r.json"],
                 ["replay", trace, "--report", tmp_path / odd / "r.png"],
                 ["replay", trace, "--backend", odd], ["replay", tmp_path / odd],
                 ["convert", trace, tmp_path / odd / "t.cuat"], [odd],
                 ["replay", trace, "--config", odd + ":1"]):
        line = one_error_line(run(*args))
        assert "a\\nb\\x1b[31m" in line and "\x1b" not in line, (args, line)


def test_an_unknown_subcommand_is_named_with_the_valid_ones():
    line = one_error_line(run("bogus"))
    assert line == "cuarena: error: unknown subcommand 'bogus': give replay, convert or config " \
                   "(run 'cuarena --help')", line
    line = one_error_line(run())
    assert "a subcommand is required: replay, convert or config" in line, line
    assert run("--version").returncode == 0 and run("--help").returncode == 0


def test_sim_capacity_is_zero_or_at_least_one_granule(tmp_path):
    trace = small_trace(tmp_path)
    for config, named in (("sim_capacity:1", "expected 0, or a size from one granule"),
                          ("sim_capacity:1MiB", "sim_capacity 1MiB is less than one granule "
                                                "(sim_granularity 2MiB)"),
                          ("sim_granularity:64KiB,sim_capacity:32KiB", "sim_capacity")):
        line = one_error_line(run("replay", trace, "--config", config))
        assert named in line, line
    # The granule may come after the capacity; 0 is the documented default device.
    for config in ("sim_capacity:1MiB,sim_granularity:64KiB", "sim_capacity:0",
                   "sim_capacity:2MiB"):
        assert run("replay", trace, "--config", config).returncode == 0, config
    row = next(l for l in (REPO / "README.md").read_text().splitlines()
               if l.startswith("| `sim_capacity` |"))
    assert "0, or a size from one granule (sim_granularity) to 16TiB" in row


def test_a_negative_device_is_refused(tmp_path):
    line = one_error_line(run("replay", small_trace(tmp_path), "--device", "-1"))
    assert line.startswith("cuarena: error: --device: Value -1 not in range 0 to "), line
