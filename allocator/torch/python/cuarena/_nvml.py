"""The machine's GPUs as NVML sees them (through ``pynvml``, PyPI's nvidia-ml-py): total memory
and the memory every process on each uses. Without the binding, the driver or a GPU, there are
no GPUs and :attr:`Nvml.note` says why in one line; ``cuarena top`` then has only the pages.
"""

from __future__ import annotations

from dataclasses import dataclass

PAGES_ONLY = "devices come from the cuarena pages alone"


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index (nvidia-smi's numbering)
    uuid: str  # "GPU-...", as monitor pages name their device
    name: str
    total_bytes: int
    used_bytes: int  # by all processes on the GPU, cuarena's or not


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """NVML, initialised once (:meth:`open`) and shut down by :meth:`close`."""

    def __init__(self) -> None:
        self._nvml = None
        self.note: str | None = None  # why there are no GPUs, when there are none

    def open(self) -> "Nvml":
        try:
            import pynvml
        except ImportError:
            self.note = (f"NVML: the Python binding is not installed (pip install nvidia-ml-py); "
                         f"{PAGES_ONLY}")
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self.note = f"NVML: {e} (no NVIDIA driver or GPU here?); {PAGES_ONLY}"
            return self
        self._nvml = pynvml
        return self

    def gpus(self) -> list[Gpu]:
        """Each GPU's memory now; [] without NVML. A GPU NVML fails on is left out, and
        :attr:`note` says so."""
        nvml = self._nvml
        if nvml is None:
            return []
        self.note = None
        result = []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            self.note = f"NVML: cannot count GPUs ({e}); {PAGES_ONLY}"
            return []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                result.append(Gpu(index, _text(nvml.nvmlDeviceGetUUID(handle)),
                                  _text(nvml.nvmlDeviceGetName(handle)), int(memory.total),
                                  int(memory.used)))
            except nvml.NVMLError as e:
                self.note = f"NVML: GPU {index} left out ({e})"
        if not count:
            self.note = f"NVML: no GPU; {PAGES_ONLY}"
        return result

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None
