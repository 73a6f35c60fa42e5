"""What ``cuarena top`` shows, as text: its columns, their sort orders, sizes, and a device's
header line. Both the live app (_top_app.py) and ``--once``'s table (_top.py) use these; neither
this module nor monitor.py needs textual or rich.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .monitor import Device, Process, Sample

UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def size(n: int | None) -> str:
    """`n` bytes in binary units, three significant digits: 512 B, 1.50 KiB, 12.3 MiB, 140 GiB;
    "?" for None."""
    if n is None:
        return "?"
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    unit = ""
    for unit in UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == UNITS[-1]:
            break
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {unit}"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _calls(p: Process) -> str:
    """Driver calls/s; for a stale page, how long it has not been rewritten instead."""
    return f"stale {p.age_s:.0f} s" if p.stale else _rate(p.driver_calls_per_s)


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    text: Callable[[Process], str]
    order: Callable[[Process], object]  # what rows sort by
    width: int  # cells, so that the tables of all devices line up (room for the sort mark)
    descending: bool = True  # the usual order: largest first, but for names
    numeric: bool = True  # right-justified


def _or_minus(value):
    return -1 if value is None else value


COLUMNS = [
    Column("pid", "pid", lambda p: str(p.page.pid), lambda p: p.page.pid, 7, False),
    Column("command", "command", lambda p: p.page.command, lambda p: p.page.command, 30, False,
           False),
    Column("kind", "kind", lambda p: p.page.kind_name, lambda p: p.page.kind_name, 8, False,
           False),
    Column("reserved", "reserved", lambda p: size(p.page.reserved_bytes),
           lambda p: p.page.reserved_bytes, 10),
    Column("allocated", "allocated", lambda p: size(p.page.allocated_bytes),
           lambda p: p.page.allocated_bytes, 11),
    Column("cached", "cached/reclaimable",
           lambda p: f"{size(p.page.cached_bytes)}/{size(p.page.reclaimable_bytes)}",
           lambda p: p.page.reclaimable_bytes, 20),
    Column("available", "available", lambda p: size(p.page.available),
           lambda p: _or_minus(p.page.available), 11),
    Column("ratio", "res/req", lambda p: _ratio(p.page.reserved_per_requested),
           lambda p: _or_minus(p.page.reserved_per_requested), 9),
    Column("largest", "largest free", lambda p: size(p.page.largest_free_bytes),
           lambda p: p.page.largest_free_bytes, 14),
    Column("calls", "driver calls/s", _calls, lambda p: _or_minus(p.driver_calls_per_s), 16),
    Column("ooms", "OOMs", lambda p: str(p.page.num_ooms), lambda p: p.page.num_ooms, 6),
]
HISTORY_TITLE = "reserved history"
HISTORY_WIDTH = 20
DEFAULT_SORT = "reserved"


def column(key: str) -> Column:
    for c in COLUMNS:
        if c.key == key:
            return c
    raise KeyError(f"no column {key!r}; columns: {', '.join(c.key for c in COLUMNS)}")


def title(c: Column, sort_key: str) -> str:
    """The column's heading, marked when rows sort by it."""
    if c.key != sort_key:
        return c.title
    return f"{c.title} {'▼' if c.descending else '▲'}"


def sorted_rows(processes: list[Process], sort_key: str) -> list[Process]:
    c = column(sort_key)
    return sorted(processes, key=lambda p: (c.order(p), -p.page.pid if c.descending else
                                            p.page.pid), reverse=c.descending)


def device_line(device: Device, sample: Sample, number: int | None = None) -> str:
    """One line about a device: what it has (NVML's total and what every process uses, or
    what the pages say) and what cuarena's processes on it reserve."""
    on = sample.on(device)
    reserved = sum(p.page.reserved_bytes for p in on)
    parts = [f"[{number}] {device.label}" if number is not None else device.label]
    if device.name:
        parts.append(device.name)
    if device.source == "nvml":
        parts.append(f"total {size(device.total_bytes)}, used {size(device.used_bytes)} by all "
                     f"processes")
    elif device.uuid:
        parts.append(f"total {size(device.total_bytes)} (its pages say; NVML does not show it)")
    else:
        parts.append(f"capacity {size(device.total_bytes)} (simulated)")
    count = f"{len(on)} process{'' if len(on) == 1 else 'es'}"
    parts.append(f"cuarena: {count}, {size(reserved)} reserved" if on else "no cuarena process")
    return "  ".join(parts)
