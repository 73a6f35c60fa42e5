"""Tests of tools/trace/cuarena_trace.py against the real traces and trace/FORMAT.md."""

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import cuarena_trace as ct  # found through conftest.py

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACE_TOOL = REPO_ROOT / "tools" / "trace" / "cuarena_trace.py"
TRACE_DATA = REPO_ROOT / "tests" / "data" / "traces"

# From tests/data/traces/README.md (a copy of /work/shared/traces/README.md): allocs, peak
# requested bytes, and the native allocator's peak reserved bytes, which the segment events of
# each trace reproduce to the byte.
REAL_TRACES = {
    "gpt2_train": (16335, 14104549064, 15286140928),
    "resnet50_amp": (8316, 6057040924, 7295991808),
    "bert_varlen_infer": (14862, 753596000, 1497366528),
    "vit_multistream": (11271, 7981331564, 8577351680),
    "moe_train": (59867, 11490525960, 12396265472),
}
EDGE = TRACE_DATA / "edge"
OOM_TRACE = EDGE / "record_stream_oom_empty_cache.pickle"
EXPANDABLE_TRACE = EDGE / "expandable_segments.pickle"


def real(name: str) -> Path:
    return TRACE_DATA / f"{name}.pickle.gz"


def run_tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TRACE_TOOL), *map(str, args)], capture_output=True, timeout=120
    )


def records(path: Path) -> list[bytes]:
    """The raw 40-byte records of an uncompressed .cuat file."""
    data = path.read_bytes()
    return [data[i : i + 40] for i in range(32, len(data), 40)]


def plain_snapshot_events(path: Path) -> list[dict]:
    """Device 0's events read with unrestricted pickle (these test files are trusted)."""
    return pickle.loads(path.read_bytes())["device_traces"][0]


# --- the byte layout -------------------------------------------------------------------------


def test_layout_matches_format_md_byte_for_byte():
    event = ct.Event(7, 1, 0x1122334455667788, 0, 1 << 48, -5)
    header = (
        b"CUATRACE"
        + (1).to_bytes(4, "little")  # version
        + (40).to_bytes(4, "little")  # record_size
        + (1).to_bytes(8, "little")  # event_count
        + bytes(8)  # reserved
    )
    record = (
        bytes([7, 0])  # action, pad
        + (1).to_bytes(2, "little")  # device
        + bytes(4)  # pad
        + (0x1122334455667788).to_bytes(8, "little")  # stream
        + bytes(8)  # addr
        + (1 << 48).to_bytes(8, "little")  # size
        + (-5).to_bytes(8, "little", signed=True)  # time_us
    )
    assert len(header) == 32 and len(record) == 40
    assert ct.encode_cuat([event]) == header + record
    assert ct.read_cuat(header + record) == [event]


def test_writer_groups_devices_in_order_keeping_event_order():
    events = [ct.Event(0, 1, 0, 16, 1, 0), ct.Event(0, 0, 0, 32, 2, 1), ct.Event(2, 1, 0, 16, 1, 2)]
    assert ct.read_cuat(ct.encode_cuat(events)) == [events[1], events[0], events[2]]


# --- real traces: the figures of the README ---------------------------------------------------


@pytest.mark.parametrize("name", REAL_TRACES)
def test_summarize_reproduces_readme_figures(name):
    allocs, peak_requested, native_reserved = REAL_TRACES[name]
    summary = ct.summarize(ct.load_events(real(name)))
    assert summary["actions"]["alloc"] == allocs
    assert summary["peak_requested_bytes"] == peak_requested
    assert summary["recorded_peak_reserved_bytes"] == native_reserved
    assert summary["skipped_frees"] == 0
    assert summary["devices"] == [0]


@pytest.mark.parametrize("name", REAL_TRACES)
def test_info_cli_prints_readme_figures(name):
    _, peak_requested, native_reserved = REAL_TRACES[name]
    result = run_tool("info", real(name))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert "format: pytorch-snapshot" in lines
    assert f"peak_requested_bytes: {peak_requested}" in lines
    assert f"recorded_peak_reserved_bytes: {native_reserved}" in lines


