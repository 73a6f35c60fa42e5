"""``python -m cuarena``: run a job under cuarena, or show how cuarena is installed."""

from __future__ import annotations

import os
import runpy
import sys

USAGE = """\
usage: python -m cuarena run [--config CONFIG] [--trace PATH] script.py [args...]
       python -m cuarena run [--config CONFIG] [--trace PATH] -m module [args...]
       python -m cuarena info
       python -m cuarena replay TRACE... [options]   (also: convert, config, steady-state)
       python -m cuarena top [--interval SECONDS] [--once [--json]]
       python -m cuarena --help

cuarena is a CUDA device-memory caching allocator that replaces PyTorch's.

run    Runs a Python script (or, with -m, a module) as __main__ with cuarena as PyTorch's CUDA
       allocator, with sys.argv set to the script and its args. Sets CUARENA=1 in the
       environment (unless CUARENA, CUARENA_CONF or PYTORCH_CUDA_ALLOC_CONF=backend:cuarena
       already asks for cuarena), so processes the job starts use cuarena too when cuarena is
       pip-installed. --config sets CUARENA_CONF (cuarena's configuration, key:value,...);
       --trace sets CUARENA_TRACE (records the allocation history to PATH at exit, for
       'cuarena replay PATH'; {pid} and {rank} in PATH are expanded).
info   Prints the package and library paths, the torch the library was built for, the
       installed torch, whether cuarena is enabled in this process (as the environment
       asks), cuarena's configuration keys and the environment variables that concern it,
       and whether the replayer is installed.
replay, convert, config
       Run the replayer (the 'cuarena' executable that pip install builds into the package
       when CLI11, nlohmann-json and zlib's headers are found) with the arguments unchanged:
       'replay' says from a memory snapshot (CUARENA_TRACE's) how much memory the job needs
       under cuarena and PyTorch's allocators, 'convert' keeps a trace as .cuat, 'config'
       lists cuarena's keys. 'python -m cuarena replay --help' shows its options.
steady-state
       Runs cuarena_steady_state: the driver calls and reserved memory per pass of a training
       loop built from a trace, on the simulator (--help shows its options).
top    A live monitor of every process of this user that runs cuarena, per GPU: reserved,
       allocated, cached and available memory, driver calls/s, OOMs, a history of reserved
       memory, and the GPU's total and used memory (NVML). --once prints one table (--json:
       one JSON document) and exits. 'python -m cuarena top --help' says more; the live screen
       needs textual (pip install textual).

Environment (read by the torch.backends entry point inside 'import torch' when cuarena is
pip-installed, or by 'run'):
  CUARENA=1                  enable cuarena (CUARENA=0 disables it whatever else is set)
  CUARENA_CONF=k:v,...       cuarena's configuration (and enable cuarena)
  PYTORCH_CUDA_ALLOC_CONF=backend:cuarena,k:v,...
                             enable cuarena the PyTorch way: cuarena's keys go to cuarena,
                             PyTorch's pinned-memory keys stay for PyTorch, keys that only
                             tune PyTorch's own allocator are dropped with a note
                             (PYTORCH_ALLOC_CONF likewise when PYTORCH_CUDA_ALLOC_CONF is unset)
  CUARENA_TRACE=PATH         record the process's allocation history to PATH
  CUARENA_TORCH_LIB=PATH     load libcuarena_torch.so from PATH instead of the package
  CUARENA_REPLAY_BIN=PATH    run the replayer at PATH instead of the package's
                             (CUARENA_STEADY_STATE_BIN likewise for steady-state)

In Python: cuarena.enable(config) before the first CUDA call; cuarena.record(path) as a
context manager around the part to record.
"""


def _fail(message: str, code: int = 1) -> int:
    print(f"cuarena: error: {message}", file=sys.stderr)
    return code


def _enable_from_environment() -> None:
    from ._errors import CuarenaError

    try:
        import torch  # noqa: F401 - runs the entry point when cuarena is pip-installed
    except RuntimeError as e:  # torch wraps what the entry point raised
        if isinstance(e.__cause__, CuarenaError):
            # torch is left half-imported: a second import of it fails in torch's own code.
            e.__cause__.torch_unusable = True
            raise e.__cause__ from None
        raise
    from . import _autoload

    _autoload.hook()  # a no-op when the entry point already ran it


def _config_source(message: str, given: bool) -> str:
    """An error about CUARENA_CONF, worded for --config when --config set it."""
    if given and message.startswith("CUARENA_CONF: "):
        return "--config: " + message[len("CUARENA_CONF: "):]
    return message


