"""Finding and reading the monitor pages of this user's processes.

Each process that runs cuarena keeps ``/dev/shm/cuarena.<uid>.<pid>.<device>`` (see
_monitor_page.py for the format). :func:`scan` reads every page of the current user, skips
(saying why) a page it cannot use, and removes the pages of processes that are gone: the pid no
longer exists (``kill(pid, 0)`` fails with ESRCH), is another user's now (EPERM), or belongs to
a process that started after the page's publisher did (the pid was reused).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import _monitor_page
from ._monitor_page import FormatError, Page

# Where pages are looked for. CUARENA_MONITOR_DIR names another folder (tests use one of their
# own); publishers always use /dev/shm (shm_open).
DEFAULT_DIR = "/dev/shm"
DIR_ENV = "CUARENA_MONITOR_DIR"

# A process may have started this long after its page says it began publishing, and still be
# the publisher: the kernel's boot time is in whole seconds and the clock may have been stepped.
START_SLACK_S = 2.0


@dataclass
class Skipped:
    """A page that was not used, and why (one line)."""

    path: Path
    reason: str


@dataclass
class Scan:
    """What one pass over the pages found."""

    pages: list[Page] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)  # pages of processes that are gone


def page_dir(directory: str | os.PathLike | None = None) -> Path:
    """The folder pages are read from: `directory`, else $CUARENA_MONITOR_DIR, else /dev/shm."""
    return Path(directory or os.environ.get(DIR_ENV) or DEFAULT_DIR)


def page_path(pid: int, device: int, directory: str | os.PathLike | None = None,
              uid: int | None = None) -> Path:
    """Where the process `pid` keeps its page for `device`."""
    return page_dir(directory) / f"cuarena.{os.getuid() if uid is None else uid}.{pid}.{device}"


def _pid_state(pid: int) -> str:
    """'alive', 'gone' (no such process), or 'other' (a process of another user has the pid
    now: this user's publisher is gone too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "other"
    return "alive"


def _boot_time_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def process_start_s(pid: int) -> float | None:
    """When the process `pid` started, in seconds since the Unix epoch (from /proc), or None
    where /proc cannot tell."""
    boot = _boot_time_s()
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command may hold spaces and parentheses
    if boot is None or len(fields) < 20:
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks


def _remove(path: Path, scan: Scan) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass  # another reader removed it first
    except OSError as e:
        scan.skipped.append(Skipped(path, f"its process is gone, and removing it failed: "
                                          f"{e.strerror}"))
        return
    scan.removed.append(path)


def _read(path: Path) -> bytes | None:
    """A consistent copy of the page at `path`; None if it is not there or not written yet
    (size 0 while the publisher creates it). Raises FormatError for a short file, OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        stat = os.fstat(fd)
        if stat.st_uid != os.getuid():  # /dev/shm is everyone's: a page of ours is ours
            raise FormatError(f"owned by uid {stat.st_uid}, not by this user")
        size = stat.st_size
        if size == 0:
            return None
        if size < _monitor_page.LAYOUT_BYTES:
            raise FormatError(f"{size} bytes, a page has {_monitor_page.PAGE_FILE_BYTES}")
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            data = _monitor_page.read_consistent(m)
    finally:
        os.close(fd)
    if data is None:
        raise FormatError(f"always being written ({_monitor_page.READ_ATTEMPTS} tries): its "
                          f"writer died while writing it, or is stuck")
    return data


def scan(directory: str | os.PathLike | None = None, remove_dead: bool = True) -> Scan:
    """Reads every page of the current user in `directory` (see :func:`page_dir`). Pages of
    processes that are gone are removed (with `remove_dead`) and listed in ``removed``; pages
    with an unknown magic, version or size, or whose name and contents disagree, are listed in
    ``skipped`` with the reason. Never raises for a page."""
    result = Scan()
    folder = page_dir(directory)
    uid = os.getuid()
    pattern = re.compile(rf"cuarena\.{uid}\.(\d+)\.(\d+)")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return result  # no folder: no pages
    for name in names:
        match = pattern.fullmatch(name)
        if not match:
            continue
        path = folder / name
        pid, device = int(match[1]), int(match[2])
        state = _pid_state(pid)
        if state != "alive":
            if remove_dead:
                _remove(path, result)
            continue
        data = None
        try:
            data = _read(path)
            if data is None:
                continue
            page = _monitor_page.decode(data)
        except FormatError as e:
            if data is not None and not data[:8].strip(b"\0"):
                continue  # created, not written yet
            result.skipped.append(Skipped(path, str(e)))
            continue
        except OSError as e:
            if e.errno != errno.ENOENT:  # removed while we looked: nothing to say
                result.skipped.append(Skipped(path, e.strerror or str(e)))
            continue
        if (page.pid, page.device) != (pid, device):
            result.skipped.append(Skipped(path, f"holds pid {page.pid} device {page.device}, "
                                                f"its name says pid {pid} device {device}"))
            continue
        started = process_start_s(pid)
        if started is not None and started > page.start_ns / 1e9 + START_SLACK_S:
            if remove_dead:  # the pid was reused: the publisher is gone
                _remove(path, result)
            continue
        result.pages.append(page)
    return result
