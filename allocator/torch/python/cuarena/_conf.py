"""Allocator configuration strings: cuarena's (``CUARENA_CONF``) and PyTorch's
(``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``), and how the two are combined when
cuarena is asked for through PyTorch's variable (``backend:cuarena``).

Pure Python with no torch import, so it runs (and is tested) anywhere. Nothing here reads or
writes ``os.environ`` itself: :func:`plan` takes a mapping and returns the changes to make.

Both syntaxes are ``key:value,key:value``; a value may be a bracketed list containing commas
(``roundup_power2_divisions:[256:1,512:2,>:4]``). Whitespace around items, keys and values is
ignored and empty items are skipped. Positions in error messages are 0-based character indices
of the key in the text it came from, as in cuarena's C++ parser.

What the library answers and what stays here: cuarena's keys come from the library
(``cuarena_config_keys``, passed to :func:`plan` as `cuarena_keys`) and every value is checked by
its parser (``cuarena_config_check``, on each of :attr:`Plan.checks`), so nothing here knows a
cuarena key's type or range. Kept here: :func:`split` (the same tokenizer as the C++
``parse_config``) and the per-minor PyTorch key lists, because :func:`plan` must sort the items
of PyTorch's variable into cuarena's, PyTorch's and no-effect ones and rewrite that variable for
the installed torch minor before PyTorch reads it, and it must run (and be tested) without the
library built or loaded.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping

from ._errors import ConfigError

# The torch minors (2.x) cuarena supports, as in the top-level CMakeLists.txt.
OLDEST_MINOR = 8
NEWEST_MINOR = 15

# The variables PyTorch's CUDA allocator reads its settings from, in the order it tries them,
# by torch minor. Checked with each minor's own parser (tests/python/test_package.py checks
# the installed torch): from 2.10 the first one *present in the environment* is used, even when
# empty, and the other is ignored; 2.8 and 2.9 read PYTORCH_CUDA_ALLOC_CONF only (2.9's generic
# parser reads PYTORCH_ALLOC_CONF but nothing in it reaches the CUDA allocator).
def torch_vars(minor: int | None = None) -> tuple[str, ...]:
    """The variables torch 2.`minor` (default: the installed one) reads, in its order."""
    minor = installed_minor() if minor is None else minor
    if minor >= 10:
        return ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    return ("PYTORCH_CUDA_ALLOC_CONF",)


# Every variable any supported minor reads (for notes about the ones a minor ignores).
ALL_TORCH_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

# PyTorch's allocator keys and the first minor whose parser accepts each (any other key is an
# error there). Probed with each minor's wheel through torch._C's allocator-settings call; the
# installed torch is checked by tests/python/test_package.py.
TORCH_KEYS_SINCE = {
    "backend": 8,
    "expandable_segments": 8,
    "garbage_collection_threshold": 8,
    "max_non_split_rounding_mb": 8,
    "max_split_size_mb": 8,
    "pinned_num_register_threads": 8,
    "pinned_use_background_threads": 8,
    "pinned_use_cuda_host_register": 8,
    "pinned_use_hip_host_register": 8,
    "release_lock_on_cudamalloc": 8,
    "release_lock_on_hipmalloc": 8,
    "roundup_power2_divisions": 8,
    "graph_capture_record_stream_reuse": 9,
    "per_process_memory_fraction": 10,
    "pinned_reserve_segment_size_mb": 10,
    "large_segment_size_mb": 11,
    "pinned_free_catch_all": 12,
    "throw_on_cudamalloc_oom": 12,
    "pinned_max_cached_size_mb": 13,
    "pinned_max_round_threshold_mb": 13,
    "expandable_segments_reserve": 15,
    "expandable_segments_reserve_by_class": 15,
}


def torch_keys(minor: int | None = None) -> tuple[str, ...]:
    """The keys torch 2.`minor`'s parser accepts (default: the installed torch's), sorted."""
    minor = installed_minor() if minor is None else minor
    return tuple(sorted(k for k, since in TORCH_KEYS_SINCE.items() if since <= minor))


def installed_minor() -> int:
    """The minor version of the torch in this process (or installed, if not imported yet),
    without importing torch; NEWEST_MINOR when neither can be told."""
    import sys

    version = getattr(sys.modules.get("torch"), "__version__", None)
    if not isinstance(version, str):
        try:
            from importlib import metadata

            version = metadata.version("torch")
        except Exception:  # noqa: BLE001 - no torch distribution: the newest rules
            return NEWEST_MINOR
    return minor_of(version) or NEWEST_MINOR


def minor_version(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as "2.11.0+cu130", or None."""
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def minor_of(version: str) -> int | None:
    """x of a "2.x..." version string, or None."""
    mm = minor_version(version)
    return mm[1] if mm is not None and mm[0] == 2 else None


