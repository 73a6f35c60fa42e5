#!/usr/bin/env python3
"""Convert allocation traces to the cuarena trace format (``.cuat``) and summarise them.

The output format is specified byte for byte in ``trace/FORMAT.md`` (a 32-byte header and
40-byte little-endian records); this module is its reference writer.

Inputs are recognised by content, never by file name:

* gzip data (magic ``1f 8b``) is decompressed first, then sniffed again;
* ``CUATRACE`` -- an existing ``.cuat`` file: validated and copied through;
* a pickle (protocol byte ``0x80``) -- a PyTorch memory snapshot
  (``torch.cuda.memory._snapshot()``), read with a restricted unpickler that refuses every
  global, so a hostile pickle cannot run code;
* text whose first line names the columns ``Action`` and ``Pointer`` -- an RMM
  ``logging_resource_adaptor`` CSV (``Thread,Time,Action,Pointer,Size,Stream``).

Command line::

    cuarena_trace.py convert INPUT OUTPUT   # OUTPUT '-' is stdout; OUTPUT ending in .gz is gzipped
    cuarena_trace.py info [--json] INPUT    # event counts, devices, streams, peaks

Any problem with the input is reported as one line, ``cuarena-trace: <path>: <problem>``, on
stderr, with exit status 2; so is an input past FORMAT.md's limits (events, devices, streams,
decompressed bytes), checked before the memory it would take is committed.

Library use: :func:`load_events` (or :func:`load_trace`, which also names the input format),
:func:`write_cuat`, :func:`read_cuat` and :func:`summarize`. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import json
import os
import pickle
import re
import stat
import struct
import sys
import zlib
from typing import BinaryIO, Iterable, NamedTuple

# --- the format (FORMAT.md) ------------------------------------------------------------------

MAGIC = b"CUATRACE"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ")  # magic, version, record_size, event_count, reserved
RECORD = struct.Struct("<BBHIQQQq")  # action, pad, device, pad, stream, addr, size, time_us
assert HEADER.size == 32 and RECORD.size == 40

ACTIONS = {
    "alloc": 0,
    "free_requested": 1,
    "free_completed": 2,
    "segment_alloc": 3,
    "segment_free": 4,
    "segment_map": 5,
    "segment_unmap": 6,
    "oom": 7,
    "snapshot": 8,
}
OTHER = 255
ACTION_NAMES = {code: name for name, code in ACTIONS.items()} | {OTHER: "other"}

ALLOC, FREE_REQUESTED, FREE_COMPLETED = 0, 1, 2
SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, OOM = 3, 4, 5, 6, 7

U64_MAX = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
MAX_DEVICE_BYTES = 16 << 40  # kMaxDeviceBytes (config.hpp): no event but an oom asks for more
# The readers' limits (FORMAT.md, "Limits"; format.hpp's kMax*), checked before what they allow
# is held, so a small file cannot make a reader hold or replay more than a real trace would.
MAX_EVENTS = 1 << 26  # records in one trace: 2.5 GiB of them
MAX_DEVICES = 128  # device indices 0-127: PyTorch's device index is an int8 (at most 120 GPUs)
MAX_STREAMS_PER_DEVICE = 1 << 17
MAX_CUAT_BYTES = HEADER.size + MAX_EVENTS * RECORD.size  # a .cuat once decompressed
MAX_INPUT_BYTES = 16 << 30  # a snapshot or CSV once decompressed
# A distinct event dict takes at least 13 bytes of pickle (MARK, three keys and values, DICT), so
# a snapshot with more events than one per 12 bytes repeats objects through pickle's memo; past a
# few (hand-made snapshots share lists) that is refused: the work would not follow the file.
PICKLE_BYTES_PER_EVENT = 12
SHARED_EVENTS_ALLOWED = 1 << 16
FIELD_SHOWN = 200  # characters of an input field an error message quotes

GZIP_MAGIC = b"\x1f\x8b"
PICKLE_PROTO = b"\x80"
UNKNOWN_INPUT = "not a PyTorch snapshot, RMM CSV or cuarena trace"


class Event(NamedTuple):
    """One trace record, in the field order of FORMAT.md (pads left out)."""

    action: int
    device: int
    stream: int
    addr: int
    size: int
    time_us: int


class TraceError(Exception):
    """The input (or output) cannot be used; the message says why, on one line."""


# --- reading ---------------------------------------------------------------------------------


def load_events(path: str) -> list[Event]:
    """Read any supported trace file and return its events, devices in order."""
    return load_trace(path)[1]


def load_trace(path: str) -> tuple[str, list[Event]]:
    """Read any supported trace file; return (format name, events).

    The file is read as a stream (gzip decompressed as it is read), so memory follows what the
    trace holds, not what a small compressed file expands to, and content that is no trace is
    refused after its first bytes.

    Raises TraceError for unusable content and OSError when the file cannot be read.
    """
    with open(path, "rb") as f:
        return parse_stream(f)


def parse_bytes(data: bytes) -> tuple[str, list[Event]]:
    """Sniff ``data`` (possibly gzip-compressed) and parse it; return (format name, events)."""
    return parse_stream(io.BytesIO(data))


def parse_stream(f: BinaryIO) -> tuple[str, list[Event]]:
    """Sniff a binary stream (possibly gzip-compressed) and parse it as it is read.

    Gzip data is read as Python's gzip module reads it: members may follow one another and NUL
    bytes may pad the end; anything else after a member, a member cut short (its CRC-32 and
    length trailer included) or a wrong trailer is refused, and so is anything after the trace.
    """
    content = _Checked(f, MAX_INPUT_BYTES)
    stream = io.BufferedReader(content, 1 << 20)
    if _head(stream, 2) == GZIP_MAGIC:
        content = _Checked(gzip.GzipFile(fileobj=stream, mode="rb"), MAX_INPUT_BYTES)
        stream = io.BufferedReader(content, 1 << 20)
    head = _head(stream, len(MAGIC))
    if head == MAGIC:
        return "cuarena-trace", _read_cuat_stream(stream)
    if head[:1] == PICKLE_PROTO:
        snapshot = _unpickle(stream)
        if stream.read(1):  # reading to the end checks the gzip trailer too
            raise TraceError("trailing bytes after the pickle")
        return "pytorch-snapshot", snapshot_events(snapshot, pickle_bytes=content.count)
    if _looks_like_rmm_csv(stream.peek(1 << 16)):
        return "rmm-csv", _rmm_csv_stream(stream)
    raise TraceError("empty file: " + UNKNOWN_INPUT if not head else UNKNOWN_INPUT)


class _Checked(io.RawIOBase):
    """A stream whose gzip errors, raised while it is read, are TraceErrors, and that counts
    what it gives, refusing more than ``limit`` bytes."""

    def __init__(self, inner: BinaryIO, limit: int):
        self.inner = inner
        self.limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            n = self.inner.readinto(buffer)
        except EOFError:
            raise TraceError("truncated gzip data (the file ends inside a gzip member, before "
                             "its CRC-32 and length trailer)") from None
        except gzip.BadGzipFile as e:
            if str(e).startswith("Not a gzipped file"):  # where another member would start
                raise TraceError("trailing bytes after the gzip data (not another gzip member)"
                                 ) from None
            raise TraceError(f"corrupt gzip data: {_clip(str(e))}") from None
        except zlib.error as e:
            raise TraceError(f"corrupt gzip data: {_clip(str(e))}") from None
        self.count += n or 0
        if self.count > self.limit:
            raise TraceError(f"more than {self.limit} bytes ({_size_text(self.limit)}) of data "
                             "once decompressed: more than a trace may hold")
        return n


def _size_text(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.2f} MiB"


class _Limits:
    """The per-device limits, counted as events arrive (devices in order)."""

    def __init__(self) -> None:
        self.device = -1
        self.streams: set[int] = set()

    def add(self, device: int, stream: int) -> str | None:
        """Counts an event; returns the limit it passes, if any (the caller says where)."""
        if device >= MAX_DEVICES:
            return f"device {device} (devices are 0 to {MAX_DEVICES - 1})"
        if device != self.device:
            self.device, self.streams = device, set()
        if stream not in self.streams:
            if len(self.streams) == MAX_STREAMS_PER_DEVICE:
                return f"more than {MAX_STREAMS_PER_DEVICE} streams on device {device}"
            self.streams.add(stream)
        return None


def _head(stream: io.BufferedReader, n: int) -> bytes:
    """The first ``n`` bytes of ``stream`` (fewer at its end), not consumed."""
    head = stream.peek(n)[:n]
    while len(head) < n and len(stream.peek(n)) > len(head):
        head = stream.peek(n)[:n]
    return head


# --- PyTorch snapshots -----------------------------------------------------------------------


class _SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that builds only built-in types: every global (class or function) is refused.

    Unpickling an untrusted file with plain pickle can execute arbitrary code; PyTorch snapshots
    hold only dicts, lists, strings, numbers and booleans, so nothing is lost by refusing.
    """

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(
            f"refusing to load global {module}.{name}: unpickling it could run code, "
            "and PyTorch snapshots contain only built-in types"
        )


