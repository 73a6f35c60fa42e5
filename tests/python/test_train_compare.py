"""bench/train/compare.py without a GPU: --variant parsing, each variant's environment, and the
ratio table built from fake runs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "train"))
import compare  # noqa: E402


def test_variants_become_cuarena_runs_with_their_conf():
    args = compare.parse_args(["--out", "x", "--variant", "mf=whole_chunk_min:0",
                               "--variant", "plan=loop_plan:True,whole_chunk_min:0"])
    assert args.variants == {"cuarena-mf": "whole_chunk_min:0",
                             "cuarena-plan": "loop_plan:True,whole_chunk_min:0"}
    env = compare.run_env("cuarena-plan", "wrapper", "/lib.so", args.variants["cuarena-plan"])
    assert env["CUARENA_CONF"] == "loop_plan:True,whole_chunk_min:0"
    assert env["CUARENA_TORCH_LIB"] == "/lib.so"
    cmd = compare.run_command("python3", "cuarena-plan", "wrapper", ["--model", "gpt2"])
    assert cmd[1] == str(compare.WRAPPER)


def test_native_never_gets_cuarena_conf(monkeypatch):
    monkeypatch.setenv("CUARENA_CONF", "whole_chunk_min:0")
    assert "CUARENA_CONF" not in compare.run_env("native", "wrapper", None)
    assert compare.run_env("cuarena", "wrapper", None)["CUARENA_CONF"] == "whole_chunk_min:0"


@pytest.mark.parametrize("bad", ["noequals", "=conf", "a b=c"])
def test_a_bad_variant_is_refused(bad):
    with pytest.raises(SystemExit):
        compare.parse_args(["--out", "x", "--variant", bad])


def test_a_variant_given_twice_is_refused():
    with pytest.raises(SystemExit):
        compare.parse_args(["--out", "x", "--variant", "a=x:1", "--variant", "a=y:2"])


def fake_run(reserved, requested, step_s, calls=None, tokens=None):
    r = {"allocator_backend": "native", "max_memory_reserved": reserved,
         "max_memory_allocated": requested, "losses": [1.0] * 12,
         "step_times_s": [step_s] * 12, "memory_stats": {"requested_bytes.all.peak": requested}}
    if calls is not None:
        r["cuarena_mapping_calls_per_step"] = calls
    if tokens is not None:
        r["tokens_per_s"] = tokens
    return r


def test_ratio_table_has_one_row_per_run_with_ratios():
    runs = {"native": fake_run(1200, 1000, 0.2),
            "cuarena-mf": fake_run(1010, 1000, 0.25, calls=[0, 0, 3, 0, 0, 1]),
            "cuarena": {"error": "exit 1", "log_tail": []}}
    row = compare.summarize("gpt2", runs)
    assert row["native_reserved_requested"] == pytest.approx(1.2)
    assert row["cuarena-mf_reserved_requested"] == pytest.approx(1.01)
    assert row["cuarena-mf_step_vs_native"] == pytest.approx(1.25)
    assert row["cuarena-mf_mapping_calls_last5"] == [0, 3, 0, 0, 1]
    md = compare.ratio_table([row], ["native", "cuarena-mf", "cuarena"])
    lines = md.splitlines()
    assert len(lines) == 5
    assert "| gpt2 | cuarena-mf | 1.0100 | 1.250 | [0, 3, 0, 0, 1] | — |" in lines
    assert "| gpt2 | cuarena | failed | | | |" in lines
