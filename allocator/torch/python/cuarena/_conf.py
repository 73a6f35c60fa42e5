"""Allocator configuration strings: cuarena's (``CUARENA_CONF``) and PyTorch's
(``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``), and how the two are combined when
cuarena is asked for through PyTorch's variable (``backend:cuarena``).

Pure Python with no torch import, so it runs (and is tested) anywhere. Nothing here reads or
writes ``os.environ`` itself: :func:`plan` takes a mapping and returns the changes to make.

Both syntaxes are ``key:value,key:value``; a value may be a bracketed list containing commas
(``roundup_power2_divisions:[256:1,512:2,>:4]``). Whitespace around items, keys and values is
ignored and empty items are skipped. Positions in error messages are 0-based character indices
of the key in the text it came from, as in cuarena's C++ parser.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from ._errors import ConfigError

# The variables PyTorch reads its allocator settings from, in the order it tries them. Checked
# on torch 2.11.0 (c10/cuda/CUDAAllocatorConfig.h and AcceleratorAllocatorConfig, both): the
# first one *present in the environment* is used, even when empty; the other is ignored.
TORCH_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

# Keys PyTorch 2.11's parsers accept (AcceleratorAllocatorConfig::getKeys() and
# CUDAAllocatorConfig::getKeys() in the wheel's c10 headers); any other key is an error there.
TORCH_KEYS = (
    "backend",
    "expandable_segments",
    "garbage_collection_threshold",
    "graph_capture_record_stream_reuse",
    "large_segment_size_mb",
    "max_non_split_rounding_mb",
    "max_split_size_mb",
    "per_process_memory_fraction",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_use_background_threads",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "roundup_power2_divisions",
)

_GRANULES = ("cuarena releases cached memory before any out-of-memory error and maps memory "
             "in 2 MiB granules, so it has no")
_REPLACED = "it tunes PyTorch's native CUDA allocator, which cuarena replaces"

# PyTorch keys that only tune PyTorch's own device allocator: under cuarena they are taken out
# of PyTorch's variable with one note each (PyTorch would accept and then silently ignore them).
NO_EFFECT = {
    "max_split_size_mb": f"{_GRANULES} split limit to configure",
    "roundup_power2_divisions": f"{_GRANULES} rounding policy to configure",
    "max_non_split_rounding_mb": f"{_GRANULES} rounding policy to configure",
    "expandable_segments": f"{_GRANULES} segment expansion to configure",
    "large_segment_size_mb": f"{_GRANULES} segment size to configure",
    "garbage_collection_threshold": f"{_GRANULES} garbage-collection threshold to configure",
    "release_lock_on_cudamalloc": _REPLACED,
    "release_lock_on_hipmalloc": _REPLACED,
    "graph_capture_record_stream_reuse": _REPLACED,
}

# The remaining PyTorch keys (pinned host memory, which PyTorch's host allocator still serves)
# stay in PyTorch's variable. `per_process_memory_fraction` is also a cuarena key and goes to
# cuarena: whatever is in cuarena's key list is cuarena's.

BACKEND_NATIVE = ("native", "cudaMallocAsync")
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


def torch_var(environ: Mapping[str, str]) -> str | None:
    """The variable PyTorch will read its allocator settings from, or None when neither is set."""
    for name in TORCH_VARS:
        if name in environ:
            return name
    return None


def _backend(text: str, source: str) -> Item | None:
    """The last ``backend`` item of a PyTorch string (the one PyTorch's parser keeps)."""
    found = None
    for item in split(text, source):
        if item.key == "backend":
            found = item
    return found


def requested(environ: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """Whether the environment asks for cuarena, cheaply and without raising.

    Returns ``(reason, notes)``: `reason` names what asked (``"CUARENA=1"``, ``"CUARENA_CONF"``
    or ``"PYTORCH_CUDA_ALLOC_CONF=...backend:cuarena"``) or is None; `notes` are lines for
    stderr (a ``backend:cuarena`` in the variable PyTorch ignores). ``CUARENA=0`` (or false,
    no, off) turns cuarena off whatever else is set. A value of ``CUARENA`` that is neither on
    nor off counts as a request, so that :func:`plan` reports it.
    """
    notes: list[str] = []
    flag = environ.get("CUARENA", "").strip().lower()
    if "CUARENA" in environ and flag in _OFF and flag != "":
        return None, notes
    if flag:
        return f"CUARENA={environ['CUARENA']}", notes
    if environ.get("CUARENA_CONF", "").strip():
        return "CUARENA_CONF", notes
    var = torch_var(environ)
    for name in TORCH_VARS:
        if name not in environ:
            continue
        try:
            backend = _backend(environ[name], name)
        except ConfigError:
            backend = None  # malformed: PyTorch's own parser will say so at CUDA init
        if backend is None or backend.value != "cuarena":
            continue
        if name == var:
            return f"{name}=...backend:cuarena", notes
        notes.append(f"cuarena: {name} asks for backend:cuarena but is ignored: PyTorch reads "
                     f"{var} when both are set (put backend:cuarena there)")
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


def _unknown(item: Item, source: str, cuarena_keys: Iterable[str]) -> ConfigError:
    return ConfigError(
        f"{source}: unknown key {item.key!r} at position {item.position}; valid keys are "
        f"cuarena's ({', '.join(sorted(cuarena_keys))}) and PyTorch's "
        f"({', '.join(TORCH_KEYS)})")


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


def plan(environ: Mapping[str, str], cuarena_keys: Iterable[str]) -> Plan:
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

    Raises :class:`ConfigError` naming the variable, the key and its position.
    """
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
    var = torch_var(environ)
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
            elif item.key in TORCH_KEYS:
                keep.append(item)
            else:
                raise _unknown(item, var, cuarena_keys)
        for item in mine:
            merged[item.key] = item.value
            origin[item.key] = var
        if mine:
            out.checks.append((var, _masked(text, mine)))
        kept = ",".join(item.text for item in keep)
        if kept != text:
            other = [name for name in TORCH_VARS if name != var and name in environ]
            out.env[var] = kept if kept or other else None
        for name in TORCH_VARS:
            if name != var and name in environ and environ[name] != text:
                out.notes.append(f"cuarena: {name} is ignored: PyTorch reads {var} when both "
                                 f"are set")

    conf = environ.get("CUARENA_CONF", "")
    if conf.strip():
        items = split(conf, "CUARENA_CONF")
        for item in items:
            if item.key not in known:
                raise ConfigError(f"CUARENA_CONF: unknown key {item.key!r} at position "
                                  f"{item.position}; valid keys: {', '.join(sorted(known))}")
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
