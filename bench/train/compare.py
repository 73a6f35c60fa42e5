#!/usr/bin/env python3
"""Trains the same models under PyTorch's allocator, PyTorch's expandable segments and cuarena,
each run in a fresh process, and compares memory, speed and losses.

    python3 bench/train/compare.py --models gpt2,resnet50,gpt2_varlen --steps 30 --out DIR

Allocators (--allocators, default all three):
  native      no allocator settings at all
  expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cuarena     --cuarena-route auto (default): CUARENA=1 when the package is pip-installed (its
              torch.backends entry point) and no library is given; otherwise the source tree:
              bench/train/with_cuarena.py enables cuarena and runs train.py, with
              PYTHONPATH=allocator/torch/python and CUARENA_TORCH_LIB (--cuarena-lib, else
              $CUARENA_TORCH_LIB, else build-gpu/lib or build/lib). --cuarena-route run uses
              `python -m cuarena run train.py ...` instead; env forces CUARENA=1.
--variant NAME=CONF (repeatable) adds a cuarena run named cuarena-NAME with CUARENA_CONF=CONF
(e.g. --variant "memory_first=whole_chunk_min:0"), after the allocators above.
Every run gets CUBLAS_WORKSPACE_CONFIG=:4096:8 and none of the caller's PYTORCH_*ALLOC_CONF,
CUARENA or CUARENA_TRACE variables (CUARENA_CONF is kept for the cuarena runs only).

Prints a markdown table (model | peak reserved native / expandable / cuarena in MiB |
cuarena / native reserved | median step time over steps 10..N, cuarena / native | losses equal)
and writes DIR/compare.json (every run's result and the table's figures), DIR/compare.md and
DIR/<model>-<allocator>.json / .log. A second table has one row per model and run: peak
reserved / peak requested (1.0 is the floor), median step time / native's, mapping calls per step
over the last 5 steps (cuarena) and tokens/s (llama_generate). Exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
TRAIN = HERE / "train.py"
WRAPPER = HERE / "with_cuarena.py"
PACKAGE_DIR = REPO_ROOT / "allocator" / "torch" / "python"
ALLOCATORS = ("native", "expandable", "cuarena")
MiB = 1 << 20


def mapping_calls(res) -> str:
    """cuarena's cuMemMap/cuMemUnmap/cuMemSetAccess calls in each of the last 5 steps, when it
    served the run ("" otherwise): 0 once its layout has converged."""
    calls = res.get("cuarena_mapping_calls_per_step")
    return f", mapping calls in the last steps {calls[-5:]}" if calls else ""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,resnet50,gpt2_varlen")
    p.add_argument("--allocators", default=",".join(ALLOCATORS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--cuarena-route", choices=("auto", "env", "wrapper", "run"), default="auto")
    p.add_argument("--cuarena-lib", default=None, help="libcuarena_torch.so for the source route")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per training run")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=CONF",
                   help="an extra cuarena run, cuarena-NAME, under CUARENA_CONF=CONF")
    args = p.parse_args(argv)
    args.variants = {}
    for v in args.variant:
        name, sep, conf = v.partition("=")
        if not sep or not name or not all(c.isalnum() or c in "_-" for c in name):
            p.error(f"--variant '{v}': give NAME=CONF, NAME of letters, digits, '_' or '-'")
        if f"cuarena-{name}" in args.variants:
            p.error(f"--variant '{name}' given twice")
        args.variants[f"cuarena-{name}"] = conf
    return args


def installed_entry_point() -> bool:
    try:
        eps = importlib.metadata.entry_points(group="torch.backends")
    except Exception:  # noqa: BLE001
        return False
    return any("cuarena" in ep.name.lower() or "cuarena" in ep.value.lower() for ep in eps)


def find_lib(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    if os.environ.get("CUARENA_TORCH_LIB"):
        return os.environ["CUARENA_TORCH_LIB"]
    for d in ("build-gpu/lib", "build/lib", "build-torch/lib"):
        p = REPO_ROOT / d / "libcuarena_torch.so"
        if p.is_file():
            return str(p)
    return None


def cuarena_route(args) -> tuple[str, str | None]:
    """(route, library) for the cuarena runs."""
    lib = find_lib(args.cuarena_lib)
    route = args.cuarena_route
    if route == "auto":
        explicit = args.cuarena_lib or os.environ.get("CUARENA_TORCH_LIB")
        route = "env" if installed_entry_point() and not explicit else "wrapper"
    if route in ("wrapper", "run") and lib is None and not installed_entry_point():
        sys.exit("compare.py: libcuarena_torch.so not found (--cuarena-lib, CUARENA_TORCH_LIB, "
                 "build-gpu/lib) and cuarena is not pip-installed")
    return route, lib


def run_env(allocator: str, route: str, lib: str | None, conf: str | None = None) -> dict:
    """The environment of one run; `conf`, for a variant, becomes its CUARENA_CONF."""
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUARENA", "CUARENA_TORCH_LIB",
              "CUARENA_TRACE"):
        env.pop(k, None)
    if not allocator.startswith("cuarena"):
        env.pop("CUARENA_CONF", None)
    elif conf is not None:
        env["CUARENA_CONF"] = conf
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONUNBUFFERED"] = "1"
    if allocator == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif allocator.startswith("cuarena"):
        if route == "env":
            env["CUARENA"] = "1"
        else:
            if lib:
                env["CUARENA_TORCH_LIB"] = lib
            if (PACKAGE_DIR / "cuarena" / "__init__.py").is_file():
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(PACKAGE_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_command(python: str, allocator: str, route: str, train_args: list[str]) -> list[str]:
    if allocator.startswith("cuarena") and route == "wrapper":
        return [python, str(WRAPPER), str(TRAIN)] + train_args
    if allocator.startswith("cuarena") and route == "run":
        return [python, "-m", "cuarena", "run", str(TRAIN)] + train_args
    return [python, str(TRAIN)] + train_args


def run_logged(cmd: list[str], env: dict, log_path: Path, timeout: float) -> int | str:
    """Runs `cmd` from the repository root, its output (after the command line) in log_path;
    the exit status, or "timeout"."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout, cwd=REPO_ROOT).returncode
        except subprocess.TimeoutExpired:
            return "timeout"


