#!/usr/bin/env python3
"""Runs unmodified jobs with and without the LD_PRELOAD shim and compares device memory, wall
time and results.

    python3 bench/shim/compare.py --out out/shim [--jobs gpt2,resnet50,jax,cupy] [--repeat 2]

Every run is a fresh process; the variants of a job alternate in order (forward, then
backward). Peak device memory is read from outside with NVML (a sampling thread, every
--interval seconds) minus the used memory just before the run: under the shim PyTorch runs
uncached and cuMemGetInfo counts cuarena's cache as free, so the jobs' own figures mean little.

Jobs and variants (the first of each is the job's own default, the memory reference; "results
vs" names the no-shim variant the shim run must equal bitwise):
  gpt2, resnet50  bench/train/train.py --model M --steps S: default (PyTorch's caching
                  allocator) | shim (which sets PYTORCH_NO_CUDA_MEMORY_CACHING=1 itself)
  jax             bench/shim/jax_job.py, XLA_PYTHON_CLIENT_PREALLOCATE=false: bfc (JAX's default
                  allocator) | platform (XLA_PYTHON_CLIENT_ALLOCATOR=platform) | platform+shim;
                  results vs platform
  cupy            bench/shim/cupy_job.py: pool (CuPy's default pool) | nopool
                  (set_allocator(None)) | nopool+shim; results vs nopool
A shim run adds LD_PRELOAD=<shim> and CUARENA_SUMMARY=1 and parses the summary line. Runs
inherit the environment (NCCL_NVLS_ENABLE and the like stay as the machine sets them) less the
allocator variables that would change the comparison (PYTORCH_*ALLOC_CONF,
PYTORCH_NO_CUDA_MEMORY_CACHING, XLA_PYTHON_CLIENT_*, CUARENA, CUARENA_SUMMARY, CUARENA_TRACE;
CUARENA_CONF only in shim runs).

CuPy gets one unrecorded warm-up run first (it compiles and caches its kernels on first use).
Writes DIR/compare.json (every run), DIR/compare.md (one table per job), DIR/<job>-<variant>-<n>
.json/.log. A failed run prints its last log lines; the other jobs still run, and the script
exits 1 at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import measure  # noqa: E402

MiB = measure.MiB
CLEARED = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
           "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE",
           "XLA_PYTHON_CLIENT_MEM_FRACTION", "CUARENA", "CUARENA_SUMMARY", "CUARENA_TRACE",
           "CUARENA_KEEP_TORCH_CACHE")
PACKAGES = ("torch", "transformers", "torchvision", "jax", "jaxlib", "jax-cuda13-plugin",
            "cupy-cuda13x", "nvidia-ml-py")


@dataclass
class Variant:
    name: str
    env: dict = field(default_factory=dict)
    shim: bool = False
    args: list = field(default_factory=list)


@dataclass
class Job:
    name: str
    script: Path
    args: list
    variants: list
    results_ref: str  # the no-shim variant whose results the shim run must equal
    warmup: bool = False  # one unrecorded run first (CuPy compiles its kernels on first use)


def jobs(steps: int, seed: int) -> dict[str, Job]:
    train = REPO_ROOT / "bench" / "train" / "train.py"
    jax_env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    platform = {**jax_env, "XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    out = {m: Job(m, train, ["--model", m, "--steps", str(steps), "--seed", str(seed)],
                  [Variant("default"), Variant("shim", shim=True)], "default")
           for m in ("gpt2", "resnet50")}
    out["jax"] = Job("jax", HERE / "jax_job.py", ["--steps", str(steps), "--seed", str(seed)],
                     [Variant("bfc", jax_env), Variant("platform", platform),
                      Variant("platform+shim", platform, shim=True)], "platform")
    out["cupy"] = Job("cupy", HERE / "cupy_job.py", ["--seed", str(seed)],
                      [Variant("pool", args=["--pool", "default"]),
                       Variant("nopool", args=["--pool", "off"]),
                       Variant("nopool+shim", args=["--pool", "off"], shim=True)], "nopool",
                      warmup=True)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--jobs", default="gpt2,resnet50,jax,cupy")
    p.add_argument("--repeat", type=int, default=2, help="runs of each variant (default 2)")
    p.add_argument("--steps", type=int, default=30, help="training steps (gpt2, resnet50, jax)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shim", default=None, help="libcuarena_preload.so (default: "
                   "$CUARENA_PRELOAD_LIB, build-gpu/lib, build/lib)")
    p.add_argument("--interval", type=float, default=0.005, help="NVML sampling period, s")
    p.add_argument("--nvml-index", default=None, help="NVML device index or UUID (default: the "
                   "first of CUDA_VISIBLE_DEVICES, else 0)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--python", default=sys.executable)
    return p.parse_args(argv)


def find_shim(explicit: str | None) -> Path | None:
    cands = [explicit] if explicit else [os.environ.get("CUARENA_PRELOAD_LIB")] + [
        str(REPO_ROOT / d / "lib" / "libcuarena_preload.so") for d in ("build-gpu", "build")]
    for c in cands:
        if c and Path(c).is_file():
            return Path(c).resolve()
    return None


def run_env(variant: Variant, shim: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    preload = [p for p in env.pop("LD_PRELOAD", "").split(":") if p and "cuarena" not in p]
    if variant.shim:
        preload.insert(0, str(shim))
        env["CUARENA_SUMMARY"] = "1"
    else:
        env.pop("CUARENA_CONF", None)
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(variant.env)
    return env


def shown_command(variant: Variant, shim: Path, cmd: list[str]) -> str:
    """The command as a shell line, with the variables this script sets for the variant."""
    sets = dict(variant.env)
    if variant.shim:
        sets = {"LD_PRELOAD": str(shim), "CUARENA_SUMMARY": "1", **sets}
    rel = [os.path.relpath(c, REPO_ROOT) if c.startswith(str(REPO_ROOT)) else c for c in cmd]
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in sets.items()] +
                    [shlex.quote(c) for c in rel])


def versions(python: str) -> dict:
    code = ("import importlib.metadata as m, json; d = {}\n"
            f"for n in {PACKAGES!r}:\n"
            "    try: d[n] = m.version(n)\n"
            "    except Exception: pass\n"
            "print(json.dumps(d))")
    try:
        return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True,
                                         timeout=60).stdout)
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def one_run(args, job: Job, variant: Variant, n: int, shim: Path, nvml, idle: int,
            out: Path) -> dict:
    stem = f"{job.name}-{variant.name.replace('+', '_')}-{n}"
    res_path = out / f"{stem}.json"
    res_path.unlink(missing_ok=True)
    cmd = [args.python, str(job.script)] + job.args + variant.args + ["--out", str(res_path)]
    run = measure.run_measured(cmd, run_env(variant, shim), out / f"{stem}.log", nvml,
                               idle_bytes=idle, cwd=str(REPO_ROOT), timeout_s=args.timeout,
                               interval_s=args.interval)
    run.update(job=job.name, variant=variant.name, repeat=n,
               shown_command=shown_command(variant, shim, cmd))
    if run["rc"] == 0 and res_path.is_file():
        data = json.loads(res_path.read_text())
        run["results"] = data.get("results") or {"losses": data.get("losses")}
        run["step_times_s"] = data.get("step_times_s")
        run["job_output"] = {k: v for k, v in data.items()
                             if k not in ("results", "losses", "step_times_s")}
    else:
        run["error"] = f"exit {run['rc']}" + ("" if res_path.is_file() else ", no result file")
    if variant.shim and "error" not in run and not run["summary"]:
        run["error"] = "no 'cuarena: summary:' line (was the shim loaded?)"
    return run


def median_step_ms(runs: list[dict]) -> float | None:
    tails = []
    for r in runs:
        t = r.get("step_times_s") or []
        tails += t[len(t) // 3:] if len(t) >= 3 else t  # past warm-up and compilation
    return statistics.median(tails) * 1e3 if tails else None


def results_verdict(runs: list[dict], ref_runs: list[dict]) -> tuple[bool | None, str]:
    """(identical?, text) for a variant's runs against the reference variant's runs."""
    got = {json.dumps(measure.canonical(r["results"])) for r in runs if "results" in r}
    ref = {json.dumps(measure.canonical(r["results"])) for r in ref_runs if "results" in r}
    if not got or not ref:
        return None, "—"
    if runs is ref_runs and len(runs) == 1:
        return None, "reference (one run)"
    if runs is ref_runs:
        return (len(got) == 1,
                "reference; repeats bitwise equal" if len(got) == 1 else
                f"reference; repeats DIFFER (max rel {diff(runs, runs):.3g})")
    if got == ref and len(got) == 1:
        return True, "bitwise equal"
    note = (f"; the reference's own repeats differ by up to {diff(ref_runs, ref_runs):.3g}"
            if len(ref) > 1 else "")
    return False, f"DIFFER (max rel {diff(runs, ref_runs):.3g}{note})"


def diff(a_runs: list[dict], b_runs: list[dict]) -> float:
    ds = [measure.max_rel_diff(a["results"], b["results"]) for a in a_runs for b in b_runs
          if "results" in a and "results" in b]
    return max([d for d in ds if d is not None], default=float("nan"))


def summarize(job: Job, runs: list[dict]) -> list[dict]:
    by = {v.name: [r for r in runs if r["variant"] == v.name and "error" not in r]
          for v in job.variants}
    rows = []
    for v in job.variants:
        rs = by[v.name]
        row = {"variant": v.name, "shim": v.shim, "runs_ok": len(rs),
               "runs": sum(r["variant"] == v.name for r in runs)}
        if rs:
            peaks = [r["peak_bytes"] for r in rs if "peak_bytes" in r]
            row["peak_mib"] = statistics.median(peaks) / MiB if peaks else None
            row["peak_range_mib"] = [min(peaks) / MiB, max(peaks) / MiB] if peaks else None
            row["wall_s"] = statistics.median(r["wall_s"] for r in rs)
            row["median_step_ms"] = median_step_ms(rs)
            ref = job.results_ref
            row["results_identical"], row["results"] = results_verdict(rs, by[ref])
            row["results_vs"] = ref
            if v.shim:
                row["summary"] = rs[-1]["summary"]
        rows.append(row)
    base = rows[0]
    for row in rows:
        for key, out in (("peak_mib", "peak_vs_default"), ("wall_s", "wall_vs_default")):
            if row.get(key) and base.get(key):
                row[out] = row[key] / base[key]
    return rows


def fmt(v, spec=".0f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "—"


def table(job: Job, rows: list[dict], runs: list[dict]) -> str:
    cmds = {}
    for r in runs:
        cmds.setdefault(r["variant"], r["shown_command"])
    ref = rows[0]["variant"]
    lines = [f"### {job.name}", ""] + [f"- `{v}`: `{c}`" for v, c in cmds.items()] + [
        "",
        f"| variant | runs ok | peak device memory, NVML (MiB, median [min-max]) | vs {ref} "
        f"| wall time (s) | vs {ref} | median step (ms) | results | cuarena summary |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rng = r.get("peak_range_mib")
        peak = (f"{fmt(r.get('peak_mib'))} [{fmt(rng[0])}-{fmt(rng[1])}]" if rng else "—")
        res = r.get("results", "—")
        if r.get("results_vs") and r["results_vs"] != r["variant"]:
            res = f"{res} vs {r['results_vs']}"
        s = r.get("summary") or {}
        summ = (f"served {s.get('calls_served')}, passed through {s.get('calls_passed_through')}"
                f", peak reserved {fmt(s.get('peak_reserved_bytes', 0) / MiB)} MiB, ratio "
                f"{s.get('reserved_ratio')}" if s else "—")
        lines.append(f"| {r['variant']} | {r['runs_ok']}/{r['runs']} | {peak} "
                     f"| {fmt(r.get('peak_vs_default'), '.3f')} | {fmt(r.get('wall_s'), '.1f')} "
                     f"| {fmt(r.get('wall_vs_default'), '.3f')} "
                     f"| {fmt(r.get('median_step_ms'), '.1f')} | {res} | {summ} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shim = find_shim(args.shim)
    if shim is None:
        print("compare.py: libcuarena_preload.so not found (--shim, CUARENA_PRELOAD_LIB, "
              "build-gpu/lib, build/lib)", file=sys.stderr)
        return 2
    all_jobs = jobs(args.steps, args.seed)
    names = [j for j in args.jobs.split(",") if j]
    unknown = [j for j in names if j not in all_jobs]
    if unknown:
        print(f"compare.py: unknown job(s) {unknown} (known: {', '.join(all_jobs)})",
              file=sys.stderr)
        return 2
    index = args.nvml_index
    try:
        nvml = measure.Nvml(int(index) if index and index.isdigit() else index)
    except Exception as e:  # noqa: BLE001
        print(f"compare.py: NVML unavailable ({type(e).__name__}: {e}); it needs pynvml "
              "(package nvidia-ml-py) and a GPU", file=sys.stderr)
        return 2
    idle = nvml.used()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
            "shim": str(shim), "idle_used_bytes": idle, **nvml.info(),
            "versions": versions(args.python), "python": args.python,
            "interval_s": args.interval, "repeat": args.repeat, "steps": args.steps}
    print(f"compare.py: {meta['gpu']}, driver {meta['driver']}, idle {idle / MiB:.0f} MiB used; "
          f"shim {shim}; jobs {names}, {args.repeat} run(s) per variant", flush=True)

    runs, failed, md = [], [], []
    for name in names:
        job = all_jobs[name]
        job_runs = []
        if job.warmup:
            w = one_run(args, job, job.variants[0], 0, shim, nvml, idle, out)
            meta.setdefault("warmup_runs", []).append(w)
            print(f"  {name:9s} warm-up run ({job.variants[0].name}): "
                  f"{w.get('error') or 'ok'}, {w['wall_s']:.1f} s", flush=True)
        for n in range(1, args.repeat + 1):
            order = job.variants if n % 2 else job.variants[::-1]
            for v in order:
                r = one_run(args, job, v, n, shim, nvml, idle, out)
                job_runs.append(r)
                if "error" in r:
                    failed.append(f"{name}/{v.name}#{n}")
                    print(f"  {name:9s} {v.name:14s} #{n} FAILED: {r['error']}; last lines of "
                          f"{out}/{name}-{v.name.replace('+', '_')}-{n}.log:", flush=True)
                    for ln in r["log_tail"][-12:]:
                        print("      " + ln, flush=True)
                else:
                    s = r["summary"] or {}
                    print(f"  {name:9s} {v.name:14s} #{n} peak {r['peak_bytes'] / MiB:8.0f} MiB"
                          f" (baseline {r['baseline_bytes'] / MiB:.0f}, {r['samples']} samples,"
                          f" {r['gaps_over_20ms']} gaps > 20 ms), wall {r['wall_s']:6.1f} s"
                          + (f", calls_served {s.get('calls_served')}" if v.shim else ""),
                          flush=True)
        rows = summarize(job, job_runs)
        md.append(table(job, rows, job_runs))
        runs += job_runs
        meta.setdefault("rows", {})[name] = rows

    v = meta["versions"]
    head = (f"GPU {meta['gpu']} ({meta['total_bytes'] / MiB:.0f} MiB), driver {meta['driver']}; "
            + ", ".join(f"{k} {v[k]}" for k in PACKAGES if k in v)
            + f"; {meta['date']}; {args.repeat} run(s) per variant, alternating order; peak = "
            f"NVML used minus the used memory before the run, sampled every "
            f"{args.interval * 1e3:.0f} ms.\n\n`{meta['command']}`")
    text = head + "\n\n" + "\n\n".join(md) + "\n"
    print("\n" + text)
    (out / "compare.md").write_text(text)
    (out / "compare.json").write_text(json.dumps({**meta, "failed": failed, "runs": runs},
                                                 indent=1))
    if failed:
        print(f"compare.py: {len(failed)} run(s) failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
