"""Finds and loads libcuarena_torch.so (the C API of cuarena/torch_c_api.h) through ctypes.

The library is ``$CUARENA_TORCH_LIB`` when that is set (a CMake build's
``build/lib/libcuarena_torch.so``), else ``cuarena/lib/libcuarena_torch.so`` inside this
package (where ``pip install .`` puts it). It links against torch's libc10, so torch is
imported first; then the torch it was built for is checked against the one imported, by
major.minor (the allocator interface's vtable changes between minor versions).

Every function of the C API gets its argtypes/restype here; a non-zero return becomes a
:class:`CuarenaError` (or :class:`ConfigError` for a configuration) carrying the library's
message. Loading is thread-safe and happens once per process.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from ._conf import minor_version
from ._errors import ConfigError, CuarenaError

LIB_ENV = "CUARENA_TORCH_LIB"
LIB_NAME = "libcuarena_torch.so"
_ERRLEN = 4096

_c_int, _c_char_p, _c_size_t = ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t
_c_void_p, _c_ull = ctypes.c_void_p, ctypes.c_ulonglong
_ssize_t = ctypes.c_ssize_t

# name -> (restype, argtypes), as declared in cuarena/torch_c_api.h.
SIGNATURES = {
    "cuarena_torch_install": (_c_int, [_c_char_p, _c_char_p, _c_size_t]),
    "cuarena_torch_is_installed": (_c_int, []),
    "cuarena_torch_built_for": (_c_char_p, []),
    "cuarena_config_check": (_c_int, [_c_char_p, _c_char_p, _c_size_t]),
    "cuarena_config_keys": (_c_char_p, []),
    "cuarena_memory_available": (ctypes.c_int64, [_c_int, _c_char_p, _c_size_t]),
    "cuarena_stats": (ctypes.c_int64, [_c_int, _c_char_p, _c_size_t, _c_char_p, _c_size_t]),
}
# The pluggable ABI (torch.cuda.memory.CUDAPluggableAllocator calls these, not Python); typed
# here as well, but a library without them still loads.
PLUGGABLE_SIGNATURES = {
    "cuarena_malloc": (_c_void_p, [_ssize_t, _c_int, _c_void_p]),
    "cuarena_free": (None, [_c_void_p, _ssize_t, _c_int, _c_void_p]),
    "cuarena_init": (None, [_c_int]),
    "cuarena_reset": (None, []),
    "cuarena_set_memory_fraction": (None, [ctypes.c_double, _c_int]),
    "cuarena_base_alloc": (_c_void_p, [_c_void_p, ctypes.POINTER(_c_size_t)]),
    "cuarena_record_stream": (None, [_c_void_p, _c_void_p]),
    "cuarena_end_allocate_to_pool": (None, [_c_int, _c_ull, _c_ull]),
    "cuarena_release_pool": (None, [_c_int, _c_ull, _c_ull]),
}

_lock = threading.Lock()
_loaded: "Library | None" = None


def library_path() -> Path:
    """Where the library is looked for (it may not exist)."""
    env = os.environ.get(LIB_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "lib" / LIB_NAME


class Library:
    """The loaded library: typed wrappers over its C functions."""

    def __init__(self, path: Path, dll: ctypes.CDLL):
        self.path = path
        self._dll = dll
        for name, (restype, argtypes) in SIGNATURES.items():
            try:
                fn = getattr(dll, name)
            except AttributeError:
                raise CuarenaError(
                    f"{path} does not export {name}: it is not a libcuarena_torch.so of this "
                    f"cuarena version; reinstall cuarena (pip install .)") from None
            fn.restype, fn.argtypes = restype, argtypes
        self.missing = []  # pluggable entry points the library lacks
        for name, (restype, argtypes) in PLUGGABLE_SIGNATURES.items():
            fn = getattr(dll, name, None)
            if fn is None:
                self.missing.append(name)
            else:
                fn.restype, fn.argtypes = restype, argtypes

    def built_for(self) -> str:
        """The torch version the library was built against, e.g. "2.11.0+cu130"."""
        return (self._dll.cuarena_torch_built_for() or b"").decode()

    def config_keys(self) -> list[str]:
        """cuarena's configuration keys."""
        text = (self._dll.cuarena_config_keys() or b"").decode()
        return [key.strip() for key in text.split(",") if key.strip()]

    def check(self, config: str, source: str | None = None) -> None:
        """Parses `config` without installing anything; :class:`ConfigError` if it is bad, its
        message prefixed with `source` (where the text came from) when given."""
        err = ctypes.create_string_buffer(_ERRLEN)
        if self._dll.cuarena_config_check(config.encode(), err, _ERRLEN) != 0:
            message = _message(err, "invalid configuration")
            raise ConfigError(f"{source}: {message}" if source else message)

    def install(self, config: str) -> None:
        """Installs cuarena as PyTorch's CUDA allocator; :class:`CuarenaError` on failure."""
        err = ctypes.create_string_buffer(_ERRLEN)
        if self._dll.cuarena_torch_install(config.encode(), err, _ERRLEN) != 0:
            raise CuarenaError(_message(err, "cuarena_torch_install failed"))

    def is_installed(self) -> bool:
        return self._dll.cuarena_torch_is_installed() != 0

    def memory_available(self, device: int) -> int:
        err = ctypes.create_string_buffer(_ERRLEN)
        value = self._dll.cuarena_memory_available(device, err, _ERRLEN)
        if value < 0:
            raise CuarenaError(_message(err, f"cuarena_memory_available({device}) failed"))
        return value


    def stats(self, device: int) -> dict[str, int]:
        err = ctypes.create_string_buffer(_ERRLEN)
        size = 1 << 14
        while True:  # the C side says how long the text is: grow once if it did not fit
            buf = ctypes.create_string_buffer(size)
            n = self._dll.cuarena_stats(device, buf, size, err, _ERRLEN)
            if n < 0:
                raise CuarenaError(_message(err, f"cuarena_stats({device}) failed"))
            if n < size:
                break
            size = n + 1
        out = {}
        for line in buf.value.decode().splitlines():
            key, value = line.rsplit(" ", 1)
            out[key] = int(value)
        return out