_GRANULES = ("cuarena releases cached memory before any out-of-memory error and maps memory "
             "in 2 MiB granules, so it has no")
_REPLACED = "it tunes PyTorch's native CUDA allocator, which cuarena replaces"
_OWN_VA = "cuarena reserves its own address space (its key va_reserve)"

# PyTorch keys that only tune PyTorch's own device allocator: under cuarena they are taken out
# of PyTorch's variable with one note each (PyTorch would accept and then silently ignore them).
NO_EFFECT = {
    "max_split_size_mb": f"{_GRANULES} split limit to configure",
    "expandable_segments_reserve": _OWN_VA,
    "expandable_segments_reserve_by_class": _OWN_VA,
    "roundup_power2_divisions": f"{_GRANULES} rounding policy to configure",
    "max_non_split_rounding_mb": f"{_GRANULES} rounding policy to configure",
    "expandable_segments": f"{_GRANULES} segment expansion to configure",
    "large_segment_size_mb": f"{_GRANULES} segment size to configure",
    "garbage_collection_threshold": f"{_GRANULES} garbage-collection threshold to configure",
    "release_lock_on_cudamalloc": _REPLACED,
    "release_lock_on_hipmalloc": _REPLACED,
    "graph_capture_record_stream_reuse": _REPLACED,
}

# The remaining PyTorch keys stay in PyTorch's variable: pinned host memory (PyTorch's host
# allocator still serves it) and throw_on_cudamalloc_oom, which cuarena reads from PyTorch's
# parsed settings (a request beyond free device memory plus cuarena's cache is refused before
# any reclaim). `per_process_memory_fraction` is also a cuarena key and goes to cuarena:
# whatever is in cuarena's key list is cuarena's.

BACKEND_NATIVE = ("native", "cudaMallocAsync")
# The LD_PRELOAD shim's own CUARENA_CONF keys (shim/README.md): named as such when given here.
SHIM_KEYS = ("memory_limit", "pending_free_bytes", "snug_factor", "serve_shareable")
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Item:
    """One ``key:value`` item of a configuration string."""

    key: str  # stripped
    value: str  # stripped
    position: int  # 0-based index of the key's first character in the text
    text: str  # the item as written, stripped ("key:value" with its inner spacing)
    start: int  # index of text[0] in the whole string
    end: int  # index just past the item's text


def split(text: str, source: str = "config") -> list[Item]:
    """Splits ``key:value,key:value`` into items; commas inside ``[...]`` do not split.

    Raises :class:`ConfigError` (naming `source` and the position) for an unbalanced bracket or
    an item without a colon. Keys are not checked here.
    """
    items: list[Item] = []
    i, n = 0, len(text)
    while i < n:
        start, depth = i, 0
        while i < n and (text[i] != "," or depth > 0):
            if text[i] == "[":
                depth += 1
            elif text[i] == "]":
                depth -= 1
                if depth < 0:
                    raise ConfigError(f"{source}: unbalanced ']' at position {i} in {text!r}")
            i += 1
        if depth:
            raise ConfigError(f"{source}: unbalanced '[' (no closing ']') in item at position "
                              f"{start} in {text!r}")
        raw = text[start:i]
        i += 1  # the comma
        stripped = raw.strip()
        if not stripped:
            continue
        lead = start + (len(raw) - len(raw.lstrip()))
        key, colon, value = stripped.partition(":")
        if not colon:
            raise ConfigError(f"{source}: expected key:value at position {lead}, got "
                              f"{stripped!r} in {text!r}")
        items.append(Item(key.strip(), value.strip(), lead, stripped, lead, lead + len(stripped)))
    return items


def as_dict(text: str, source: str = "config") -> dict[str, str]:
    """``{key: value}`` of a configuration string, a later duplicate key winning (as in
    cuarena's parser). Used to compare two configurations regardless of order and spacing."""
    return {item.key: item.value for item in split(text, source)}


def to_string(config: Mapping[str, str]) -> str:
    """The configuration string of ``{key: value}`` (insertion order)."""
    return ",".join(f"{key}:{value}" for key, value in config.items())


def torch_var(environ: Mapping[str, str], minor: int | None = None) -> str | None:
    """The variable torch 2.`minor` (default: the installed one) will read its allocator
    settings from, or None when it reads none of those set."""
    for name in torch_vars(minor):
        if name in environ:
            return name
    return None


