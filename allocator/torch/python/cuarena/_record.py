"""Recording a job's allocation history as a PyTorch memory snapshot, which
``cuarena replay PATH`` replays (and pytorch.org/memory_viz shows).

Works with whichever CUDA allocator is installed (cuarena's or PyTorch's own), through
``torch.cuda.memory._record_memory_history`` / ``_snapshot``.
"""

from __future__ import annotations

import atexit
import gzip
import os
import pickle
import sys
import tempfile
import threading
from pathlib import Path

from ._errors import CuarenaError

# History entries kept (a ring buffer: a longer job keeps its last DEFAULT_MAX_ENTRIES events).
# Without stack traces an entry is about a hundred bytes of host memory while recording.
DEFAULT_MAX_ENTRIES = 10**8

_lock = threading.Lock()
_active: "list[Recording]" = []  # started and not stopped, in start order


def expand_path(path: str | os.PathLike) -> str:
    """`path` with ``{pid}`` replaced by the process id and ``{rank}`` by ``$RANK`` (else
    ``$LOCAL_RANK``, else 0), so that the processes of one job write separate files."""
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    return os.fspath(path).replace("{pid}", str(os.getpid())).replace("{rank}", rank)


def write_snapshot(path: str | os.PathLike) -> Path:
    """Writes ``torch.cuda.memory._snapshot()`` to `path` as a pickle (gzipped when the name
    ends in ``.gz``), atomically (a temporary file renamed into place). Returns the path."""
    import torch

    snapshot = torch.cuda.memory._snapshot()
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "wb") as raw:
            if target.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="wb") as f:
                    pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
            else:
                pickle.dump(snapshot, raw, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return target


class Recording:
    """One recording of the allocation history to a snapshot file; see :func:`record`."""

    def __init__(self, path: str | os.PathLike, max_entries: int = DEFAULT_MAX_ENTRIES,
                 stacks: bool = False):
        if max_entries <= 0:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        self.path = Path(expand_path(path))
        self.max_entries = int(max_entries)
        self.stacks = bool(stacks)
        self.started = False

    def start(self) -> "Recording":
        """Starts recording (initialises CUDA if it is not yet). Inside another recording of
        this process (PyTorch keeps one history per process) it records nothing new: the
        outermost recording's settings apply, and this one's snapshot, written at stop(), holds
        everything recorded since the outermost one started. Raises :class:`CuarenaError` when
        this recording is already started."""
        import torch

        # Initialise CUDA first, outside the lock: CUDA's lazy init runs queued calls, among
        # them CUARENA_TRACE's start(), which takes the lock too.
        torch.cuda.init()
        with _lock:
            if self.started:
                raise CuarenaError(f"the recording to {self.path} is already started")
            if not _active:
                if self.stacks:
                    torch.cuda.memory._record_memory_history(
                        "all", context="all", stacks="all", max_entries=self.max_entries)
                else:
                    torch.cuda.memory._record_memory_history(
                        "all", context=None, max_entries=self.max_entries)
            _active.append(self)
            self.started = True
        return self

    def stop(self) -> Path:
        """Writes the snapshot to the path and, unless another recording of this process is
        still going, stops recording (even if writing failed). Returns the path. Does nothing
        but return the path when not started."""
        import torch

        with _lock:
            if not self.started:
                return self.path
            try:
                write_snapshot(self.path)
            finally:
                self.started = False
                _active.remove(self)
                if not _active:
                    torch.cuda.memory._record_memory_history(None)
        return self.path

    def __enter__(self) -> "Recording":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def record(path: str | os.PathLike, max_entries: int = DEFAULT_MAX_ENTRIES,
           stacks: bool = False) -> Recording:
    """Records this process's CUDA allocation history into a snapshot at `path`::

        with cuarena.record("train.pickle.gz"):
            train()
        # then: cuarena replay train.pickle.gz

    Entering starts ``torch.cuda.memory._record_memory_history`` (keeping the last
    `max_entries` events; with ``stacks=True`` also Python and C++ stack traces, much slower
    and larger); leaving writes ``torch.cuda.memory._snapshot()`` to `path` (pickle, gzipped
    if it ends in ``.gz``; ``{pid}``/``{rank}`` in it are expanded) and stops recording. The
    returned object also has ``start()`` and ``stop()`` for use without ``with``. Recordings
    may nest (also inside ``CUARENA_TRACE``'s): an inner one's snapshot holds all that was
    recorded since the outermost one started. Entering initialises CUDA, so enable cuarena
    first. Thread-safe.
    """
    return Recording(path, max_entries, stacks)


_process_recording: Recording | None = None


def trace_process(path: str) -> None:
    """``CUARENA_TRACE=path``: records the whole process. The recording starts when CUDA
    initialises (queued with ``torch.cuda._lazy_call``, so that importing torch does not
    initialise CUDA) and the snapshot is written at exit. Failures are reported on stderr,
    never raised (they would otherwise break CUDA's initialisation or the exit)."""
    global _process_recording
    import torch

    if _process_recording is not None:
        return
    try:
        rec = _process_recording = Recording(path)
    except ValueError as e:
        print(f"cuarena: CUARENA_TRACE={path}: {e}", file=sys.stderr)
        return

    def start() -> None:
        try:
            rec.start()
        except Exception as e:  # noqa: BLE001 - reported, never raised into CUDA init
            print(f"cuarena: CUARENA_TRACE: could not start recording: {e}", file=sys.stderr)
            return
        atexit.register(_finish, rec)

    torch.cuda._lazy_call(start)


def _finish(rec: Recording) -> None:
    try:
        path = rec.stop()
    except Exception as e:  # noqa: BLE001 - at exit there is no caller to raise to
        print(f"cuarena: CUARENA_TRACE: could not write {rec.path}: {e}", file=sys.stderr)
        return
    print(f"cuarena: allocation history written to {path} (replay it with: cuarena replay "
          f"{path})", file=sys.stderr)