def _message(err: ctypes.Array, fallback: str) -> str:
    text = err.value.decode(errors="replace").strip()
    return text or fallback


def loaded() -> Library | None:
    """The library if it has been loaded in this process, else None (never loads it)."""
    return _loaded


def load() -> Library:
    """Loads the library once (importing torch first) and returns it.

    Raises :class:`CuarenaError` when it is missing, cannot be loaded, or was built for another
    torch minor version.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        import torch  # the library needs torch's libc10 loaded

        path = library_path()
        if not path.is_file():
            named = f" (named by ${LIB_ENV})" if os.environ.get(LIB_ENV) else ""
            raise CuarenaError(
                f"cuarena's library is missing: {path}{named} does not exist; install cuarena with "
                f"'pip install .' from its repository (it builds the library against the "
                f"installed torch), or set {LIB_ENV} to a built {LIB_NAME}")
        _check_built_for(path, torch.__version__)
        try:
            dll = ctypes.CDLL(str(path))
        except OSError as e:
            raise CuarenaError(
                f"cannot load {path}: {e}; if torch was upgraded since cuarena was built, "
                f"reinstall cuarena (pip install .) against this torch") from e
        lib = Library(path, dll)
        built = lib.built_for()
        have = torch.__version__
        if minor_version(built) is None or minor_version(built) != minor_version(have):
            raise _mismatch(built, have)
        _loaded = lib
        return lib


def _mismatch(built: str, have: str) -> CuarenaError:
    b = minor_version(built)
    shown = f"{b[0]}.{b[1]}" if b else repr(built)
    return CuarenaError(f"cuarena was built for torch {shown} but torch {have} is installed; "
                        f"reinstall cuarena (pip install .) against this torch")


def _check_built_for(path: Path, have: str) -> None:
    """Refuses a library whose side file (written by the build) names another torch minor,
    before loading it: such a library may fail to load with a linker message instead."""
    try:
        built = (path.parent / (path.name + ".torch")).read_text().strip()
    except OSError:
        return  # no side file (a build tree, or CUARENA_TORCH_LIB): the library says itself
    if minor_version(built) != minor_version(have):
        raise _mismatch(built, have)


def _reset_for_tests() -> None:
    """Forgets the loaded library (tests load stub libraries one after another)."""
    global _loaded
    with _lock:
        _loaded = None
