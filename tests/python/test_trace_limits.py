"""The trace readers' gzip rules and limits (trace/FORMAT.md, "Gzip" and "Limits"): the converter
(cuarena_trace, the reference reader) and the replayer (`cuarena replay`, whose C++ reader takes
.cuat files) refuse the same broken or hostile inputs, in one line naming the file and in bounded
memory, and read the same good ones."""

import gzip
import json
import os
import pickle
import random
import re
import struct
import subprocess
import time
from pathlib import Path

import pytest

import cuarena_trace as ct

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def cli():
    path = os.environ.get("CUARENA_CLI") or str(REPO / "build" / "bin" / "cuarena")
    if not Path(path).exists():
        pytest.fail(f"cuarena binary not found at {path}: build first (see README)")
    return path


def address_space(max_bytes):
    """preexec_fn capping the child's address space (its converter's too), so memory the input
    does not hold fails fast; none under AddressSanitizer, whose shadow memory needs terabytes."""
    import resource
    if b"__asan_init" in Path(cli()).read_bytes():
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))


def replay(path, *args, max_bytes=None):
    return subprocess.run([cli(), "replay", str(path), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, CUARENA_CACHE_DIR=""),
                          preexec_fn=address_space(max_bytes) if max_bytes else None)


def refused(proc, path, problem):
    """The replayer's one error line, exit 2."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"cuarena: error: {path}: ") and problem in line, line
    assert proc.stdout == ""
    return line


def converter(path, max_bytes=None):
    """`cuarena_trace.py info PATH`, the reference reader on its own."""
    return subprocess.run(["python3", str(REPO / "tools" / "trace" / "cuarena_trace.py"), "info",
                           str(path)], capture_output=True, text=True, timeout=300,
                          preexec_fn=address_space(max_bytes) if max_bytes else None)


def ev(action, addr, size=512, stream=0, t=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t}


def pairs(n, stream=lambda i: 0):
    """n allocs, each freed at once, on streams stream(i)."""
    return [e for i in range(n) for e in (ev("alloc", 16 * i + 16, stream=stream(i), t=2 * i),
                                          ev("free_completed", 16 * i + 16, stream=stream(i),
                                             t=2 * i + 1))]


def cuat(events):
    return ct.encode_cuat([ct.Event(*e) for e in events])


IMAGE = cuat([(0, 0, 0, 16 * i, 512, i) for i in range(50)]
             + [(2, 0, 0, 16 * i, 512, 50 + i) for i in range(50)])


def gz(data, level=6):
    return gzip.compress(data, compresslevel=level, mtime=0)


# --- gzip: the trailer, bytes after it, members, padding --------------------------------------

@pytest.mark.parametrize("kind", ["cuat", "pickle"])
@pytest.mark.parametrize("cut", [1, 4, 8])
def test_a_gzip_trailer_cut_off_is_refused_by_both_readers(tmp_path, kind, cut):
    data = IMAGE if kind == "cuat" else pickle.dumps({"device_traces": [pairs(50)]})
    path = tmp_path / f"cut.{kind}.gz"
    path.write_bytes(gz(data)[:-cut])  # the CRC-32 and the length are the last 8 bytes
    problem = "truncated gzip data (the file ends inside a gzip member, before its CRC-32"
    refused(replay(path), path, problem)
    with pytest.raises(ct.TraceError, match=re.escape(problem)):
        ct.load_events(path)


@pytest.mark.parametrize("kind", ["cuat", "pickle"])
@pytest.mark.parametrize("tail", [b"garbage!", b"\x1f", b"\0\0\0x", b"\n"])
def test_bytes_after_the_gzip_data_are_refused_by_both_readers(tmp_path, kind, tail):
    data = IMAGE if kind == "cuat" else pickle.dumps({"device_traces": [pairs(50)]})
    path = tmp_path / f"tail.{kind}.gz"
    path.write_bytes(gz(data) + tail)
    refused(replay(path), path, "trailing bytes after the gzip data")
    with pytest.raises(ct.TraceError, match="trailing bytes after the gzip data"):
        ct.load_events(path)


def test_a_wrong_crc_is_refused_by_both_readers(tmp_path):
    data = bytearray(gz(IMAGE))
    data[-8] ^= 1
    path = tmp_path / "crc.cuat.gz"
    path.write_bytes(bytes(data))
    refused(replay(path), path, "corrupt gzip data")
    with pytest.raises(ct.TraceError, match="corrupt gzip data"):
        ct.load_events(path)


def test_members_in_a_row_and_nul_padding_read_as_python_reads_them(tmp_path):
    """Allowed because Python's gzip module (the reference reader's) allows them: RFC 1952's
    members one after another are one content, and NUL bytes pad tapes."""
    plain = tmp_path / "plain.cuat"
    plain.write_bytes(IMAGE)
    joined = tmp_path / "joined.cuat.gz"
    joined.write_bytes(gz(IMAGE[:1000]) + gz(b"") + gz(IMAGE[1000:]) + bytes(64))
    assert ct.load_events(joined) == ct.load_events(plain)
    out = tmp_path / "out.json"
    results = []
    for path in (plain, joined):
        proc = replay(path, "--allocator", "cuarena", "--json", out)
        assert proc.returncode == 0, proc.stderr
        [row] = json.loads(out.read_text())["results"]
        results.append((row["allocs"], row["frees"], row["peak_requested_bytes"]))
    assert results[0] == results[1] == (50, 50, 50 * 512)


def test_bytes_after_a_pickle_are_refused(tmp_path):
    path = tmp_path / "after.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [pairs(5)]}) + b"junk")
    refused(replay(path), path, "trailing bytes after the pickle")
    with pytest.raises(ct.TraceError, match="trailing bytes after the pickle"):
        ct.load_events(path)


# --- records: a header's promise, and what a gzip bomb holds ----------------------------------

def zeros_cuat_gz(count):
    """count well-formed records (zeros: allocs of 0 bytes at address 0) as the fuzzing campaign
    made them: about 1 KB of gzip per 25,000 records (1 MB members, repeated)."""
    header = struct.pack("<8sIIQQ", b"CUATRACE", 1, 40, count, 0)
    member = gzip.compress(bytes(10**6), compresslevel=9, mtime=0)
    return gz(header) + member * (count // 25000)


@pytest.mark.parametrize("count", [10**8, 4 * 10**8])
def test_a_gzip_of_more_records_than_the_limit_is_refused_at_once(tmp_path, count):
    # 4 and 16 MB: 10^8 records took 24-43 s and 3.9 GB; 4x10^8 ended in std::bad_alloc (exit 3).
    path = tmp_path / "zeros.cuat.gz"
    path.write_bytes(zeros_cuat_gz(count))
    assert path.stat().st_size * 1032 >= count * 40  # holds them by deflate's largest expansion
    problem = (f"header promises {count} events, more than a trace may hold (67108864, 2.50 GiB "
               "decompressed; trace/FORMAT.md)")
    refused(replay(path, max_bytes=512 * MiB), path, problem)
    proc = converter(path, max_bytes=512 * MiB)
    assert proc.returncode == 2 and proc.stderr == f"cuarena-trace: {path}: {problem}\n"


def test_the_python_reader_holds_only_the_records_it_reads(tmp_path):
    """A header promising the most records over none: refused as truncated, not after reading
    (or making room for) what the header promised."""
    path = tmp_path / "promise.cuat.gz"
    path.write_bytes(gz(struct.pack("<8sIIQQ", b"CUATRACE", 1, 40, ct.MAX_EVENTS, 0)))
    proc = converter(path, max_bytes=256 * MiB)
    assert proc.returncode == 2, proc.stderr
    assert f"truncated: header says {ct.MAX_EVENTS} events" in proc.stderr, proc.stderr


# --- snapshots whose pickle memo repeats lists ------------------------------------------------

def hostile(kind):
    """The fuzzing campaign's snapshots: small pickles that repeat one object many times through
    pickle's memo (pickle.dumps of a list holding one object many times)."""
    if kind == "one_list_on_8192_devices":  # cost 2.6-3.1 GB
        return {"device_traces": [pairs(500)] * 8192}
    if kind == "one_event_10_million_times":  # cost 2.6-3.1 GB
        return {"device_traces": [[ev("alloc", 16)] * 10**7]}
    if kind == "65536_devices":  # 17-24 s and 1.4 GB
        return {"device_traces": [pairs(1) for _ in range(65536)]}
    if kind == "one_list_on_128_devices":  # as many devices as allowed, 12.8 million events
        return {"device_traces": [pairs(50000)] * 128}
    raise AssertionError(kind)


