"""`python -m cuarena replay|convert|config|steady-state`: the package runs the replayer that
`pip install .` built into it (cuarena/bin), or says in one line what to install.

The package is copied into a temporary directory per test, so that its bin/ holds exactly what
the test puts there: a fake executable (a shell script that prints its arguments, standard input
and environment and exits 7), the real replayer when one is built ($CUARENA_CLI, which CTest
sets, else build/bin/cuarena), or nothing. Neither torch nor a GPU is needed, but for `info`.
"""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from test_package import PACKAGE_ROOT, REPO, clean_env, needs_torch

FAKE = """#!/bin/sh
for a in "$@"; do printf 'arg:%s\\n' "$a"; done
printf 'python:%s\\n' "$CUARENA_PYTHON"
printf 'stdin:%s\\n' "$(cat)"
echo "fake on stderr" >&2
exit 7
"""
INSTALL_HINT = "libcli11-dev nlohmann-json3-dev zlib1g-dev"


@pytest.fixture
def package(tmp_path):
    """A copy of the package (no bin/); returns the directory to put on PYTHONPATH."""
    root = tmp_path / "site"
    shutil.copytree(PACKAGE_ROOT / "cuarena", root / "cuarena",
                    ignore=shutil.ignore_patterns("__pycache__", "bin", "lib", "share"))
    return root


def env_for(root, **extra):
    env = clean_env(**extra)
    env["PYTHONPATH"] = str(root)
    for name in ("CUARENA_REPLAY_BIN", "CUARENA_STEADY_STATE_BIN", "CUARENA_PYTHON"):
        if name not in extra:
            env.pop(name, None)
    return env


def cli(root, *args, input=None, **extra):
    return subprocess.run([sys.executable, "-m", "cuarena", *args], env=env_for(root, **extra),
                          input=input, capture_output=True, text=True, timeout=120)


def put(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def real_replayer():
    path = os.environ.get("CUARENA_CLI") or str(REPO / "build" / "bin" / "cuarena")
    return Path(path) if Path(path).is_file() else None


def test_help_lists_the_replayer_commands(package):
    proc = cli(package, "--help")
    assert proc.returncode == 0, proc.stderr
    for words in ("python -m cuarena replay TRACE", "convert", "config", "steady-state",
                  "CUARENA_REPLAY_BIN"):
        assert words in proc.stdout


@pytest.mark.parametrize("command", ["replay", "convert", "config"])
def test_the_package_runs_its_replayer_with_the_arguments_unchanged(package, command):
    put(package / "cuarena" / "bin" / "cuarena", FAKE)
    proc = cli(package, command, "a.pickle.gz", "two words", "--capacity", "", "--help",
               input="from stdin")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.splitlines() == [
        f"arg:{command}", "arg:a.pickle.gz", "arg:two words", "arg:--capacity", "arg:",
        "arg:--help", f"python:{sys.executable}", "stdin:from stdin"]
    assert proc.stderr == "fake on stderr\n"


def test_steady_state_runs_its_own_executable_without_the_command_name(package):
    put(package / "cuarena" / "bin" / "cuarena", "#!/bin/sh\necho wrong\nexit 1\n")
    put(package / "cuarena" / "bin" / "cuarena_steady_state", FAKE)
    proc = cli(package, "steady-state", "t.pickle", "--passes", "3")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.splitlines()[:3] == ["arg:t.pickle", "arg:--passes", "arg:3"]


def test_the_environment_names_another_replayer_and_python(package, tmp_path):
    fake = put(tmp_path / "elsewhere" / "my-cuarena", FAKE)
    proc = cli(package, "replay", "x", CUARENA_REPLAY_BIN=str(fake), CUARENA_PYTHON="/my/python")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.splitlines()[:3] == ["arg:replay", "arg:x", "python:/my/python"]


@pytest.mark.parametrize("command", ["replay", "convert", "config", "steady-state"])
def test_a_package_without_the_replayer_says_what_to_install_in_one_line(package, command):
    proc = cli(package, command, "job.pickle.gz")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cuarena: error: ") and "not installed" in lines[0]
    assert INSTALL_HINT in lines[0] and "reinstall" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_bad_override_is_one_line_too(package, tmp_path):
    missing = tmp_path / "no" / "cuarena"
    proc = cli(package, "replay", "--help", CUARENA_REPLAY_BIN=str(missing))
    assert proc.returncode == 2
    assert proc.stderr == f"cuarena: error: CUARENA_REPLAY_BIN={missing} is not an executable file\n"
    not_executable = tmp_path / "cuarena"
    not_executable.write_text(FAKE)
    proc = cli(package, "replay", CUARENA_REPLAY_BIN=str(not_executable))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


@needs_torch
def test_info_says_whether_the_replayer_is_installed(package):
    proc = cli(package, "info")
    assert "replayer: not installed" in proc.stdout, proc.stdout + proc.stderr
    fake = put(package / "cuarena" / "bin" / "cuarena", FAKE)
    proc = cli(package, "info")
    assert f"replayer: {fake.resolve()}\n" in proc.stdout, proc.stdout + proc.stderr


# --- The real replayer -------------------------------------------------------------------------

needs_replayer = pytest.mark.skipif(real_replayer() is None,
                                    reason="no cuarena binary built ($CUARENA_CLI, build/bin)")


@needs_replayer
@pytest.mark.parametrize("args", [("replay", "--help"), ("config",)])
def test_the_real_replayer_through_the_package(package, args):
    binary = real_replayer()
    direct = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
    assert direct.returncode == 0, direct.stderr
    proc = cli(package, *args, CUARENA_REPLAY_BIN=str(binary))
    assert proc.returncode == 0, proc.stderr
    # the same text, but the usage line names the command as typed
    assert proc.stdout == direct.stdout.replace(str(binary), "python -m cuarena")
    if args[0] == "replay":
        assert "Usage: python -m cuarena replay [OPTIONS] TRACE..." in proc.stdout
    assert ("--capacity" if args[0] == "replay" else "whole_chunk_min") in proc.stdout


@needs_replayer
def test_the_real_replayer_exit_code_passes_through(package, tmp_path):
    proc = cli(package, "replay", str(tmp_path / "no-such.pickle.gz"),
               CUARENA_REPLAY_BIN=str(real_replayer()))
    assert proc.returncode == 2
    assert "no-such.pickle.gz" in proc.stderr


@needs_replayer
def test_an_installed_replayer_runs_the_scripts_installed_beside_it(tmp_path):
    """The package's layout: bin/cuarena runs ../share/cuarena_trace.py, not the source tree's
    (here a stand-in converter that fails with its own message)."""
    binary = tmp_path / "cuarena" / "bin" / "cuarena"
    binary.parent.mkdir(parents=True)
    shutil.copy2(real_replayer(), binary)
    put(tmp_path / "cuarena" / "share" / "cuarena_trace.py",
        "import sys\nprint('stand-in converter ran', file=sys.stderr)\nsys.exit(3)\n")
    trace = tmp_path / "t.pickle"
    trace.write_bytes(b"\x80\x04N.")
    env = {k: v for k, v in os.environ.items() if k != "CUARENA_TRACE_SCRIPT"}
    env["CUARENA_CACHE_DIR"] = ""
    proc = subprocess.run([str(binary), "replay", str(trace)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "stand-in converter ran" in proc.stderr
