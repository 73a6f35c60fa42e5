"""Real training side by side (bench/train/compare.py): GPT-2 small, ResNet-50 and GPT-2 with
varying sequence lengths, 30 steps each under PyTorch's allocator, expandable segments and
cuarena, each in a fresh process. Asserts the backends, finite losses, cuarena's losses equal
native's within 1e-3 relative, and cuarena's peak reserved memory below native's. Bitwise
equality of the losses and the step-time ratio are reported (junit test-suite properties and compare.py's table),
not asserted.

Takes minutes. With CUARENA_TRAIN_COMPARE_JSON set to a compare.json (the GPU suite runs
compare.py as its own step first), the test checks that file instead of training again."""

import json
import math
import os
import subprocess

import pytest

from gpu_harness import PYTHON, REPO_ROOT, require_gpu_torch, run_command

require_gpu_torch()

MODELS = ["gpt2", "resnet50", "gpt2_varlen"]
STEPS = 30
REL_TOL = 1e-3


def _missing_modules():
    r = subprocess.run([PYTHON, "-c", "import transformers, torchvision"], capture_output=True,
                       text=True, timeout=300)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


@pytest.fixture(scope="module")
def compare(tmp_path_factory):
    given = os.environ.get("CUARENA_TRAIN_COMPARE_JSON")
    if given:
        # Set by the GPU suite after its train_compare step: check that run, never train again.
        assert os.path.isfile(given), f"{given} does not exist (did train_compare fail?)"
        with open(given) as f:
            return json.load(f)
    missing = _missing_modules()
    if missing:
        pytest.skip(f"training needs transformers and torchvision: {missing}")
    out = tmp_path_factory.mktemp("train")
    r = run_command([PYTHON, REPO_ROOT / "bench" / "train" / "compare.py", "--models",
                     ",".join(MODELS), "--steps", str(STEPS), "--out", out], timeout=3600)
    print(r.stdout[-6000:])
    path = out / "compare.json"
    assert path.is_file(), (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_training_under_cuarena(compare, model, record_testsuite_property):
    assert model in compare["runs"], f"compare.json has no {model} runs"
    runs = compare["runs"][model]
    for alloc in ("native", "expandable", "cuarena"):
        assert alloc in runs, f"no {alloc} run of {model}"
        assert "error" not in runs[alloc], (alloc, runs[alloc].get("error"),
                                            "\n".join(runs[alloc].get("log_tail", [])))
    nat, exp, cua = runs["native"], runs["expandable"], runs["cuarena"]

    assert nat["allocator_backend"] == "native"
    assert exp["allocator_backend"] == "native"
    assert exp["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert cua["allocator_backend"] == "cuarena"

    for name, res in (("native", nat), ("expandable", exp), ("cuarena", cua)):
        assert len(res["losses"]) == compare["steps"], name
        assert all(math.isfinite(x) for x in res["losses"]), (name, res["losses"])

    bitwise = cua["losses"] == nat["losses"]
    rel = [abs(c - n) / max(abs(n), 1e-12) for c, n in zip(cua["losses"], nat["losses"])]
    exp_rel = [abs(e - n) / max(abs(n), 1e-12) for e, n in zip(exp["losses"], nat["losses"])]
    record_testsuite_property(f"{model}_losses_bitwise", bitwise)
    record_testsuite_property(f"{model}_losses_max_rel_diff", max(rel))
    record_testsuite_property(f"{model}_reserved_ratio",
                    cua["max_memory_reserved"] / nat["max_memory_reserved"])
    row = next((r for r in compare["rows"] if r["model"] == model), {})
    record_testsuite_property(f"{model}_step_time_ratio", row.get("cuarena_native_step_time"))
    assert max(rel) <= REL_TOL, (
        f"cuarena's losses drift from native's: max rel {max(rel):.3g} at step "
        f"{rel.index(max(rel)) + 1} (expandable vs native, the same allocator's noise: "
        f"{max(exp_rel):.3g})")

    assert cua["max_memory_reserved"] < nat["max_memory_reserved"], (
        f"cuarena peak reserved {cua['max_memory_reserved'] / 2**20:.0f} MiB >= native "
        f"{nat['max_memory_reserved'] / 2**20:.0f} MiB")