def test_info_json():
    result = run_tool("info", "--json", OOM_TRACE)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["format"] == "pytorch-snapshot"
    assert summary["events"] == 16
    assert summary["actions"] == {
        "alloc": 7, "free_requested": 2, "free_completed": 2, "segment_alloc": 4, "oom": 1
    }


def test_vit_multistream_has_two_streams():
    assert len(ct.summarize(ct.load_events(real("vit_multistream")))["streams"]) == 2


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("source", [real(n) for n in REAL_TRACES] + [OOM_TRACE, EXPANDABLE_TRACE],
                         ids=lambda p: p.name)
def test_convert_round_trip(source, tmp_path):
    events = ct.load_events(source)
    out = tmp_path / "trace.cuat"
    result = run_tool("convert", source, out)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b"" and result.stdout == b""
    assert out.stat().st_size == 32 + 40 * len(events)
    assert ct.load_events(out) == events

    # A .cuat converts to the identical bytes (validated and copied through).
    again = tmp_path / "again.cuat"
    assert run_tool("convert", out, again).returncode == 0
    assert again.read_bytes() == out.read_bytes()


def test_events_match_the_snapshot_field_by_field():
    raw = plain_snapshot_events(EXPANDABLE_TRACE)
    events = ct.load_events(EXPANDABLE_TRACE)
    assert len(events) == len(raw)
    for event, source in zip(events, raw):
        assert ct.ACTION_NAMES[event.action] == source["action"]
        assert event.device == 0
        assert event.stream == source["stream"]
        assert event.addr == (0 if source["action"] == "oom" else source["addr"])
        assert event.size == source["size"]
        assert event.time_us == source["time_us"]


def test_gzip_output_and_stdout_output(tmp_path):
    plain, packed = tmp_path / "t.cuat", tmp_path / "t.cuat.gz"
    assert run_tool("convert", OOM_TRACE, plain).returncode == 0
    assert run_tool("convert", OOM_TRACE, packed).returncode == 0
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert ct.load_events(packed) == ct.load_events(plain)

    result = run_tool("convert", OOM_TRACE, "-")
    assert result.returncode == 0 and result.stderr == b""
    assert result.stdout == plain.read_bytes()