def train_once(args, model: str, allocator: str, route: str, lib: str | None,
               out: Path) -> dict:
    res_path = out / f"{model}-{allocator}.json"
    log_path = out / f"{model}-{allocator}.log"
    if res_path.exists():
        res_path.unlink()
    train_args = ["--model", model, "--steps", str(args.steps), "--seed", str(args.seed),
                  "--out", str(res_path)]
    cmd = run_command(args.python, allocator, route, train_args)
    t0 = time.perf_counter()
    env = run_env(allocator, route, lib, args.variants.get(allocator))
    rc = run_logged(cmd, env, log_path, args.timeout)
    wall = time.perf_counter() - t0
    if rc == 0 and res_path.is_file():
        res = json.loads(res_path.read_text())
        res["wall_s"] = wall
        res["command"] = cmd
        return res
    tail = log_path.read_text().splitlines()[-25:]
    return {"error": f"exit {rc}", "log_tail": tail, "command": cmd, "wall_s": wall}


def median_step(res: dict) -> float | None:
    times = res.get("step_times_s") or []
    tail = times[9:] if len(times) > 10 else times[1:]  # steps 10..N (1-based), past warm-up
    return statistics.median(tail) if tail else None


def loss_comparison(a: dict, b: dict) -> dict:
    la, lb = a.get("losses") or [], b.get("losses") or []
    if not la or len(la) != len(lb):
        return {"comparable": False}
    diffs = [abs(x - y) for x, y in zip(la, lb)]
    rels = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(la, lb)]
    return {"comparable": True, "bitwise": la == lb, "max_abs_diff": max(diffs),
            "max_rel_diff": max(rels),
            "first_diff_step": next((i + 1 for i, d in enumerate(diffs) if d != 0), None)}


def summarize(model: str, runs: dict) -> dict:
    row = {"model": model}
    for alloc, res in runs.items():
        if "error" in res:
            row[f"{alloc}_error"] = res["error"]
            continue
        row[f"{alloc}_backend"] = res.get("allocator_backend")
        row[f"{alloc}_peak_reserved"] = res.get("max_memory_reserved")
        row[f"{alloc}_peak_allocated"] = res.get("max_memory_allocated")
        row[f"{alloc}_device_used_peak"] = res.get("device_used_peak_bytes")
        row[f"{alloc}_median_step_s"] = median_step(res)
        requested = (res.get("memory_stats") or {}).get("requested_bytes.all.peak")
        if requested and res.get("max_memory_reserved"):
            row[f"{alloc}_reserved_requested"] = res["max_memory_reserved"] / requested
        calls = res.get("cuarena_mapping_calls_per_step")
        if calls:
            row[f"{alloc}_mapping_calls_last5"] = calls[-5:]
        if res.get("tokens_per_s") is not None:
            row[f"{alloc}_tokens_per_s"] = res["tokens_per_s"]
        mn, ma = median_step(runs.get("native", {})), row[f"{alloc}_median_step_s"]
        if "error" not in runs.get("native", {"error": 1}) and mn and ma:
            row[f"{alloc}_step_vs_native"] = ma / mn
        row[f"{alloc}_losses_finite"] = all(math.isfinite(x) for x in res.get("losses", []))
    nat, cua, exp = runs.get("native", {}), runs.get("cuarena", {}), runs.get("expandable", {})
    if "error" not in nat and "error" not in cua and nat and cua:
        row["cuarena_native_reserved"] = cua["max_memory_reserved"] / nat["max_memory_reserved"]
        mn, mc = median_step(nat), median_step(cua)
        row["cuarena_native_step_time"] = mc / mn if mn and mc else None
        row["losses_cuarena_vs_native"] = loss_comparison(cua, nat)
    if "error" not in nat and "error" not in exp and nat and exp:
        row["expandable_native_reserved"] = exp["max_memory_reserved"] / nat["max_memory_reserved"]
        row["losses_expandable_vs_native"] = loss_comparison(exp, nat)
    return row