HOSTILE = {
    "one_list_on_8192_devices": "8192 devices; a trace holds at most 128",
    "one_event_10_million_times": "10000000 events from a ",
    "65536_devices": "65536 devices; a trace holds at most 128",
    "one_list_on_128_devices": "12800000 events from a ",
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_snapshot_repeating_lists_is_refused_in_bounded_memory(tmp_path, kind):
    path = tmp_path / f"{kind}.pickle.gz"
    path.write_bytes(gz(pickle.dumps(hostile(kind)), level=1))
    assert path.stat().st_size < 4 * MiB
    line = refused(replay(path, max_bytes=1 << 30), path, HOSTILE[kind])
    if "events from a" in line:
        assert "pickle memo references" in line, line


def test_small_shared_lists_are_still_read(tmp_path):
    # Hand-made snapshots share lists ([[...]] * 40): within the allowance that costs nothing.
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [pairs(1)] * 40}))
    assert len(ct.load_events(path)) == 80
    assert replay(path, "--allocator", "cuarena").returncode == 0


def test_the_events_per_pickle_byte_bound_is_exact(monkeypatch):
    monkeypatch.setattr(ct, "SHARED_EVENTS_ALLOWED", 0)
    snapshot = {"device_traces": [[ev("alloc", 16)] * 24]}
    assert len(ct.snapshot_events(snapshot, pickle_bytes=24 * ct.PICKLE_BYTES_PER_EVENT)) == 24
    with pytest.raises(ct.TraceError, match="24 events from a 287-byte pickle"):
        ct.snapshot_events(snapshot, pickle_bytes=24 * ct.PICKLE_BYTES_PER_EVENT - 1)


