"""The replayer's commands under ``python -m cuarena``: ``replay``, ``convert`` and ``config`` run
the ``cuarena`` executable (tools/replay), ``steady-state`` runs ``cuarena_steady_state``, each
with the arguments unchanged, in place of this process (its exit status and standard streams are
theirs).

``pip install .`` builds them into the package (``cuarena/bin``) when CLI11, nlohmann-json and
zlib's headers are found, with the Python scripts they run (``cuarena/share``: the trace
converter and ``--report``'s drawing). ``$CUARENA_REPLAY_BIN`` and ``$CUARENA_STEADY_STATE_BIN``
name other executables (a CMake build's ``build/bin/...``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# python -m cuarena COMMAND -> (executable, the environment variable that overrides its path,
# whether COMMAND is passed on as the executable's own first argument)
COMMANDS = {
    "replay": ("cuarena", "CUARENA_REPLAY_BIN", True),
    "convert": ("cuarena", "CUARENA_REPLAY_BIN", True),
    "config": ("cuarena", "CUARENA_REPLAY_BIN", True),
    "steady-state": ("cuarena_steady_state", "CUARENA_STEADY_STATE_BIN", False),
}

NOT_BUILT = ("cuarena: error: {what} is not installed: this cuarena was built without CLI11, "
             "nlohmann-json or zlib's headers; install them (Debian/Ubuntu: apt-get install "
             "libcli11-dev nlohmann-json3-dev zlib1g-dev) and reinstall cuarena "
             "(python3 -m pip install .)")


def executable(name: str, env_var: str) -> Path:
    """Where the executable `name` is looked for (it may not exist)."""
    env = os.environ.get(env_var)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "bin" / name


def replayer() -> Path | None:
    """The replayer the package would run, or None when it is not installed."""
    path = executable("cuarena", "CUARENA_REPLAY_BIN")
    return path if _runnable(path) else None


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def run(command: str, argv: list[str]) -> int:
    """Runs `command` (a key of COMMANDS) with `argv` in place of this process; returns only
    when it cannot (the exit status for main())."""
    name, env_var, pass_command = COMMANDS[command]
    path = executable(name, env_var)
    if not _runnable(path):
        if os.environ.get(env_var):
            print(f"cuarena: error: {env_var}={path} is not an executable file", file=sys.stderr)
        else:
            what = "the replayer" if name == "cuarena" else name
            print(NOT_BUILT.format(what=what), file=sys.stderr)
        return 2
    # The scripts the executable runs (the trace converter, the report) need a Python; this one
    # has the package, and --report's matplotlib where the user installed it.
    os.environ.setdefault("CUARENA_PYTHON", sys.executable)
    # argv[0] is what the executable's usage line shows: the command as the user typed it.
    args = ["python -m cuarena" if pass_command else f"python -m cuarena {command}",
            *([command] if pass_command else []), *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, args)
    except OSError as e:
        print(f"cuarena: error: cannot run {path}: {e.strerror}", file=sys.stderr)
        return 2
    return 2  # not reached