_BACKEND_CUARENA = re.compile(r"(?:^|,)\s*backend\s*:\s*cuarena\s*(?:,|$)")


def _backend(text: str, source: str) -> Item | None:
    """The last ``backend`` item of a PyTorch string (the one PyTorch's parser keeps)."""
    found = None
    for item in split(text, source):
        if item.key == "backend":
            found = item
    return found


def requested(environ: Mapping[str, str],
              minor: int | None = None) -> tuple[str | None, list[str]]:
    """Whether the environment asks for cuarena, cheaply and without raising.

    Returns ``(reason, notes)``: `reason` names what asked (``"CUARENA=1"``, ``"CUARENA_CONF"``
    or ``"PYTORCH_CUDA_ALLOC_CONF=...backend:cuarena"``) or is None; `notes` are lines for
    stderr (a ``backend:cuarena`` in a variable torch 2.`minor` ignores). ``CUARENA=0`` (or
    false, no, off) turns cuarena off whatever else is set. A value of ``CUARENA`` that is
    neither on nor off, or a malformed PyTorch variable that names ``backend:cuarena``, counts
    as a request, so that :func:`plan` reports it. Imports nothing unless a PyTorch variable
    names cuarena (then the installed torch's minor is looked up, when `minor` is None).
    """
    notes: list[str] = []
    flag = environ.get("CUARENA", "").strip().lower()
    if "CUARENA" in environ and flag in _OFF and flag != "":
        return None, notes
    if flag:
        return f"CUARENA={environ['CUARENA']}", notes
    if environ.get("CUARENA_CONF", "").strip():
        return "CUARENA_CONF", notes
    for name in ALL_TORCH_VARS:
        if name not in environ:
            continue
        try:
            backend = _backend(environ[name], name)
            asks = backend is not None and backend.value == "cuarena"
        except ConfigError:
            # malformed: a request for cuarena all the same if it says so, for plan() to report
            asks = _BACKEND_CUARENA.search(environ[name]) is not None
        if not asks:
            continue
        minor = installed_minor() if minor is None else minor
        var = torch_var(environ, minor)
        if name == var:
            return f"{name}=...backend:cuarena", notes
        if name in torch_vars(minor):
            notes.append(f"cuarena: {name} asks for backend:cuarena but is ignored: PyTorch reads "
                         f"{var} when both are set (put backend:cuarena there)")
        else:
            notes.append(f"cuarena: {name} asks for backend:cuarena but torch 2.{minor} does not "
                         f"read {name} (use PYTORCH_CUDA_ALLOC_CONF)")
    return None, notes