def test_a_distinct_event_takes_more_pickle_bytes_than_the_bound(monkeypatch):
    """The bound's premise: no snapshot of distinct events, however packed, takes fewer than
    PICKLE_BYTES_PER_EVENT bytes of pickle per event (the fewest keys, one shared string)."""
    monkeypatch.setattr(ct, "SHARED_EVENTS_ALLOWED", 0)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        events = [{"action": "x", "stream": 0, "time_us": 0} for _ in range(20_000)]
        data = pickle.dumps({"device_traces": [events]}, protocol=protocol)
        assert len(data) > len(events) * ct.PICKLE_BYTES_PER_EVENT, protocol
        assert len(ct.parse_bytes(data)[1]) == len(events)


# --- devices, streams, events and bytes in every format ---------------------------------------

def test_devices_are_0_to_127_in_every_format(tmp_path):
    ok = tmp_path / "ok.cuat"
    ok.write_bytes(cuat([(0, 0, 0, 16, 8, 0), (0, 127, 0, 16, 8, 0)]))
    assert len(ct.load_events(ok)) == 2
    assert replay(ok, "--allocator", "cuarena").returncode == 0
    bad = tmp_path / "bad.cuat"
    bad.write_bytes(cuat([(0, 0, 0, 16, 8, 0), (0, 128, 0, 16, 8, 0)]))
    problem = "record 1: device 128 (devices are 0 to 127)"
    refused(replay(bad), bad, problem)
    with pytest.raises(ct.TraceError, match=re.escape(problem)):
        ct.load_events(bad)
    snap = tmp_path / "snap.pickle"
    snap.write_bytes(pickle.dumps({"device_traces": [[] for _ in range(128)] + [pairs(1)]}))
    refused(replay(snap), snap, "129 devices; a trace holds at most 128")


def test_streams_per_device_in_every_format(tmp_path, monkeypatch):
    n = ct.MAX_STREAMS_PER_DEVICE  # the readers agree at the real limit ...
    path = tmp_path / "streams.cuat"
    path.write_bytes(cuat([(0, d, s, 16, 8, s) for d in (0, 1) for s in range(n)]))
    assert len(ct.load_events(path)) == 2 * n  # the most on each device
    path.write_bytes(cuat([(0, 0, s, 16, 8, s) for s in range(n + 1)]))
    problem = f"record {n}: more than {n} streams on device 0"
    refused(replay(path), path, problem)
    with pytest.raises(ct.TraceError, match=problem):
        ct.load_events(path)
    n = 100  # ... which the converter's other formats count as .cuat does
    monkeypatch.setattr(ct, "MAX_STREAMS_PER_DEVICE", n)
    snap = tmp_path / "streams.pickle"
    snap.write_bytes(pickle.dumps({"device_traces": [pairs(n + 1, stream=lambda i: i)]}))
    with pytest.raises(ct.TraceError, match=rf"device_traces\[0\]\[{2 * n}\]: more than {n} "):
        ct.load_events(snap)
    csv = tmp_path / "streams.csv"
    csv.write_text("Action,Pointer,Size,Stream\n"
                   + "".join(f"allocate,{16 * s},8,{s}\n" for s in range(n + 1)))
    with pytest.raises(ct.TraceError, match=f"line {n + 2}: more than {n} streams on device 0"):
        ct.load_events(csv)