def _unpickle(stream: BinaryIO) -> object:
    try:
        return _SnapshotUnpickler(stream).load()
    except TraceError:
        raise  # the gzip stream under the pickle
    except pickle.UnpicklingError as e:
        raise TraceError(f"bad pickle: {_clip(str(e))}") from None
    except EOFError:
        raise TraceError("truncated pickle data") from None
    except Exception as e:  # a malformed pickle can raise almost anything; none of it is a bug here
        raise TraceError(f"corrupt pickle data ({type(e).__name__}: {_clip(str(e))})") from None


def snapshot_events(snapshot: object, pickle_bytes: int | None = None) -> list[Event]:
    """Turn an unpickled PyTorch memory snapshot into events (device 0 first).

    ``pickle_bytes``, the size of the (decompressed) pickle it came from, bounds the events
    it may hold: PICKLE_BYTES_PER_EVENT each, past SHARED_EVENTS_ALLOWED.
    """
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        kind = type(snapshot).__name__
        raise TraceError(
            f"not a PyTorch snapshot (top level is a {kind} without 'device_traces')"
        )
    traces = snapshot["device_traces"]
    if not isinstance(traces, list):
        raise TraceError(f"'device_traces' is a {type(traces).__name__}, expected a list")
    if len(traces) > MAX_DEVICES:
        raise TraceError(f"{len(traces)} devices; a trace holds at most {MAX_DEVICES}")
    for device, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise TraceError(
                f"device_traces[{device}] is a {type(trace).__name__}, expected a list"
            )
    # What the lists promise, checked before any event is converted.
    total = sum(len(trace) for trace in traces)
    if total == 0:  # taken without history
        raise TraceError(_no_history(snapshot.get("segments")))
    if total > MAX_EVENTS:
        raise TraceError(f"{total} events; a trace holds at most {MAX_EVENTS}")
    if pickle_bytes is not None and total > (SHARED_EVENTS_ALLOWED
                                             + pickle_bytes // PICKLE_BYTES_PER_EVENT):
        raise TraceError(
            f"{total} events from a {pickle_bytes}-byte pickle: more than one per "
            f"{PICKLE_BYTES_PER_EVENT} bytes, so it repeats event lists or events through "
            "pickle memo references (a snapshot holds each event once)"
        )
    events: list[Event] = []
    limits = _Limits()
    for device, trace in enumerate(traces):
        for index, raw in enumerate(trace):
            where = f"device_traces[{device}][{index}]"
            event = _snapshot_event(device, raw, where)
            if problem := limits.add(device, event.stream):
                raise TraceError(f"{where}: {problem}")
            events.append(event)
    return events


def _no_history(segments: object) -> str:
    """Why a snapshot with empty ``device_traces`` cannot be replayed, and how to record one."""
    count = len(segments) if isinstance(segments, list) else 0
    held = f" ({count} segment{'s' if count > 1 else ''})" if count else ""
    return (
        f"the snapshot{held} has no allocation history: record it with "
        "torch.cuda.memory._record_memory_history() before the workload and "
        "torch.cuda.memory._dump_snapshot(path) after"
    )


def _snapshot_event(device: int, raw: object, where: str) -> Event:
    """One snapshot event dict -> Event. Unknown actions get code 255 and lenient addr/size."""
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: event is a {type(raw).__name__}, expected a dict")
    action = _field(raw, "action", where)
    if not isinstance(action, str):
        raise TraceError(f"{where}: action is a {type(action).__name__}, expected a string")
    code = ACTIONS.get(action, OTHER)
    stream = _uint64(_field(raw, "stream", where), "stream", where)
    time_us = _int64(_field(raw, "time_us", where), "time_us", where)
    if code == OOM:  # an oom event has no addr (it carries device_free instead)
        addr, size = 0, _size(_field(raw, "size", where), code, where)
    elif code == OTHER:  # skipped by the replayer: keep what is there, require nothing
        addr = _uint64(raw.get("addr", 0), "addr", where)
        size = _size(raw.get("size", 0), code, where)
    else:
        addr = _uint64(_field(raw, "addr", where), "addr", where)
        size = _size(_field(raw, "size", where), code, where)
    return Event(code, device, stream, addr, size, time_us)


def _field(raw: dict, key: str, where: str) -> object:
    try:
        return raw[key]
    except KeyError:
        raise TraceError(f"{where}: missing key '{key}'") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _clip(text: str) -> str:
    """``text`` cut to FIELD_SHOWN characters with '…' and its length: a message quoting a
    field of the input stays one short line, however large the field."""
    if len(text) <= FIELD_SHOWN:
        return text
    return f"{text[:FIELD_SHOWN]}… ({len(text)} characters)"


def _shown(value: object) -> str:
    """A field's value as an error message quotes it: repr(), clipped; a huge integer by size
    (its decimal form alone could be megabytes, and Python refuses to write it)."""
    if _is_int(value) and value.bit_length() > 256:
        return f"a {value.bit_length()}-bit integer"
    return _clip(repr(value))


def _uint64(value: object, name: str, where: str) -> int:
    if not _is_int(value):
        raise TraceError(f"{where}: {name} is {_shown(value)}, expected an integer")
    if value < 0:
        raise TraceError(f"{where}: negative {name} {_shown(value)}")
    if value > U64_MAX:
        raise TraceError(f"{where}: {name} {_shown(value)} does not fit in 64 bits")
    return value


def _int64(value: object, name: str, where: str) -> int:
    if not _is_int(value):
        raise TraceError(f"{where}: {name} is {_shown(value)}, expected an integer")
    if not I64_MIN <= value <= I64_MAX:
        raise TraceError(
            f"{where}: {name} {_shown(value)} does not fit in a signed 64-bit integer"
        )
    return value


def _size(value: object, code: int, where: str) -> int:
    """An event's size: 64 bits, and (but for oom requests, which may be anything) no more
    than any device holds, the C++ reader's rule, so the error names this input's record."""
    size = _uint64(value, "size", where)
    if size > MAX_DEVICE_BYTES and code != OOM:
        raise TraceError(
            f"{where}: implausible size {size} (more than any device holds: at most 16 TiB)"
        )
    return size


# --- RMM logging_resource_adaptor CSVs -------------------------------------------------------

RMM_REQUIRED = ("Action", "Pointer", "Size", "Stream")
RMM_ACTIONS = {"allocate": ALLOC, "free": FREE_COMPLETED, "allocate failure": OOM}
_NULL_POINTERS = {"(nil)", "nil", "null", "nullptr"}  # printf("%p", NULL) writes "(nil)"
_CLOCK = re.compile(r"([0-9]+):([0-9]{1,2}):([0-9]{1,2})(?:[.:,]([0-9]+))?")
_NUMBER = re.compile(r"([0-9]+)(?:\.([0-9]*))?")
_INTEGER = re.compile(r"0[xX][0-9a-fA-F]+|[0-9]+")
_DAY_US = 24 * 3600 * 1_000_000


class _RmmRow(NamedTuple):
    action: int  # FREE_COMPLETED stands for an RMM free, which becomes two events
    stream: int
    addr: int
    size: int
    time_us: int | None  # absolute (time of day); None when unreadable
    line: int  # in the CSV file, for messages


def _looks_like_rmm_csv(data: bytes) -> bool:
    first = data.split(b"\n", 1)[0].removeprefix(b"\xef\xbb\xbf")
    try:
        names = {name.strip() for name in first.decode("utf-8").split(",")}
    except UnicodeDecodeError:
        return False
    return "Action" in names and "Pointer" in names


def rmm_csv_events(data: bytes) -> list[Event]:
    """Turn an RMM ``logging_resource_adaptor`` CSV into events on device 0.

    ``allocate`` -> alloc; ``free`` -> free_requested then free_completed (RMM frees are
    stream-ordered and complete at once); ``allocate failure`` -> oom with addr 0; any other
    action -> 255. Times are microseconds after the first row; if any row's Time cannot be
    read, every event is stamped with its row index instead.
    """
    return _rmm_csv_stream(io.BytesIO(data))


MAX_BLANK_LINES = 10_000  # an RMM log has none; past this the file is not one (and slow to skip)


def _rmm_csv_stream(stream: BinaryIO) -> list[Event]:
    """rmm_csv_events() of a binary stream, decoded and parsed as it is read."""
    reader = csv.reader(io.TextIOWrapper(stream, encoding="utf-8-sig", newline=""))
    rows: list[_RmmRow] = []
    blank = events = 0
    limits = _Limits()
    try:
        header = next(reader)
        columns = _rmm_columns(header)
        for fields in reader:
            if not any(field.strip() for field in fields):
                blank += 1
                if blank > MAX_BLANK_LINES:
                    raise TraceError(f"line {reader.line_num}: more than {MAX_BLANK_LINES} "
                                     "blank lines: not an RMM log")
                continue
            row = _rmm_row(fields, columns, len(header), reader.line_num)
            events += 2 if row.action == FREE_COMPLETED else 1  # a free is two events
            if events > MAX_EVENTS:
                raise TraceError(f"line {row.line}: more than {MAX_EVENTS} events, the most a "
                                 "trace may hold")
            if problem := limits.add(0, row.stream):
                raise TraceError(f"line {row.line}: {problem}")
            rows.append(row)
    except csv.Error as e:
        raise TraceError(f"line {reader.line_num}: bad CSV ({_clip(str(e))})") from None
    except UnicodeDecodeError:
        raise TraceError(f"line {reader.line_num + 1}: not UTF-8 text") from None
    return _rmm_events(rows)


def _rmm_columns(header: list[str]) -> dict[str, int]:
    """Column name -> index, from the header line; extra columns are allowed."""
    columns = {name.strip(): i for i, name in enumerate(header)}
    missing = [name for name in RMM_REQUIRED if name not in columns]
    if missing:
        raise TraceError(f"line 1: RMM CSV header lacks column(s) {', '.join(missing)}")
    return columns


def _rmm_row(fields: list[str], columns: dict[str, int], width: int, line: int) -> _RmmRow:
    where = f"line {line}"
    if len(fields) != width:
        raise TraceError(f"{where}: {len(fields)} fields, the header has {width}")
    code = RMM_ACTIONS.get(fields[columns["Action"]].strip(), OTHER)
    addr = _rmm_int(fields[columns["Pointer"]], "Pointer", where)
    size = _size(_rmm_int(fields[columns["Size"]], "Size", where), code, where)
    stream = _rmm_int(fields[columns["Stream"]], "Stream", where)
    time = _rmm_time(fields[columns["Time"]]) if "Time" in columns else None
    return _RmmRow(code, stream, 0 if code == OOM else addr, size, time, line)


def _rmm_int(text: str, name: str, where: str) -> int:
    """A hex (0x...) or decimal non-negative integer; a null pointer as printf writes it is 0."""
    text = text.strip()
    if text.lower() in _NULL_POINTERS:
        return 0
    if not _INTEGER.fullmatch(text):
        raise TraceError(f"{where}: {name} {_shown(text)} is not a hex or decimal integer")
    if len(text) > 24:  # more digits than 64 bits need (int() refuses past 4300 anyway)
        raise TraceError(f"{where}: {name} {_shown(text)} does not fit in 64 bits")
    return _uint64(int(text, 16 if text[:2].lower() == "0x" else 10), name, where)


def _rmm_time(text: str) -> int | None:
    """``H:M:S[.frac]`` (RMM's clock time) or a bare number of microseconds; None if neither."""
    text = text.strip()
    clock = _CLOCK.fullmatch(text)
    if clock:
        hours, minutes, seconds, fraction = clock.groups()
        micros = int(((fraction or "") + "000000")[:6])
        return ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1_000_000 + micros
    number = _NUMBER.fullmatch(text)
    if number:
        whole, fraction = number.groups()
        return int(whole) + (1 if (fraction or "0")[0] >= "5" else 0)  # rounded
    return None


def _rmm_events(rows: list[_RmmRow]) -> list[Event]:
    times = _relative_times([row.time_us for row in rows])
    events: list[Event] = []
    for row, time_us in zip(rows, times):
        _int64(time_us, "relative time (microseconds)", f"line {row.line}")
        if row.action == FREE_COMPLETED:
            events.append(Event(FREE_REQUESTED, 0, row.stream, row.addr, row.size, time_us))
        events.append(Event(row.action, 0, row.stream, row.addr, row.size, time_us))
    return events


def _relative_times(times: list[int | None]) -> list[int]:
    """Microseconds after the first row; a clock that runs backwards by more than 12 h has
    passed midnight. Row indices when any time is missing."""
    if any(t is None for t in times):
        return list(range(len(times)))
    result, day, previous = [], 0, None
    for t in times:
        if previous is not None and t + day < previous - _DAY_US // 2:
            day += _DAY_US
        previous = t + day
        result.append(previous - times[0])
    return result


# --- cuarena traces --------------------------------------------------------------------------


def read_cuat(data: bytes) -> list[Event]:
    """Parse and validate an uncompressed ``.cuat`` image (see FORMAT.md)."""
    count = _cuat_header(data)
    expected = HEADER.size + count * RECORD.size
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "trailing bytes after the records"
        raise TraceError(
            f"{what}: header says {count} events ({expected} bytes), file has {len(data)} bytes"
        )
    _cuat_count_within_limit(count)
    events: list[Event] = []
    _cuat_events(memoryview(data)[HEADER.size :], events, _Limits())
    return events


def _read_cuat_stream(stream: BinaryIO) -> list[Event]:
    """read_cuat() of a stream, read a batch of records at a time: memory follows the records
    that are there, whatever the header promises."""
    count = _cuat_header(stream.read(HEADER.size))
    _cuat_count_within_limit(count)
    events: list[Event] = []
    limits = _Limits()
    while len(events) < count:
        want = min(count - len(events), 1 << 16) * RECORD.size
        data = stream.read(want)
        if len(data) < want:
            have = HEADER.size + len(events) * RECORD.size + len(data)
            raise TraceError(f"truncated: header says {count} events "
                             f"({HEADER.size + count * RECORD.size} bytes), file has {have} bytes")
        _cuat_events(memoryview(data), events, limits)
    if stream.read(1):  # reading to the end checks the gzip trailer too
        raise TraceError(f"trailing bytes after the records: header says {count} events "
                         f"({HEADER.size + count * RECORD.size} bytes), the file holds more")
    return events


def _cuat_header(data: bytes) -> int:
    """The event count of a ``.cuat`` header, checked."""
    if len(data) < HEADER.size:
        raise TraceError(f"truncated cuarena trace: {len(data)} bytes, the header alone is 32")
    magic, version, record_size, count, _reserved = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise TraceError(UNKNOWN_INPUT)
    if version != VERSION:
        raise TraceError(f"cuarena trace version {version}; this converter reads version 1")
    if record_size != RECORD.size:
        raise TraceError(f"cuarena trace record_size {record_size}, expected {RECORD.size}")
    return count


def _cuat_count_within_limit(count: int) -> None:
    if count > MAX_EVENTS:
        raise TraceError(f"header promises {count} events, more than a trace may hold "
                         f"({MAX_EVENTS}, {_size_text(MAX_CUAT_BYTES)} decompressed; "
                         "trace/FORMAT.md)")


def _cuat_events(records: memoryview, events: list[Event], limits: _Limits) -> None:
    """Appends the records' events to ``events``, each checked."""
    for fields in RECORD.iter_unpack(records):
        event = _cuat_event(len(events), fields, events[-1].device if events else 0)
        if problem := limits.add(event.device, event.stream):
            raise TraceError(f"record {len(events)}: {problem}")
        events.append(event)


def _cuat_event(index: int, fields: tuple, previous_device: int) -> Event:
    action, pad8, device, pad32, stream, addr, size, time_us = fields
    where = f"record {index}"
    if action not in ACTION_NAMES:
        raise TraceError(f"{where}: unknown action code {action}")
    if pad8 or pad32:
        raise TraceError(f"{where}: non-zero padding (corrupt record)")
    if device < previous_device:
        raise TraceError(f"{where}: device {device} after device {previous_device}")
    _size(size, action, where)
    return Event(action, device, stream, addr, size, time_us)


# --- writing ---------------------------------------------------------------------------------


def encode_cuat(events: Iterable[Event]) -> bytes:
    """The ``.cuat`` image of ``events``; devices are grouped in order (a stable sort)."""
    ordered = sorted(events, key=lambda event: event[1])  # [1]: plain tuples are fine too
    parts = [HEADER.pack(MAGIC, VERSION, RECORD.size, len(ordered), 0)]
    for index, event in enumerate(ordered):
        parts.append(_pack_record(index, event))
    return b"".join(parts)


def _pack_record(index: int, event: Event) -> bytes:
    action, device, stream, addr, size, time_us = event
    if action not in ACTION_NAMES:
        raise TraceError(f"event {index}: unknown action code {action}")
    try:
        return RECORD.pack(action, 0, device, 0, stream, addr, size, time_us)
    except struct.error as e:
        raise TraceError(f"event {index}: a field is out of range ({e})") from None


def write_cuat(events: Iterable[Event], fileobj: BinaryIO) -> int:
    """Write ``events`` as an uncompressed ``.cuat`` to a binary file object; return the bytes."""
    image = encode_cuat(events)
    _write_all(fileobj, image)
    return len(image)


def _write_all(fileobj: BinaryIO, data: bytes) -> None:
    """Write all of ``data``: a buffered write to a pipe can return short instead of raising
    (e.g. when the reader has gone), so loop until done or an error is raised."""
    view = memoryview(data)
    while view:
        written = fileobj.write(view)
        if not written:  # None: a non-blocking stream is full; 0: nothing can be written
            raise OSError("short write: the output accepts no more data")
        view = view[written:]
    fileobj.flush()


def save_cuat(events: Iterable[Event], path: str) -> None:
    """Write ``events`` to ``path`` ('-' is stdout); a name ending in ``.gz`` is gzipped."""
    image = encode_cuat(events)
    if path == "-":
        _write_all(sys.stdout.buffer, image)
        return
    if path.endswith(".gz"):
        image = gzip.compress(image, compresslevel=6, mtime=0)
    with open(path, "wb") as f:
        try:
            _write_all(f, image)
        except OSError:
            # Leave no half-written trace behind (e.g. disk full); never remove a device or FIFO.
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                with contextlib.suppress(OSError):
                    os.remove(path)
            raise


# --- summary ---------------------------------------------------------------------------------


def summarize(events: Iterable[Event]) -> dict:
    """Counts and peaks of a trace.

    ``peak_requested_bytes``: the largest running sum where alloc adds its size and
    free_completed removes the size of the alloc seen at that address on that device (a free of
    an unseen address is counted in ``skipped_frees``). ``recorded_peak_reserved_bytes``: the
    largest running sum of segment_alloc + segment_map minus segment_free + segment_unmap, i.e.
    what the recording allocator held. Both are per device (``per_device``); the top-level peaks
    add the devices' peaks (each device is its own allocator).
    """
    actions: dict[str, int] = {}
    streams: set[int] = set()
    per_device: dict[int, _DevicePeaks] = {}
    count = 0
    for event in events:
        event = Event(*event)  # plain tuples are accepted too
        count += 1
        name = ACTION_NAMES.get(event.action, "other")
        actions[name] = actions.get(name, 0) + 1
        streams.add(event.stream)
        per_device.setdefault(event.device, _DevicePeaks()).add(event)
    devices = {device: peaks.as_dict() for device, peaks in sorted(per_device.items())}
    return {
        "events": count,
        "actions": dict(sorted(actions.items(), key=lambda item: ACTIONS.get(item[0], OTHER))),
        "devices": list(devices),
        "streams": sorted(streams),
        "peak_requested_bytes": sum(d["peak_requested_bytes"] for d in devices.values()),
        "recorded_peak_reserved_bytes": sum(
            d["recorded_peak_reserved_bytes"] for d in devices.values()
        ),
        "skipped_frees": sum(d["skipped_frees"] for d in devices.values()),
        "per_device": devices,
    }


class _DevicePeaks:
    """Running sums for one device."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}  # addr -> requested size
        self.requested = self.peak_requested = 0
        self.reserved = self.peak_reserved = 0
        self.skipped_frees = 0

    def add(self, event: Event) -> None:
        if event.action == ALLOC:
            # An address allocated twice without a free (ring-buffer damage) replaces the old one.
            self.requested += event.size - self.live.get(event.addr, 0)
            self.live[event.addr] = event.size
            self.peak_requested = max(self.peak_requested, self.requested)
        elif event.action == FREE_COMPLETED:
            size = self.live.pop(event.addr, None)
            if size is None:
                self.skipped_frees += 1
            else:
                self.requested -= size
        elif event.action in (SEGMENT_ALLOC, SEGMENT_MAP):
            self.reserved += event.size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        elif event.action in (SEGMENT_FREE, SEGMENT_UNMAP):
            self.reserved -= event.size

    def as_dict(self) -> dict:
        return {
            "peak_requested_bytes": self.peak_requested,
            "recorded_peak_reserved_bytes": self.peak_reserved,
            "skipped_frees": self.skipped_frees,
        }


def format_summary(path: str, fmt: str, summary: dict) -> str:
    """The human-readable report printed by ``info``."""
    lines = [f"file: {path}", f"format: {fmt}", f"events: {summary['events']}"]
    lines += [f"  {name}: {count}" for name, count in summary["actions"].items()]
    lines.append("devices: " + (", ".join(map(str, summary["devices"])) or "none"))
    lines.append("streams: " + (", ".join(hex(s) for s in summary["streams"]) or "none"))
    for key in ("peak_requested_bytes", "recorded_peak_reserved_bytes", "skipped_frees"):
        lines.append(f"{key}: {summary[key]}")
    if len(summary["devices"]) > 1:
        for device, figures in summary["per_device"].items():
            lines.append(f"device {device}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------

PROG = "cuarena-trace"
EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="write INPUT as a .cuat trace")
    convert.add_argument("input", help="PyTorch snapshot, RMM CSV or .cuat (optionally gzipped)")
    convert.add_argument("output", help="'-' for stdout; a name ending in .gz is gzipped")
    info = commands.add_parser("info", help="print event counts, devices, streams and peaks")
    info.add_argument("input")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def _load_for_cli(path: str) -> tuple[str, list[Event]]:
    """load_trace with every input problem turned into TraceError."""
    try:
        return load_trace(path)
    except TraceError:
        raise
    except OSError as e:
        raise TraceError(e.strerror or str(e)) from None
    except (ValueError, KeyError, TypeError, struct.error, RecursionError, MemoryError) as e:
        raise TraceError(f"unreadable input ({type(e).__name__}: {_clip(str(e))})") from None


def _convert(args: argparse.Namespace) -> None:
    _, events = _load_for_cli(args.input)
    try:
        save_cuat(events, args.output)
    except BrokenPipeError:
        raise  # the reader of stdout went away: main() stops quietly
    except OSError as e:
        raise _Failure(args.output, e.strerror or str(e)) from None
    except TraceError as e:
        raise _Failure(args.output, str(e)) from None


def _info(args: argparse.Namespace) -> None:
    fmt, events = _load_for_cli(args.input)
    summary = summarize(events)
    if args.json:
        sys.stdout.write(json.dumps({"file": args.input, "format": fmt, **summary}, indent=2))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_summary(args.input, fmt, summary))
    sys.stdout.flush()


class _Failure(Exception):
    """A problem to report against a path other than the input."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(problem)
        self.path = path


def _report(path: str, problem: str) -> int:
    one_line = " ".join(str(problem).split())
    sys.stderr.write(f"{PROG}: {path}: {one_line}\n")
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        {"convert": _convert, "info": _info}[args.command](args)
    except _Failure as e:
        return _report(e.path, str(e))
    except TraceError as e:
        return _report(args.input, str(e))
    except BrokenPipeError:
        # The reader went away (e.g. `| head`); stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
