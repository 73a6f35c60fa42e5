"""The monitor page's format: how a cuarena process shows its memory to ``cuarena top``.

The layout is allocator/monitor/include/cuarena/monitor_page.hpp's ``MonitorPage``, field for
field (little-endian, naturally aligned, no padding); this module only decodes it. A page is
copied under its sequence lock (:func:`read_consistent`) and decoded (:func:`decode`) into a
:class:`Page`, which adds the figures derived from its fields.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from dataclasses import dataclass

MAGIC = b"CUARENAM"
VERSION = 1
PAGE_FILE_BYTES = 4096  # kMonitorPageBytes: the shared-memory object's size

# (field, struct code): MonitorPage in order. The offsets the header states are checked against
# these by tests/python/test_monitor.py, which parses the header.
FIELDS = [
    ("magic", "8s"),
    ("version", "I"),
    ("page_bytes", "I"),
    ("seq", "Q"),
    ("pid", "q"),
    ("device", "i"),
    ("kind", "I"),
    ("start_ns", "Q"),
    ("update_ns", "Q"),
    ("device_uuid", "48s"),
    ("command", "256s"),
    ("reserved_bytes", "q"),
    ("reserved_peak_bytes", "q"),
    ("allocated_bytes", "q"),
    ("allocated_peak_bytes", "q"),
    ("requested_bytes", "q"),
    ("requested_peak_bytes", "q"),
    ("active_bytes", "q"),
    ("reclaimable_bytes", "q"),
    ("largest_free_bytes", "q"),
    ("limit_bytes", "q"),
    ("available_bytes", "q"),
    ("device_total_bytes", "q"),
    ("driver_calls", "q"),
    ("num_ooms", "q"),
    ("num_alloc_retries", "q"),
    ("allocations", "q"),
    ("memory_first", "q"),
    ("spare", "75q"),
]
LAYOUT = struct.Struct("<" + "".join(code for _, code in FIELDS))
LAYOUT_BYTES = LAYOUT.size  # sizeof(MonitorPage) of version 1: 1096
SEQ_OFFSET = 16
OFFSETS = {}  # field -> byte offset, as the header's comments give them
_offset = 0
for _name, _code in FIELDS:
    OFFSETS[_name] = _offset
    _offset += struct.calcsize("<" + _code)
assert _offset == LAYOUT_BYTES == 1096, "MonitorPage is 1096 bytes (static_assert in the header)"

KINDS = {1: "torch", 2: "shim", 3: "replayer"}  # PageKind

# How often a reader copies a page whose writer is busy, and how long it waits between tries
# (the publisher rewrites a page in microseconds, a few times a second).
READ_ATTEMPTS = 50
READ_WAIT_S = 0.001


class FormatError(ValueError):
    """The bytes are not a page this reader knows: wrong magic, version or size."""


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass(frozen=True)
class Page:
    """One process's memory on one device, as its monitor page had it (every field of
    ``MonitorPage`` but ``spare``; sizes in bytes, times in ns since the Unix epoch)."""

    magic: str
    version: int
    page_bytes: int
    seq: int
    pid: int
    device: int
    kind: int
    start_ns: int
    update_ns: int
    device_uuid: str  # "GPU-..." as NVML has it; "" for a simulated device
    command: str
    reserved_bytes: int
    reserved_peak_bytes: int
    allocated_bytes: int
    allocated_peak_bytes: int
    requested_bytes: int
    requested_peak_bytes: int
    active_bytes: int
    reclaimable_bytes: int
    largest_free_bytes: int
    limit_bytes: int
    available_bytes: int  # -1: the publisher cannot tell
    device_total_bytes: int
    driver_calls: int
    num_ooms: int
    num_alloc_retries: int
    allocations: int
    memory_first: int

    @property
    def kind_name(self) -> str:
        """``torch``, ``shim`` or ``replayer`` (``kind N`` for a kind of a later version)."""
        return KINDS.get(self.kind, f"kind {self.kind}")

    @property
    def simulated(self) -> bool:
        """True for the replayer's simulated device (no device UUID)."""
        return not self.device_uuid

    @property
    def cached_bytes(self) -> int:
        """Reserved memory not under a live allocation: reserved - allocated."""
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def reserved_per_requested(self) -> float | None:
        """reserved / requested (what the pool holds per byte the job asked for; 1.0 is
        perfect), or None while nothing is requested."""
        return self.reserved_bytes / self.requested_bytes if self.requested_bytes > 0 else None

    @property
    def available(self) -> int | None:
        """available_bytes, or None where the publisher cannot tell (-1)."""
        return self.available_bytes if self.available_bytes >= 0 else None

    def age_s(self, now_ns: int | None = None) -> float:
        """Seconds since the publisher last rewrote the page."""
        now = time.time_ns() if now_ns is None else now_ns
        return max(0.0, (now - self.update_ns) / 1e9)

    def as_dict(self) -> dict:
        """The fields and the derived figures, for JSON."""
        d = dataclasses.asdict(self)
        d.update(kind_name=self.kind_name, simulated=self.simulated,
                 cached_bytes=self.cached_bytes,
                 reserved_per_requested=self.reserved_per_requested)
        return d


def read_consistent(buffer, attempts: int = READ_ATTEMPTS,
                    wait_s: float = READ_WAIT_S) -> bytes | None:
    """A copy of the page in `buffer` (an mmap, or any buffer) taken under its sequence lock:
    kept only if ``seq`` was even and the same before and after the copy, else copied again, up
    to `attempts` times. None when the writer never let go (a page left odd by a process that
    died while writing it, or a writer much slower than ours)."""
    for attempt in range(attempts):
        (before,) = struct.unpack_from("<Q", buffer, SEQ_OFFSET)
        if not before & 1:
            data = bytes(buffer[:LAYOUT_BYTES])
            (after,) = struct.unpack_from("<Q", buffer, SEQ_OFFSET)
            if after == before:
                return data
        if attempt + 1 < attempts:
            time.sleep(wait_s)
    return None


def decode(data: bytes) -> Page:
    """The :class:`Page` in `data` (a consistent copy). Raises :class:`FormatError` for a magic,
    version or page size this reader does not know."""
    if len(data) < LAYOUT_BYTES:
        raise FormatError(f"{len(data)} bytes, a page has {LAYOUT_BYTES}")
    values = LAYOUT.unpack_from(data)
    fields = dict(zip((name for name, _ in FIELDS[:-1]), values))  # spare's 75 are the rest
    if fields["magic"] != MAGIC:
        raise FormatError(f"magic {fields['magic']!r}, not {MAGIC!r}")
    if fields["version"] != VERSION:
        raise FormatError(f"version {fields['version']} (this reader knows {VERSION}: a newer "
                          f"cuarena wrote it?)")
    if fields["page_bytes"] != LAYOUT_BYTES:
        raise FormatError(f"page_bytes {fields['page_bytes']}, version {VERSION} has "
                          f"{LAYOUT_BYTES}")
    fields["magic"] = MAGIC.decode()
    fields["device_uuid"] = _text(fields["device_uuid"])
    fields["command"] = _text(fields["command"])
    return Page(**fields)
