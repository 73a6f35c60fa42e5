"""What every process that runs cuarena on this machine holds, read from their monitor pages
(``python -m cuarena top`` shows it live).

Each such process (the PyTorch drop-in, the LD_PRELOAD shim, ``cuarena replay --publish``)
publishes a page per device in ``/dev/shm`` (format: monitor_page.hpp). Only the current user's
pages are read (they are mode 0600). A page whose process is gone is removed; a page whose
process lives but has not rewritten it for :data:`STALE_AFTER_S` seconds (stopped, or stuck) is
kept and marked ``stale`` (``top`` greys it, its driver calls/s is unknown). NVML
(nvidia-ml-py's ``pynvml``) gives each GPU's total memory and what all its processes use,
matched to pages by device UUID; without it, or without a GPU, devices come from the pages
alone (a replayer's simulated device has no UUID) and the sample's ``notes`` say why.

    import cuarena.monitor

    for p in cuarena.monitor.processes():          # one look
        print(p.page.pid, p.page.command, p.page.reserved_bytes)

    with cuarena.monitor.Monitor() as m:           # repeated looks: rates and history
        while True:
            sample = m.sample()                    # .devices, .processes, .notes
            time.sleep(1)

Sizes are in bytes; nothing here imports torch or needs CUDA.
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field

from . import _monitor_scan
from ._monitor_page import Page
from ._monitor_scan import Skipped, scan
from ._nvml import Gpu, Nvml

__all__ = ["Device", "Monitor", "Page", "Process", "Sample", "Skipped", "STALE_AFTER_S",
           "processes", "scan"]

STALE_AFTER_S = 10.0  # a page not rewritten for longer is stale (publishers rewrite it ~4/s)
HISTORY = 120  # samples of reserved memory kept per process (two minutes at one a second)


@dataclass(frozen=True)
class Device:
    """A GPU (from NVML, or from the pages alone) or a replayer's simulated device."""

    key: str  # the device UUID, or "sim:<pid>:<device>" for a simulated device
    label: str  # "GPU 0", "GPU-1234abcd", "simulated device 0 of pid 123"
    uuid: str
    index: int | None  # NVML's index; None for a device NVML does not show
    name: str  # NVML's name of the GPU; "" otherwise
    total_bytes: int  # from NVML, else the largest device_total_bytes of its pages
    used_bytes: int | None  # by all processes, from NVML; None without NVML
    source: str  # "nvml" or "pages"


@dataclass(frozen=True)
class Process:
    """A cuarena process on one device: its page, and what repeated samples tell."""

    page: Page
    device_key: str  # Device.key of the device it is on (page.device is its ordinal)
    stale: bool  # the page has not been rewritten for STALE_AFTER_S
    age_s: float  # seconds since it was rewritten
    driver_calls_per_s: float | None  # None on the first sample of it, or while stale
    reserved_history: tuple[int, ...]  # reserved_bytes at each sample, oldest first

    def as_dict(self) -> dict:
        """Every field of the page, the derived figures, and this sample's."""
        d = self.page.as_dict()
        d.update(device_key=self.device_key, stale=self.stale, age_s=round(self.age_s, 3),
                 driver_calls_per_s=self.driver_calls_per_s,
                 reserved_history=list(self.reserved_history))
        return d


@dataclass(frozen=True)
class Sample:
    """One look at the machine."""

    time_ns: int
    devices: list[Device]
    processes: list[Process]
    notes: list[str] = field(default_factory=list)  # one line each: NVML, ignored pages
    skipped: list[Skipped] = field(default_factory=list)

    def on(self, device: Device) -> list[Process]:
        return [p for p in self.processes if p.device_key == device.key]

    def as_dict(self) -> dict:
        return {"time_ns": self.time_ns,
                "devices": [vars(d).copy() for d in self.devices],
                "processes": [p.as_dict() for p in self.processes],
                "notes": list(self.notes)}


def _device_key(page: Page) -> str:
    return page.device_uuid or f"sim:{page.pid}:{page.device}"


def devices(gpus: list[Gpu], pages: list[Page]) -> list[Device]:
    """NVML's GPUs (in its order), then the devices only pages name, then simulated ones."""
    result = [Device(g.uuid, f"GPU {g.index}", g.uuid, g.index, g.name, g.total_bytes,
                     g.used_bytes, "nvml") for g in gpus]
    known = {g.uuid for g in gpus}
    totals: dict[str, int] = {}
    for page in pages:
        key = _device_key(page)
        if key not in known:
            totals[key] = max(totals.get(key, 0), page.device_total_bytes)
    others = sorted((k for k in totals if not k.startswith("sim:")))
    simulated = sorted((k for k in totals if k.startswith("sim:")),
                       key=lambda k: tuple(int(x) for x in k.split(":")[1:]))
    for key in others:
        result.append(Device(key, key[:12], key, None, "", totals[key], None, "pages"))
    for key in simulated:
        _, pid, device = key.split(":")
        result.append(Device(key, f"simulated device {device} of pid {pid}", "", None, "",
                             totals[key], None, "pages"))
    return result


@dataclass
class _Track:
    update_ns: int
    driver_calls: int
    rate: float | None
    history: collections.deque


class Monitor:
    """Samples the pages (and NVML) again and again, keeping what one look cannot tell: driver
    calls per second (between the page's last two rewrites seen) and a history of reserved
    memory per process (`history` samples). Close it (or use it as a context manager) to shut
    NVML down.

    `directory`: where the pages are (default $CUARENA_MONITOR_DIR, else /dev/shm); `nvml`:
    False leaves NVML out (devices from the pages alone)."""

    def __init__(self, directory: str | os.PathLike | None = None, nvml: bool = True,
                 history: int = HISTORY, stale_after_s: float = STALE_AFTER_S) -> None:
        self.directory = _monitor_scan.page_dir(directory)
        self.stale_after_s = stale_after_s
        self._history = history
        self._tracks: dict[tuple[int, int, int], _Track] = {}
        self._nvml = Nvml().open() if nvml else None

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()

    def sample(self) -> Sample:
        """Reads every page now (removing those of processes that are gone) and NVML."""
        found = scan(self.directory)
        gpus = self._nvml.gpus() if self._nvml is not None else []
        now = time.time_ns()
        notes = [self._nvml.note] if self._nvml is not None and self._nvml.note else []
        notes += [f"{s.path.name} ignored: {s.reason}" for s in found.skipped]
        tracks = {}
        result = []
        for page in found.pages:
            key = (page.pid, page.device, page.start_ns)
            track = self._tracks.get(key)
            if track is None:
                track = _Track(page.update_ns, page.driver_calls, None,
                               collections.deque(maxlen=self._history))
            elif page.update_ns > track.update_ns:
                track.rate = ((page.driver_calls - track.driver_calls) * 1e9
                              / (page.update_ns - track.update_ns))
                track.update_ns, track.driver_calls = page.update_ns, page.driver_calls
            track.history.append(page.reserved_bytes)
            tracks[key] = track
            age = page.age_s(now)
            stale = age > self.stale_after_s
            result.append(Process(page, _device_key(page), stale, age,
                                  None if stale else track.rate, tuple(track.history)))
        self._tracks = tracks  # processes gone are forgotten
        return Sample(now, devices(gpus, found.pages), result, notes, found.skipped)


def processes(directory: str | os.PathLike | None = None) -> list[Process]:
    """Every cuarena process of this user now, one per device it uses (one look: no driver
    calls per second; :class:`Monitor` samples repeatedly). Needs no NVML."""
    with Monitor(directory, nvml=False) as m:
        return m.sample().processes