def test_stdout_reader_going_away_is_quiet():
    # 7 MB of output: far more than a pipe holds, so the writer meets the closed pipe.
    proc = subprocess.Popen([sys.executable, str(TRACE_TOOL), "convert", real("moe_train"), "-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(8) == b"CUATRACE"
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 1
    assert stderr == b""


def test_format_is_sniffed_not_taken_from_the_name(tmp_path):
    disguised = tmp_path / "trace.txt"
    disguised.write_bytes(gzip.compress(OOM_TRACE.read_bytes()))
    assert ct.load_trace(disguised) == ("pytorch-snapshot", ct.load_events(OOM_TRACE))


# --- edge traces -----------------------------------------------------------------------------


def test_oom_is_encoded_with_addr_zero_and_the_request_size(tmp_path):
    out = tmp_path / "oom.cuat"
    assert run_tool("convert", OOM_TRACE, out).returncode == 0
    ooms = [r for r in records(out) if r[0] == 7]
    assert len(ooms) == 1
    oom = ooms[0]
    assert int.from_bytes(oom[16:24], "little") == 0  # addr
    raw = plain_snapshot_events(OOM_TRACE)
    expected_size = next(e["size"] for e in raw if e["action"] == "oom")
    assert int.from_bytes(oom[24:32], "little") == expected_size == 1 << 48


def test_expandable_segments_map_and_unmap_codes(tmp_path):
    out = tmp_path / "exp.cuat"
    assert run_tool("convert", EXPANDABLE_TRACE, out).returncode == 0
    codes = [r[0] for r in records(out)]
    assert codes.count(5) == 4  # segment_map
    assert codes.count(6) == 3  # segment_unmap
    assert codes.count(8) == 1  # snapshot
    assert 3 not in codes and 4 not in codes  # no plain segments under expandable_segments


def test_record_stream_trace_has_two_streams():
    summary = ct.summarize(ct.load_events(OOM_TRACE))
    assert len(summary["streams"]) == 2 and 0 in summary["streams"]
    result = run_tool("info", OOM_TRACE)
    streams_line = next(l for l in result.stdout.decode().splitlines() if l.startswith("streams:"))
    assert len(streams_line.split(",")) == 2


# --- summary semantics -----------------------------------------------------------------------


def test_summary_skips_unseen_frees_and_tracks_devices_separately():
    E = ct.Event
    events = [
        E(2, 0, 0, 999, 64, 0),  # free of an address the trace never allocated
        E(3, 0, 0, 4096, 2048, 1),  # segment_alloc
        E(0, 0, 0, 4096, 100, 2),
        E(0, 0, 0, 4196, 300, 3),  # requested peak 400
        E(2, 0, 0, 4096, 100, 4),
        E(4, 0, 0, 4096, 2048, 5),  # segment_free
        E(0, 1, 7, 4096, 50, 6),  # same address, other device: its own allocator
        E(5, 1, 7, 0, 512, 7),  # segment_map
        E(6, 1, 7, 0, 512, 8),
        E(255, 1, 7, 0, 0, 9),
    ]
    summary = ct.summarize(events)
    assert summary["skipped_frees"] == 1
    assert summary["per_device"][0] == {
        "peak_requested_bytes": 400, "recorded_peak_reserved_bytes": 2048, "skipped_frees": 1
    }
    assert summary["per_device"][1]["peak_requested_bytes"] == 50
    assert summary["per_device"][1]["recorded_peak_reserved_bytes"] == 512
    assert summary["peak_requested_bytes"] == 450
    assert summary["actions"]["other"] == 1
    assert summary["streams"] == [0, 7]


def test_unknown_snapshot_action_becomes_255(tmp_path):
    path = tmp_path / "s.pickle"
    event = {"action": "future_thing", "stream": 0, "time_us": 5}
    path.write_bytes(pickle.dumps({"device_traces": [[], [event]]}))
    assert ct.load_events(path) == [ct.Event(255, 1, 0, 0, 0, 5)]


# --- RMM CSVs --------------------------------------------------------------------------------

RMM_LOG = """\
Thread,Time,Action,Pointer,Size,Stream,Note
140245,10:32:01.123456,allocate,0x7f0000000000,1024,0x0,a
140245,10:32:01.125000,allocate,140737488355328,4096,0x5a5a,b
140246,10:32:02.000001,free,0x7f0000000000,1024,0x0,c
140246,10:32:02.5,allocate failure,(nil),1099511627776,0x5a5a,d
"""


def test_rmm_csv_converts_with_codes_hex_and_relative_times(tmp_path):
    log, out = tmp_path / "rmm_log.csv", tmp_path / "rmm.cuat"
    log.write_text(RMM_LOG)
    result = run_tool("convert", log, out)
    assert result.returncode == 0, result.stderr
    E = ct.Event
    assert ct.load_events(out) == [
        E(0, 0, 0, 0x7F0000000000, 1024, 0),
        E(0, 0, 0x5A5A, 140737488355328, 4096, 1544),
        E(1, 0, 0, 0x7F0000000000, 1024, 876545),
        E(2, 0, 0, 0x7F0000000000, 1024, 876545),
        E(7, 0, 0x5A5A, 0, 1 << 40, 1376544),
    ]
    assert [r[0] for r in records(out)] == [0, 0, 1, 2, 7]
    assert ct.load_trace(log)[0] == "rmm-csv"


def test_rmm_csv_column_order_comes_from_the_header(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("Action,Size,Stream,Pointer,Time,Thread\n"
                   "allocate,10,7,0x10,5,1\n"
                   "free,10,7,16,9,1\n")
    E = ct.Event
    assert ct.load_events(log) == [
        E(0, 0, 7, 16, 10, 0), E(1, 0, 7, 16, 10, 4), E(2, 0, 7, 16, 10, 4)
    ]


def test_rmm_csv_midnight_and_unreadable_times(tmp_path):
    log = tmp_path / "midnight.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,23:59:59.999000,allocate,0x10,8,0x0\n1,00:00:00.001000,free,0x10,8,0x0\n")
    assert [e.time_us for e in ct.load_events(log)] == [0, 2000, 2000]

    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,yesterday,allocate,0x10,8,0x0\n1,today,allocate,0x20,8,0x0\n")
    assert [e.time_us for e in ct.load_events(log)] == [0, 1]  # row indices


def test_gzipped_rmm_csv(tmp_path):
    log = tmp_path / "log.csv.gz"
    log.write_bytes(gzip.compress(RMM_LOG.encode()))
    assert len(ct.load_events(log)) == 5


# --- bad input -------------------------------------------------------------------------------


def _snapshot(event: dict) -> bytes:
    return pickle.dumps({"device_traces": [[event]]})


def _global_pickle(marker: Path) -> bytes:
    """A pickle that would run `touch marker` through os.system if its global were honoured."""
    command = f"touch {marker}".encode()
    return (b"\x80\x02cos\nsystem\n(X" + len(command).to_bytes(4, "little") + command + b"tR.")


def _first_half(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: len(data) // 2]


def _bad_cuat(data: bytes) -> bytes:
    good = ct.encode_cuat([ct.Event(0, 0, 0, 16, 8, 0), ct.Event(2, 0, 0, 16, 8, 1)])
    return data.replace(b"@", good)


BAD_INPUTS = {
    "missing_file": (None, "No such file"),
    "truncated_gzip": (lambda: _first_half(real("gpt2_train")), "truncated gzip"),
    "corrupt_gzip": (lambda: gzip.compress(b"x" * 100)[:12] + b"\xff" * 40, "gzip"),
    "plain_text": (lambda: b"hello, world\n", "not a PyTorch snapshot, RMM CSV or cuarena trace"),
    "empty_file": (lambda: b"", "not a PyTorch snapshot, RMM CSV or cuarena trace"),
    "pickled_list": (lambda: pickle.dumps([1, 2, 3]), "not a PyTorch snapshot"),
    "dict_without_traces": (lambda: pickle.dumps({"segments": []}), "not a PyTorch snapshot"),
    "negative_size": (lambda: _snapshot({"action": "alloc", "addr": 16, "size": -5, "stream": 0,
                                         "time_us": 1}), "negative size -5"),
    "string_addr": (lambda: _snapshot({"action": "alloc", "addr": "0x10", "size": 5, "stream": 0,
                                       "time_us": 1}), "addr is '0x10'"),
    "missing_addr": (lambda: _snapshot({"action": "free_completed", "size": 5, "stream": 0,
                                        "time_us": 1}), "missing key 'addr'"),
    "truncated_pickle": (lambda: OOM_TRACE.read_bytes()[:4000], "pickle"),
    "bad_csv_row": (lambda: b"Thread,Time,Action,Pointer,Size,Stream\n"
                            b"1,10:00:00.000000,allocate,0x10,8,0x0\n"
                            b"1,10:00:00.000001,allocate,0x20,lots,0x0\n", "line 3"),
    "short_csv_row": (lambda: b"Thread,Time,Action,Pointer,Size,Stream\n1,2,free,0x10\n", "line 2"),
    "truncated_cuat": (lambda: _bad_cuat(b"@")[:-7], "truncated"),
    "cuat_version_2": (lambda: _bad_cuat(b"@").replace(b"CUATRACE\x01", b"CUATRACE\x02", 1),
                       "version 2"),
    # Taken with torch.cuda.memory._snapshot() but without _record_memory_history(): segments,
    # no events. Say how to record a usable one instead of replaying nothing.
    "snapshot_without_history": (lambda: pickle.dumps({"segments": [{"total_size": 2 << 20}],
                                                       "device_traces": [[], []]}),
                                 "(1 segment) has no allocation history: record it with "
                                 "torch.cuda.memory._record_memory_history()"),
    "snapshot_without_devices": (lambda: pickle.dumps({"segments": [], "device_traces": []}),
                                 "_dump_snapshot(path)"),
    "implausible_snapshot_size": (lambda: _snapshot({"action": "alloc", "addr": 16,
                                                     "size": 1 << 50, "stream": 0, "time_us": 1}),
                                  "device_traces[0][0]: implausible size 1125899906842624"),
    "implausible_csv_size": (lambda: b"Thread,Time,Action,Pointer,Size,Stream\n"
                                     b"1,10:00:00.000000,allocate,0x10,1125899906842624,0x0\n",
                             "line 2: implausible size"),
    # Fields far too large to quote whole (FIELD_SHOWN characters and a length instead).
    "huge_string_size": (lambda: _snapshot({"action": "alloc", "addr": 16, "size": "7" * 10**7,
                                            "stream": 0, "time_us": 1}),
                         "\u2026 (10000002 characters), expected an integer"),
    "huge_integer_stream": (lambda: _snapshot({"action": "alloc", "addr": 16, "size": 8,
                                               "stream": 10**5000, "time_us": 1}),
                            "stream a 16610-bit integer does not fit in 64 bits"),
    "huge_csv_pointer": (lambda: b"Thread,Time,Action,Pointer,Size,Stream\n1,5,allocate,"
                                 + b"z" * 100_000 + b",8,0x0\n",
                         "\u2026 (100002 characters) is not a hex or decimal integer"),
    "long_csv_number": (lambda: b"Thread,Time,Action,Pointer,Size,Stream\n1,5,allocate,"
                                + b"9" * 100_000 + b",8,0x0\n",
                        "line 2: Pointer '999"),
}
HUGE_FIELDS = ["huge_string_size", "huge_integer_stream", "huge_csv_pointer", "long_csv_number"]


@pytest.mark.parametrize("case", BAD_INPUTS)
@pytest.mark.parametrize("command", ["convert", "info"])
def test_bad_input_is_one_line_and_exit_2(case, command, tmp_path):
    make, problem = BAD_INPUTS[case]
    path = tmp_path / f"{case}.input"
    if make is not None:
        path.write_bytes(make())
    out = tmp_path / "out.cuat"
    result = run_tool(command, path, *([out] if command == "convert" else []))
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert b"Traceback" not in result.stderr
    assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"cuarena-trace: {path}: "), stderr
    assert problem in stderr
    assert result.stdout == b""
    assert not out.exists()
    if case in HUGE_FIELDS:  # the field is quoted in part: the line stays short
        assert len(stderr) < len(str(path)) + 400, len(stderr)


def test_snapshot_without_history_is_refused_by_the_library_too():
    with pytest.raises(ct.TraceError, match="no allocation history"):
        ct.snapshot_events({"segments": [{}], "device_traces": [[]]})
    # One device with events is a usable trace, even when another has none.
    assert len(ct.snapshot_events({"device_traces": [[], [
        {"action": "alloc", "addr": 16, "size": 8, "stream": 0, "time_us": 1}]]})) == 1


def test_pickle_globals_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(_global_pickle(marker))
    result = run_tool("info", path)
    assert result.returncode == 2
    assert result.stderr.decode().startswith(f"cuarena-trace: {path}: ")
    assert "refusing to load global os.system" in result.stderr.decode()
    assert not marker.exists()
    with pytest.raises(ct.TraceError, match="only built-in types"):
        ct.load_events(path)


def test_unwritable_output_names_the_output(tmp_path):
    out = tmp_path / "no_such_dir" / "out.cuat"
    result = run_tool("convert", OOM_TRACE, out)
    assert result.returncode == 2
    assert result.stderr.decode() == f"cuarena-trace: {out}: No such file or directory\n"
