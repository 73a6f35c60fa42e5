"""The ``torch.backends`` entry point: ``import torch`` calls :func:`hook` (torch runs every
entry point of that group at the end of its ``__init__``, before CUDA initialises; setting
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off).

cuarena is enabled when the environment asks for it:

- ``CUARENA=1``;
- ``CUARENA_CONF`` set and non-empty (cuarena's configuration);
- ``backend:cuarena`` in ``PYTORCH_CUDA_ALLOC_CONF`` or, when that is unset,
  ``PYTORCH_ALLOC_CONF`` (the variable PyTorch reads). cuarena's keys there go to cuarena,
  PyTorch keys that only tune PyTorch's own device allocator are dropped with a note, and the
  rest (pinned host memory settings) stay in the variable for PyTorch.

``CUARENA=0`` turns cuarena off whatever else is set. ``CUARENA_TRACE=path`` records the
process's allocation history to `path` (see :func:`cuarena.record`), with or without cuarena.

For anyone who asked for neither, the hook reads a few environment variables and returns:
it imports nothing (not torch's CUDA parts, not ctypes) and never raises. When cuarena was
asked for and cannot be enabled (bad configuration, missing library, torch mismatch), the
process ends inside ``import torch`` with one line on stderr naming the variable, the key
and its position (exit status 2): a job that asked for cuarena must not run on another
allocator. ``python -m cuarena`` sets :data:`raise_errors` to get the exception instead.
"""

from __future__ import annotations

import os
import sys

_done = False
# True: hook() raises CuarenaError instead of ending the process (python -m cuarena reports it).
raise_errors = False


def hook() -> None:
    """Enables cuarena and/or starts CUARENA_TRACE when the environment asks (see the module
    docstring). Runs once per process; later calls do nothing. Raises :class:`CuarenaError` /
    :class:`ConfigError` only when cuarena was asked for."""
    global _done
    if _done:
        return
    _done = True
    try:
        from . import _conf

        reason, notes = _conf.requested(os.environ)
        trace = os.environ.get("CUARENA_TRACE", "").strip()
    except Exception:  # noqa: BLE001 - never break `import torch` for someone who did not ask
        return
    for note in notes:
        print(note, file=sys.stderr)
    if reason is not None:
        try:
            activate()
        except Exception as e:  # noqa: BLE001 - one line, then exit: see the module docstring
            from ._errors import CuarenaError

            if raise_errors or not isinstance(e, CuarenaError):
                raise
            print(f"cuarena: {e} (asked for by {reason})", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            # Not SystemExit: exit handlers would run torch's parser over the bad value and
            # abort with a C++ backtrace (torch 2.9).
            os._exit(2)
    if trace:
        from . import _record

        _record.trace_process(trace)


def activate(environ=None) -> bool:
    """Enables cuarena as the environment asks: works out cuarena's configuration and what
    stays in PyTorch's variable (:func:`cuarena._conf.plan`), checks each source's values with
    the library (errors name the variable and position), calls :func:`cuarena.enable`, prints
    the notes and then rewrites the environment (`environ`, default ``os.environ``). Returns
    False when the environment selects another backend (backend:native)."""
    from . import _api, _conf, _lib

    environ = os.environ if environ is None else environ
    lib = _lib.load()
    plan = _conf.plan(environ, lib.config_keys())
    if not plan.active:
        return False
    for source, text in plan.checks:
        lib.check(text, source)
    _api.enable(plan.config)
    for note in plan.notes:
        print(note, file=sys.stderr)
    for name, value in plan.env.items():  # after enable(): a failure leaves them as they were
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return True
