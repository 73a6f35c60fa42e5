"""Routes that install cuarena without changing the program: CUARENA=1 and
PYTORCH_CUDA_ALLOC_CONF=backend:cuarena (through the torch.backends entry point, so only once
the package is pip-installed), and `python -m cuarena run script.py args` (works from the source
tree too)."""

import json

import pytest

from gpu_harness import (PYTHON, installed_distribution, require_gpu_torch, run_command,
                         torch_backend_entry_points)

require_gpu_torch()

MARK = "@@ZERO_CODE@@"
PROBE = ("import json, sys, torch; x = torch.ones(1000, device='cuda'); "
         "print('" + MARK + "' + json.dumps({'backend': torch.cuda.get_allocator_backend(), "
         "'sum': float(x.sum().item()), 'argv': sys.argv[1:]}))")


def _result(proc):
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert lines, (proc.stdout[-2000:], proc.stderr[-2000:])
    return json.loads(lines[-1][len(MARK):])


def _need_entry_point():
    eps = torch_backend_entry_points()
    if not eps:
        pytest.skip("cuarena is not pip-installed (no torch.backends entry point naming cuarena; "
                    f"installed distribution: {installed_distribution()})")
    return eps


def test_env_cuarena_1():
    _need_entry_point()
    r = _result(run_command([PYTHON, "-c", PROBE], env={"CUARENA": "1"}, timeout=300))
    assert r["backend"] == "cuarena" and r["sum"] == 1000.0, r


@pytest.mark.parametrize("conf", ["backend:cuarena",
                                  "backend:cuarena,small_limit:1MiB"])
def test_pytorch_cuda_alloc_conf_backend(conf):
    _need_entry_point()
    r = _result(run_command([PYTHON, "-c", PROBE], env={"PYTORCH_CUDA_ALLOC_CONF": conf},
                            timeout=300))
    assert r["backend"] == "cuarena" and r["sum"] == 1000.0, r


def test_without_activation_torch_keeps_its_allocator():
    r = _result(run_command([PYTHON, "-c", PROBE], env={"CUARENA_CONF": None}, timeout=300))
    assert r["backend"] == "native", r


def test_python_m_cuarena_run(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE.replace("; ", "\n") + "\n")
    r = _result(run_command([PYTHON, "-m", "cuarena", "run", script, "--flag", "value"],
                            timeout=300, cwd=tmp_path))
    assert r["backend"] == "cuarena" and r["sum"] == 1000.0, r
    assert r["argv"] == ["--flag", "value"], r