def fmt_mib(v) -> str:
    return f"{v / MiB:.0f}" if isinstance(v, (int, float)) else "—"


def fmt_losses(c: dict | None) -> str:
    if not c or not c.get("comparable"):
        return "—"
    if c["bitwise"]:
        return "bitwise"
    return (f"no: max abs {c['max_abs_diff']:.3g}, rel {c['max_rel_diff']:.3g} "
            f"(from step {c['first_diff_step']})")


def table(rows: list[dict], steps: int) -> str:
    first = 10 if steps > 10 else 2
    lines = [
        f"| model | peak reserved native / expandable / cuarena (MiB) | cuarena / native reserved "
        f"| expandable / native reserved | device used peak native / expandable / cuarena (MiB) "
        f"| median step time (steps {first}-{steps}) cuarena / native "
        f"| losses cuarena vs native | losses expandable vs native |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        def cell(alloc, key):
            if f"{alloc}_error" in r:
                return "failed"
            return fmt_mib(r.get(f"{alloc}_{key}"))
        peaks = " / ".join(cell(a, "peak_reserved") for a in ALLOCATORS)
        used = " / ".join(cell(a, "device_used_peak") for a in ALLOCATORS)
        ratio = r.get("cuarena_native_reserved")
        eratio = r.get("expandable_native_reserved")
        st = r.get("cuarena_native_step_time")
        ms = ""
        if r.get("native_median_step_s") and r.get("cuarena_median_step_s"):
            ms = (f" ({r['cuarena_median_step_s'] * 1e3:.1f} / "
                  f"{r['native_median_step_s'] * 1e3:.1f} ms)")
        lines.append(
            f"| {r['model']} | {peaks} | {f'{ratio:.4f}' if ratio else '—'} "
            f"| {f'{eratio:.4f}' if eratio else '—'} | {used} "
            f"| {f'{st:.3f}' if st else '—'}{ms} "
            f"| {fmt_losses(r.get('losses_cuarena_vs_native'))} "
            f"| {fmt_losses(r.get('losses_expandable_vs_native'))} |")
    return "\n".join(lines)


def ratio_table(rows: list[dict], allocators: list[str]) -> str:
    """Per model and run: peak reserved / peak requested, step time / native's, mapping calls
    per step in the last 5 steps, tokens/s."""
    lines = ["| model | run | peak reserved / peak requested | median step / native's "
             "| mapping calls, last 5 steps | tokens/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        for a in allocators:
            if f"{a}_error" in r:
                lines.append(f"| {r['model']} | {a} | failed | | | |")
                continue
            rr, st = r.get(f"{a}_reserved_requested"), r.get(f"{a}_step_vs_native")
            calls, tps = r.get(f"{a}_mapping_calls_last5"), r.get(f"{a}_tokens_per_s")
            lines.append(f"| {r['model']} | {a} | {f'{rr:.4f}' if rr else '—'} "
                         f"| {f'{st:.3f}' if st else '—'} | {calls if calls else '—'} "
                         f"| {f'{tps:.1f}' if tps else '—'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    allocators = [a for a in args.allocators.split(",") if a]
    for a in allocators:
        if a not in ALLOCATORS:
            sys.exit(f"compare.py: unknown allocator '{a}' (known: {', '.join(ALLOCATORS)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    allocators += list(args.variants)
    route, lib = (cuarena_route(args) if any(a.startswith("cuarena") for a in allocators)
                  else ("none", None))
    print(f"compare.py: models {models}, allocators {allocators}, {args.steps} steps, "
          f"cuarena route {route}" + (f" ({lib})" if lib and route != "env" else ""), flush=True)

    results: dict = {}
    failed = []
    for model in models:
        results[model] = {}
        for alloc in allocators:
            res = train_once(args, model, alloc, route, lib, out)
            results[model][alloc] = res
            if "error" in res:
                failed.append(f"{model}/{alloc}")
                print(f"  {model:12s} {alloc:10s} FAILED ({res['error']}); log: "
                      f"{out / f'{model}-{alloc}.log'}", flush=True)
                for ln in res["log_tail"][-8:]:
                    print("      " + ln)
            else:
                print(f"  {model:12s} {alloc:10s} backend {res['allocator_backend']:8s} "
                      f"peak reserved {res['max_memory_reserved'] / MiB:9.0f} MiB, median step "
                      f"{(median_step(res) or 0) * 1e3:8.1f} ms, final loss {res['losses'][-1]:.6f}"
                      f" ({res['wall_s']:.0f} s){mapping_calls(res)}", flush=True)
    rows = [summarize(m, results[m]) for m in models]
    md = table(rows, args.steps) + "\n\n" + ratio_table(rows, allocators)
    print()
    print(md)
    (out / "compare.md").write_text(md + "\n")
    (out / "compare.json").write_text(json.dumps(
        {"steps": args.steps, "seed": args.seed, "models": models, "allocators": allocators,
         "cuarena_route": route, "cuarena_lib": lib, "variants": args.variants, "rows": rows,
         "runs": results,
         "failed": failed}, indent=1))
    if failed:
        print(f"\ncompare.py: {len(failed)} run(s) failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