@dataclasses.dataclass
class Plan:
    """What to do for a request for cuarena (see :func:`plan`)."""

    active: bool  # False: leave everything as it is (e.g. backend:native)
    config: str = ""  # cuarena's configuration string, merged
    env: dict[str, str | None] = dataclasses.field(default_factory=dict)  # None: delete
    notes: list[str] = dataclasses.field(default_factory=list)  # lines for stderr
    # (source, text) for cuarena_config_check: each source's cuarena items, at their positions
    # in that source (the other items blanked out), so a bad value is reported where it is.
    checks: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def suggestion(key: str, valid: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the closest valid key, or ""."""
    import difflib

    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(item: Item, source: str, cuarena_keys: Iterable[str], minor: int) -> ConfigError:
    cuarena_keys = sorted(cuarena_keys)
    keys = torch_keys(minor)
    return ConfigError(
        f"{source}: unknown key {item.key!r} at position {item.position}"
        f"{suggestion(item.key, [*cuarena_keys, *keys])}; valid keys are cuarena's "
        f"({', '.join(cuarena_keys)}) and torch 2.{minor}'s ({', '.join(keys)})")


def _masked(text: str, items: list[Item]) -> str:
    """`text` with everything outside `items` blanked to spaces, top-level commas kept."""
    out = [" "] * len(text)
    for item in items:
        out[item.start:item.end] = text[item.start:item.end]
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out[i] = ","
    return "".join(out)


def plan(environ: Mapping[str, str], cuarena_keys: Iterable[str],
         minor: int | None = None) -> Plan:
    """Works out how to honour a request for cuarena (:func:`requested` said yes).

    - ``CUARENA`` must be on or off (1/0, true/false, yes/no, on/off).
    - ``CUARENA_CONF``'s keys must be cuarena's.
    - PyTorch's variable (the one PyTorch reads, :func:`torch_var`): ``backend:cuarena`` and
      every cuarena key go to cuarena (``per_process_memory_fraction`` included); the PyTorch
      keys in :data:`NO_EFFECT` are dropped with one note each; every other PyTorch key stays
      for PyTorch; any other key is a :class:`ConfigError`. ``backend:native`` or
      ``backend:cudaMallocAsync`` there means cuarena is not wanted: an inactive plan, or a
      :class:`ConfigError` when ``CUARENA``/``CUARENA_CONF`` asks for cuarena too.
    - cuarena's configuration is the PyTorch variable's cuarena items, then ``CUARENA_CONF``'s
      (which win on the same key, with a note).
    - The environment is rewritten so that PyTorch sees only its own keys (the variable is
      deleted when nothing is left, or set empty when the other variable is set, so that
      PyTorch does not fall back to it), and so that child processes ask for the same
      cuarena: ``CUARENA=1`` and ``CUARENA_CONF=<merged config>``.

    PyTorch's variables and keys are those of torch 2.`minor` (default: the installed torch).
    Raises :class:`ConfigError` naming the variable, the key and its position.
    """
    minor = installed_minor() if minor is None else minor
    known_torch = torch_keys(minor)
    cuarena_keys = list(cuarena_keys)
    known = set(cuarena_keys)
    out = Plan(active=True)

    flag = environ.get("CUARENA", "").strip().lower()
    if flag not in _ON + _OFF:
        raise ConfigError(f"CUARENA={environ['CUARENA']!r}: expected 1 to enable cuarena or 0 "
                          f"to disable it")
    asked_directly = flag in _ON or bool(environ.get("CUARENA_CONF", "").strip())

    merged: dict[str, str] = {}
    origin: dict[str, str] = {}
    var = torch_var(environ, minor)
    if var is not None:
        text = environ[var]
        backend = _backend(text, var)
        if backend is not None and backend.value != "cuarena":
            if backend.value not in BACKEND_NATIVE:
                raise ConfigError(f"{var}: unknown backend {backend.value!r} at position "
                                  f"{backend.position}; expected cuarena, native or "
                                  f"cudaMallocAsync")
            if asked_directly:
                raise ConfigError(
                    f"{var} selects backend:{backend.value} but CUARENA/CUARENA_CONF asks for "
                    f"cuarena: remove one of them")
            return Plan(active=False)
        keep: list[Item] = []
        mine: list[Item] = []
        for item in split(text, var):
            if item.key == "backend":
                continue
            if item.key in known:
                mine.append(item)
            elif item.key in NO_EFFECT:
                out.notes.append(f"cuarena: {item.key} has no effect: {NO_EFFECT[item.key]}")
            elif item.key in known_torch:
                keep.append(item)
            else:
                raise _unknown(item, var, cuarena_keys, minor)
        for item in mine:
            merged[item.key] = item.value
            origin[item.key] = var
        if mine:
            out.checks.append((var, _masked(text, mine)))
        kept = ",".join(item.text for item in keep)
        if kept != text:
            other = [name for name in torch_vars(minor) if name != var and name in environ]
            out.env[var] = kept if kept or other else None
        for name in torch_vars(minor):
            if name != var and name in environ and environ[name] != text:
                out.notes.append(f"cuarena: {name} is ignored: PyTorch reads {var} when both "
                                 f"are set")

    conf = environ.get("CUARENA_CONF", "")
    if conf.strip():
        items = split(conf, "CUARENA_CONF")
        for item in items:
            if item.key not in known:
                hint = suggestion(item.key, known) or (
                    " (a key of the LD_PRELOAD shim's, not of the PyTorch drop-in's)"
                    if item.key in SHIM_KEYS else "")
                raise ConfigError(f"CUARENA_CONF: unknown key {item.key!r} at position "
                                  f"{item.position}{hint}; valid keys: "
                                  f"{', '.join(sorted(known))}")
            if item.key in origin and merged[item.key] != item.value:
                out.notes.append(f"cuarena: {item.key}: CUARENA_CONF's {item.value} overrides "
                                 f"{origin[item.key]}'s {merged[item.key]}")
            merged[item.key] = item.value
            origin[item.key] = "CUARENA_CONF"
        out.checks.append(("CUARENA_CONF", conf))

    out.config = to_string(merged)
    if environ.get("CUARENA") != "1":
        out.env["CUARENA"] = "1"
    if out.config and environ.get("CUARENA_CONF") != out.config:
        out.env["CUARENA_CONF"] = out.config
    return out
