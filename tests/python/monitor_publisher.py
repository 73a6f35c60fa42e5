"""A monitor page publisher in Python, for the tests of ``cuarena top``: writes a page exactly as
allocator/monitor/include/cuarena/monitor_page.hpp lays it out (each field at the offset the
header states, written here independently of the reader's struct), under its sequence lock.

As a program, it publishes a page for its own pid until killed (or --seconds pass):

    python monitor_publisher.py DIR [--reserved BYTES] [--allocated BYTES] [--kind N]
                                    [--uuid GPU-...] [--seconds S]

rewriting it every 0.2 s: 100 more driver calls each time, reserved memory climbing 200 KiB a
time for 4 s (to 3.8 MiB above --reserved), then back. It prints "ready" once the first page
is written.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import struct
import sys
import time
from pathlib import Path

MAGIC = b"CUARENAM"
VERSION = 1
PAGE_FILE_BYTES = 4096
PAGE_BYTES = 1096

# field: (offset, struct code), as the header's comments give them
FIELDS = {
    "magic": (0, "8s"),
    "version": (8, "I"),
    "page_bytes": (12, "I"),
    "seq": (16, "Q"),
    "pid": (24, "q"),
    "device": (32, "i"),
    "kind": (36, "I"),
    "start_ns": (40, "Q"),
    "update_ns": (48, "Q"),
    "device_uuid": (56, "48s"),
    "command": (104, "256s"),
    "reserved_bytes": (360, "q"),
    "reserved_peak_bytes": (368, "q"),
    "allocated_bytes": (376, "q"),
    "allocated_peak_bytes": (384, "q"),
    "requested_bytes": (392, "q"),
    "requested_peak_bytes": (400, "q"),
    "active_bytes": (408, "q"),
    "reclaimable_bytes": (416, "q"),
    "largest_free_bytes": (424, "q"),
    "limit_bytes": (432, "q"),
    "available_bytes": (440, "q"),
    "device_total_bytes": (448, "q"),
    "driver_calls": (456, "q"),
    "num_ooms": (464, "q"),
    "num_alloc_retries": (472, "q"),
    "allocations": (480, "q"),
    "memory_first": (488, "q"),
}
GiB = 1 << 30
MiB = 1 << 20


def defaults(pid: int, device: int) -> dict:
    now = time.time_ns()
    return {
        "magic": MAGIC, "version": VERSION, "page_bytes": PAGE_BYTES, "pid": pid,
        "device": device, "kind": 1, "start_ns": now, "update_ns": now, "device_uuid": "",
        "command": "python train.py --model gpt2",
        "reserved_bytes": 3 * GiB + 512 * MiB, "reserved_peak_bytes": 4 * GiB,
        "allocated_bytes": 3 * GiB, "allocated_peak_bytes": 3 * GiB + 768 * MiB,
        "requested_bytes": 3 * GiB - 10 * MiB, "requested_peak_bytes": 3 * GiB + 700 * MiB,
        "active_bytes": 3 * GiB, "reclaimable_bytes": 400 * MiB, "largest_free_bytes": 256 * MiB,
        "limit_bytes": 140 * GiB, "available_bytes": 130 * GiB, "device_total_bytes": 140 * GiB,
        "driver_calls": 1000, "num_ooms": 0, "num_alloc_retries": 0, "allocations": 5000,
        "memory_first": 0,
    }


def page_name(pid: int, device: int, uid: int | None = None) -> str:
    return f"cuarena.{os.getuid() if uid is None else uid}.{pid}.{device}"


class Publisher:
    """One page, `directory`/cuarena.<uid>.<pid>.<device>, mode 0600, 4096 bytes."""

    def __init__(self, directory, pid: int | None = None, device: int = 0, name: str | None = None,
                 **fields) -> None:
        pid = os.getpid() if pid is None else pid
        self.path = Path(directory) / (name or page_name(pid, device))
        self.fields = defaults(pid, device)
        self.fields.update(fields)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, PAGE_FILE_BYTES)
            self.map = mmap.mmap(fd, PAGE_FILE_BYTES)
        finally:
            os.close(fd)
        self.seq = 0
        self.begin()  # the fields as given (update_ns too)
        self.finish()

    def _put(self, name: str, value) -> None:
        offset, code = FIELDS[name]
        if isinstance(value, str):
            value = value.encode()
        struct.pack_into("<" + code, self.map, offset, value)

    def begin(self, **changes) -> None:
        """Starts a rewrite: seq odd, then the changed fields (the page is torn until
        :meth:`finish`)."""
        self.seq += 1
        self._put("seq", self.seq)
        self.fields.update(changes)
        for name, value in changes.items():
            self._put(name, value)

    def finish(self) -> None:
        """Writes every field and makes seq even again."""
        for name, value in self.fields.items():
            if name != "seq":
                self._put(name, value)
        self.seq += 1
        self._put("seq", self.seq)

    def write(self, **changes) -> None:
        """One whole rewrite under the sequence lock (update_ns now, unless given)."""
        changes.setdefault("update_ns", time.time_ns())
        self.begin(**changes)
        self.finish()

    def close(self, remove: bool = True) -> None:
        self.map.close()
        if remove:
            self.path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--reserved", type=int, default=3 * GiB + 512 * MiB)
    parser.add_argument("--allocated", type=int, default=3 * GiB)
    parser.add_argument("--kind", type=int, default=1)
    parser.add_argument("--uuid", default="")
    parser.add_argument("--seconds", type=float, default=120)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    page = Publisher(args.directory, kind=args.kind, device_uuid=args.uuid,
                     reserved_bytes=args.reserved, allocated_bytes=args.allocated,
                     active_bytes=args.allocated,
                     command=" ".join([os.path.basename(sys.executable), *sys.argv]))
    print("ready", flush=True)
    try:
        end = time.monotonic() + args.seconds
        step = 0
        while time.monotonic() < end:
            time.sleep(0.2)
            step += 1
            page.write(driver_calls=page.fields["driver_calls"] + 100,
                       reserved_bytes=args.reserved + (step % 20) * 200 * 1024)
    finally:
        page.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