def run(argv: list[str]) -> int:
    from . import _autoload, _conf
    from ._errors import ConfigError, CuarenaError

    _autoload.raise_errors = True  # report here, naming --config where it set the value
    args = list(argv)
    config_given = False
    while args and args[0] in ("--config", "--trace"):
        if len(args) < 2:
            return _fail(f"{args[0]} needs a value", 2)
        os.environ["CUARENA_CONF" if args[0] == "--config" else "CUARENA_TRACE"] = args[1]
        config_given = config_given or args[0] == "--config"
        del args[:2]
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    module = None
    if args[0] == "-m":
        if len(args) < 2:
            return _fail("-m needs a module name", 2)
        module, args = args[1], args[2:]
        sys.path.insert(0, os.getcwd())
        try:
            import importlib.util

            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return _fail(f"no module named {module!r} (run -m looks in the current directory "
                         f"and on sys.path)", 2)
    else:
        script, args = args[0], args[1:]
        if not os.path.exists(script) or os.path.isdir(script):
            return _fail(f"no such script: {script}", 2)

    if _conf.requested(os.environ)[0] is None:
        os.environ["CUARENA"] = "1"
    try:
        _enable_from_environment()
    except ConfigError as e:
        return _fail(_config_source(str(e), config_given), 2)
    except CuarenaError as e:
        return _fail(str(e))
    from . import _api

    if not _api.is_enabled():
        return _fail("cuarena is not enabled (the environment selects another backend: "
                     f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')!r}, "
                     f"PYTORCH_ALLOC_CONF={os.environ.get('PYTORCH_ALLOC_CONF')!r})")

    if module is not None:
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` has it
        runpy.run_path(script, run_name="__main__")
    return 0


def info() -> int:
    from . import __version__, _api, _autoload, _lib, _tools
    from ._errors import CuarenaError

    _autoload.raise_errors = True
    print(f"cuarena {__version__} at {os.path.dirname(os.path.abspath(__file__))}")
    path = _lib.library_path()
    print(f"library: {path}{'' if path.is_file() else ' (missing)'}")
    replayer = _tools.replayer()
    print(f"replayer: {replayer}" if replayer else
          f"replayer: not installed ({_tools.executable('cuarena', 'CUARENA_REPLAY_BIN')} is "
          "missing; see python -m cuarena replay)")
    status = 0
    try:
        _enable_from_environment()
    except CuarenaError as e:
        print(f"enabling from the environment failed: {e}")
        if getattr(e, "torch_unusable", False):
            print("torch: its import stopped at that error; fix it and run info again")
            _print_environment()
            return 1
        status = 1
    except ImportError as e:
        print(f"torch: not importable ({e})")
        return 1
    import torch

    print(f"torch: {torch.__version__} at {os.path.dirname(torch.__file__)}")
    try:
        lib = _lib.load()
        print(f"built for torch: {lib.built_for()}")
        print(f"config keys: {', '.join(lib.config_keys())}")
        if lib.missing:
            print(f"pluggable entry points missing: {', '.join(lib.missing)}")
    except CuarenaError as e:
        print(f"library not loaded: {e}")
        status = 1
    enabled = _api.is_enabled()
    config = _api.enabled_config()
    print(f"enabled: {'yes' if enabled else 'no'}"
          + (f" (config {config!r})" if enabled and config else ""))
    _print_environment()
    return status


def _print_environment() -> None:
    for name in ("CUARENA", "CUARENA_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                 "CUARENA_TRACE", "CUARENA_TORCH_LIB", "CUARENA_REPLAY_BIN",
                 "CUARENA_STEADY_STATE_BIN", "CUARENA_PYTHON", "TORCH_DEVICE_BACKEND_AUTOLOAD"):
        if name in os.environ:
            print(f"{name}={os.environ[name]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "run":
        return run(argv[1:])
    if argv[0] == "info":
        if len(argv) > 1:
            return _fail(f"info takes no arguments, got {' '.join(argv[1:])}", 2)
        return info()
    if argv[0] == "top":
        from . import _top

        return _top.main(argv[1:])
    from . import _tools

    if argv[0] in _tools.COMMANDS:
        return _tools.run(argv[0], argv[1:])
    return _fail(f"unknown command {argv[0]!r}; see python -m cuarena --help", 2)


if __name__ == "__main__":
    sys.exit(main())
