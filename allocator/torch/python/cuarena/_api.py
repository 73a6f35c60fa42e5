"""The public functions: enable(), is_enabled(), memory_available(), config_keys(), ...

Nothing heavy is imported at module level: torch, ctypes and the library are
loaded on the first call that needs them, so ``import cuarena`` stays cheap (it runs inside
``import torch`` through the autoload hook).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Mapping, Union

from . import _conf
from ._errors import ConfigError, CuarenaError

Config = Union[str, Mapping[str, object], None]

_lock = threading.RLock()
_enabled: tuple[str, dict[str, str]] | None = None  # (config text, as_dict) of enable()

CUDA_INITIALISED = (
    "CUDA is already initialised, so PyTorch's allocator has served memory and cannot be "
    "swapped for cuarena. Call cuarena.enable() before anything initialises CUDA (the first "
    "CUDA tensor, torch.cuda.current_device(), set_device(), mem_get_info(), ...), or enable "
    "it from the environment before the job starts: CUARENA=1, or "
    "PYTORCH_CUDA_ALLOC_CONF=backend:cuarena (with cuarena pip-installed), or run the job "
    "with 'python -m cuarena run script.py'")


def config_string(config: Config) -> str:
    """The configuration string for `config`: a string as it is; a mapping as ``key:value``
    items in its order (bools as True/False); None as ``$CUARENA_CONF`` (or "" for cuarena's
    defaults). Raises :class:`ConfigError` for a value that is not str, int, float or bool, and
    TypeError for any other `config`."""
    if config is None:
        return os.environ.get("CUARENA_CONF", "")
    if isinstance(config, str):
        return config
    if isinstance(config, Mapping):
        parts = []
        for key, value in config.items():
            if not isinstance(key, str) or not key.strip():
                raise ConfigError(f"config key {key!r}: expected a non-empty string")
            if isinstance(value, bool):
                text = "True" if value else "False"
            elif isinstance(value, (int, float, str)):
                text = str(value)
            else:
                raise ConfigError(f"config[{key!r}] = {value!r}: expected a str, int, float or "
                                  f"bool")
            parts.append(f"{key}:{text}")
        return ",".join(parts)
    raise TypeError(f"config must be a str, a mapping or None, not {type(config).__name__}")


def _check_device(device: object) -> None:
    if device is None:
        return
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device must be an int (a CUDA device index) or None, not "
                        f"{type(device).__name__}")
    if device < 0:
        raise ValueError(f"device must be >= 0, got {device}")


def enable(config: Config = None, device: int | None = None) -> None:
    """Installs cuarena as PyTorch's CUDA allocator for every device of this process.

    `config`: a cuarena configuration string (``"stream_cache_bytes:0,upstream:async"``), a
    mapping ``{"stream_cache_bytes": 0}``, or None for ``$CUARENA_CONF`` (cuarena's defaults
    when unset); :func:`config_keys` lists the keys. `device` is accepted for symmetry with
    PyTorch's per-device calls and only validated (an int >= 0): cuarena serves every device.

    Must run before CUDA is initialised in this process. Calling it again with the same
    configuration (same keys and values, in any order) does nothing. Thread-safe.

    Raises :class:`CuarenaError` when CUDA is already initialised, when cuarena is enabled
    already with a different configuration (both are named), or when the library is missing or
    was built for another torch; :class:`ConfigError` for a bad configuration; TypeError or
    ValueError for a bad `device`.
    """
    global _enabled
    _check_device(device)
    text = config_string(config)
    wanted = _conf.as_dict(text, "config")
    from . import _lib

    with _lock:
        if _enabled is not None:
            if _enabled[1] == wanted:
                return
            raise CuarenaError(
                f"cuarena is already enabled with config {_enabled[0]!r}; enable() was called "
                f"again with {text!r}. The configuration of a running allocator cannot change: "
                f"pass the same one, or restart the process with the new one")
        import torch

        if torch.cuda.is_initialized():
            raise CuarenaError(CUDA_INITIALISED)
        lib = _lib.load()
        lib.check(text, "config")
        lib.install(text)
        _enabled = (text, wanted)


def is_enabled() -> bool:
    """True when cuarena is PyTorch's current CUDA allocator in this process. Never loads the
    library (False when it has not been loaded) and never raises for a missing library."""
    from . import _lib

    lib = _lib.loaded()
    return lib is not None and lib.is_installed()


def enabled_config() -> str | None:
    """The configuration string enable() installed cuarena with, or None."""
    with _lock:
        return None if _enabled is None else _enabled[0]


def _device_index(device: object) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"expected a CUDA device, got {device}")
        return device.index if device.index is not None else torch.cuda.current_device()
    _check_device(device)
    return int(device)  # type: ignore[arg-type]


def stats(device: object = None) -> dict[str, int]:
    """cuarena's statistics of `device`'s allocator: PyTorch's keys (as
    ``torch.cuda.memory_stats()`` has them, for the allocator ordinary allocations use) and
    cuarena's own, prefixed ``cuarena.``: driver calls (``cuarena.map_calls``, ...), granules
    moved, ``cuarena.memory_first`` (1 while the pool places memory-first: configured, or turned
    so when it ran short of memory, until an ``empty_cache()`` leaves it low),
    ``cuarena.loop_plans`` (and ``cuarena.plans_refused``: plans packed too far over their
    live peak to be used), ``cuarena.stream_waits`` (a planned block's stream made to wait on
    the device for another stream's free), stream-cache hits, and ``cuarena.sweep_polls`` /
    ``cuarena.sweep_polls_pending`` (how often a poll found the device still working on a
    stream's freed memory: how far the GPU runs behind the job's allocations), and
    ``cuarena.driver_us.<call>``: host microseconds spent in each driver call (``cuMemMap``,
    ``cuMemSetAccess``, ``cuEventRecord``, ...) since the device's first use.

    `device` as for :func:`memory_available`. Thread-safe. Raises :class:`CuarenaError` when
    cuarena is not installed or the library fails.
    """
    from . import _lib

    return _lib.load().stats(_device_index(device))


def memory_available(device: object = None) -> int:
    """Bytes a new allocation on `device` could get now: the device's free memory plus what
    cuarena caches and could release or reuse, within per_process_memory_fraction.

    `device`: a CUDA device index, a ``torch.device("cuda", i)``, or None for
    ``torch.cuda.current_device()`` (which initialises CUDA). Thread-safe. Raises
    :class:`CuarenaError` when the library fails (message included) or is missing.
    """
    from . import _lib

    return _lib.load().memory_available(_device_index(device))


def config_keys() -> list[str]:
    """cuarena's configuration keys (loads the library; :class:`CuarenaError` if missing)."""
    from . import _lib

    return _lib.load().config_keys()


def check_config(config: Config) -> None:
    """Parses a configuration without installing anything; :class:`ConfigError` (naming the
    key, its position and what was expected) when it is bad."""
    from . import _lib

    _lib.load().check(config_string(config), "config")


def library_path() -> Path:
    """Where cuarena's library is (or would be) loaded from: ``$CUARENA_TORCH_LIB`` if set,
    else ``lib/libcuarena_torch.so`` in this package."""
    from . import _lib

    return _lib.library_path()


def built_for() -> str:
    """The torch version cuarena's library was built against (loads the library)."""
    from . import _lib

    return _lib.load().built_for()
