"""pytest setup of the GPU PyTorch suite: cuarena under real torch on a CUDA device.

Run (tools/gpu-test.sh does, after building build-gpu with -DCUARENA_WITH_TORCH=ON):

    CUARENA_TORCH_LIB=$PWD/build-gpu/lib/libcuarena_torch.so CUARENA_CLI=$PWD/build-gpu/bin/cuarena \
    PYTHONPATH=$PWD/allocator/torch/python python3 -m pytest -q -rs tests/gpu_torch

Every scenario runs in a fresh subprocess (gpu_harness.run_scenario, also the `run_scenario`
fixture below); the modules skip with a reason where torch, a CUDA device, libcuarena_torch.so
or the package is missing.
"""

import sys
from pathlib import Path

import pytest

# The helper module sits beside this file; make it importable whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_harness  # noqa: E402
from gpu_harness import run_scenario as _run_scenario  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: minutes of real training (run by default; -m 'not slow' leaves it out)")


def pytest_report_header(config):
    lib, how = gpu_harness.find_lib()
    info = gpu_harness.probe()
    return [f"cuarena gpu_torch: lib={lib or how}; cli={gpu_harness.find_cli()}; "
            f"package={'source tree' if gpu_harness.source_package_present() else 'installed'}"
            f"; installed dist={gpu_harness.installed_distribution()}; torch={info}"]


@pytest.fixture
def run_scenario():
    """gpu_harness.run_scenario(code, env=None, timeout=...): runs code in a fresh process with
    cuarena enabled first and returns the JSON object the code emitted."""
    return _run_scenario


@pytest.fixture(scope="session")
def cuarena_cli():
    cli = gpu_harness.find_cli()
    if cli is None:
        pytest.skip("the cuarena CLI is not built (set CUARENA_CLI or build build-gpu/bin/cuarena)")
    return cli