def test_the_event_limit_in_every_format(tmp_path, monkeypatch):
    monkeypatch.setattr(ct, "MAX_EVENTS", 10)
    with pytest.raises(ct.TraceError, match="12 events; a trace holds at most 10"):
        ct.snapshot_events({"device_traces": [pairs(3), pairs(3)]})
    with pytest.raises(ct.TraceError, match="line 7: more than 10 events"):  # frees are two
        ct.parse_bytes(b"Action,Pointer,Size,Stream\n" + b"free,16,8,0\n" * 6)
    with pytest.raises(ct.TraceError, match="header promises 11 events, more than a trace may"):
        ct.parse_bytes(cuat([(0, 0, 0, 16, 8, 0)] * 11))


def test_decompressed_bytes_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(ct, "MAX_INPUT_BYTES", MiB)
    data = pickle.dumps({"device_traces": [pairs(20000)]})
    assert len(data) > MiB
    with pytest.raises(ct.TraceError, match=r"more than 1048576 bytes \(1.00 MiB\) of data"):
        ct.parse_bytes(gz(data))


def test_format_md_states_the_limits_the_readers_apply():
    md = " ".join((REPO / "trace" / "FORMAT.md").read_text().split())
    assert f"| records (`event_count`) | {ct.MAX_EVENTS:,} (2^26) |" in md
    assert f"| decompressed bytes | {ct.MAX_CUAT_BYTES:,} (32 + 40 × 2^26) |" in md
    assert f"| devices | indices 0 to {ct.MAX_DEVICES - 1} |" in md
    assert f"| streams | {ct.MAX_STREAMS_PER_DEVICE:,} (2^17) distinct streams per device |" in md
    assert f"at most {ct.MAX_INPUT_BYTES >> 30} GiB once decompressed" in md
    assert (f"one event per {ct.PICKLE_BYTES_PER_EVENT} bytes" in md
            and f"the first {ct.SHARED_EVENTS_ALLOWED:,}" in md)
    readme = " ".join((REPO / "tools" / "replay" / "README.md").read_text().split())
    for figure in (f"{ct.MAX_EVENTS:,} (2^26)", f"{ct.MAX_STREAMS_PER_DEVICE:,} distinct",
                   f"indices 0 to {ct.MAX_DEVICES - 1}", f"{ct.MAX_INPUT_BYTES >> 30} GiB"):
        assert figure in readme, figure


# --- fuzzing the converter with the findings as seeds ----------------------------------------

def test_mutated_findings_are_read_or_refused_with_a_trace_error():
    """Seeded mutations of the findings (small versions) and of good inputs, read in process:
    each is read within the limits or refused with a TraceError, nothing else. Bounded for CI:
    a fixed number of inputs and a wall-clock cap."""
    good = pickle.dumps({"device_traces": [pairs(20), pairs(3, stream=lambda i: i)]})
    seeds = [good, gz(good), IMAGE, gz(IMAGE), gz(IMAGE)[:-8], gz(IMAGE) + b"junk",
             gz(IMAGE[:500]) + gz(IMAGE[500:]) + bytes(4), good + b"junk",
             pickle.dumps({"device_traces": [pairs(20)] * 300}),
             pickle.dumps({"device_traces": [[ev("alloc", 16)] * 100_000]}),
             b"Action,Pointer,Size,Stream\n" + b"allocate,16,8,0\nfree,16,8,0\n" * 10]
    rng = random.Random(20261204)
    start, done, read = time.monotonic(), 0, 0
    while done < 1500 and time.monotonic() - start < 20:
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(5)
            if op == 0 and data:  # flip bits
                for _ in range(rng.randint(1, 6)):
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            elif op == 1:  # truncate
                del data[rng.randrange(len(data) + 1):]
            elif op == 2:  # append
                data += bytes(rng.randrange(256) for _ in range(rng.randrange(32)))
            elif op == 3 and data:  # an interesting byte
                data[rng.randrange(len(data))] = rng.choice([0, 1, 0x7f, 0x80, 0xff])
            elif op == 4:
                data = bytearray(gz(bytes(data), level=1))
        try:
            _, events = ct.parse_bytes(bytes(data))
            read += 1
            assert len(events) <= ct.MAX_EVENTS
            assert all(e.device < ct.MAX_DEVICES for e in events)
        except ct.TraceError as e:
            assert "\n" not in str(e)
        done += 1
    assert done >= 150, "the time cap cut the run short"
    assert 0 < read < done
