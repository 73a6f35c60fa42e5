#!/usr/bin/env python3
"""The policy's figures per trace, deterministic (simulator): reserved_ratio of one replay,
its range over device lags, driver calls per steady-state pass and how many passes it takes to
stop calling the driver.

    python3 bench/policy_table.py [--config C]... [--traces T...] [--lags 1,4,16,64]
                                  [--passes 10] [--json out.json] [--no-steady]

Each --config is one column group (an empty string is the default; repeat --config for several).
Runs build/bin/cuarena (replay) and build/bin/cuarena_steady_state; set CUARENA_BIN_DIR to use
another build. A trace converges at pass k when passes k..N make no driver call and pass N's
peak reserved is no higher than pass k's; "-" when it does not within --passes.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("CUARENA_BIN_DIR", ROOT / "build" / "bin"))
DEFAULT_TRACES = sorted(glob.glob(str(ROOT / "tests/data/traces/*.pickle.gz"))) + sorted(
    glob.glob(str(ROOT / "tests/data/traces/more/*.pickle.gz")))


def with_key(config, key):
    return f"{config},{key}" if config else key


def replay_ratios(traces, config):
    """{trace name: reserved_ratio} of one simulated replay of each trace."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [str(BIN / "cuarena"), "replay", *traces, "--allocator", "cuarena", "--json", str(out)]
        if config:
            cmd += ["--config", config]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"policy_table: {' '.join(cmd)} failed:\n{p.stderr}")
        return {r["trace"]: r["reserved_ratio"] for r in json.loads(out.read_text())["results"]}


def steady_state(trace, config, passes):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.json"
        cmd = [str(BIN / "cuarena_steady_state"), trace, "--passes", str(passes), "--json", str(out)]
        if config:
            cmd += ["--config", config]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"policy_table: {' '.join(cmd)} failed:\n{p.stderr}")
        [doc] = json.loads(out.read_text())
    rows = doc["passes"]
    calls = [r["map_calls"] + r["unmap_calls"] + r["access_calls"] + r["device_allocs"] +
             r["device_frees"] for r in rows]
    peaks = [r["reserved_peak_bytes"] for r in rows]
    converged = None
    for k in range(len(rows)):
        if all(c == 0 for c in calls[k:]) and peaks[-1] <= peaks[k]:
            converged = k + 1
            break
    return {"calls": calls, "peaks": peaks, "converged_at": converged,
            "same_address": [r["same_address_allocations"] for r in rows],
            "allocations": [r["allocations"] for r in rows]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", help="allocator config (repeatable; '' = default)")
    ap.add_argument("--traces", nargs="+", default=DEFAULT_TRACES)
    ap.add_argument("--lags", default="1,4,16,64", help="sim_event_latency values")
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--no-steady", action="store_true", help="skip the steady-state passes")
    args = ap.parse_args()
    configs = args.config if args.config else [""]
    lags = [int(x) for x in args.lags.split(",")]
    result = {}
    for config in configs:
        by_lag = {lag: replay_ratios(args.traces, with_key(config, f"sim_event_latency:{lag}"))
                  for lag in lags}
        per_trace = {}
        for trace in args.traces:
            name = Path(trace).name.split(".")[0]
            ratios = [by_lag[lag][name] for lag in lags]
            entry = {"ratio": by_lag[lags[0]][name], "ratio_by_lag": dict(zip(lags, ratios)),
                     "lag_range": max(ratios) - min(ratios)}
            if not args.no_steady:
                entry["steady"] = steady_state(trace, config, args.passes)
            per_trace[name] = entry
        result[config] = per_trace

    print(f"| trace | config | ratio (lag {lags[0]}) | range over lags {args.lags} | "
          f"calls per pass 2..{args.passes} | converged at pass | peak reserved pass 4 -> "
          f"{args.passes} (MiB) | highest pass peak / pass 1 peak | same address, last pass |")
    print("|---|---|---|---|---|---|---|---|---|")
    for config, per_trace in result.items():
        for name, e in per_trace.items():
            s = e.get("steady")
            calls = " ".join(map(str, s["calls"][1:])) if s else ""
            conv = (str(s["converged_at"]) if s["converged_at"] else "-") if s else ""
            peaks = f"{s['peaks'][3] / 2**20:.0f} -> {s['peaks'][-1] / 2**20:.0f}" if s else ""
            same = f"{s['same_address'][-1]}/{s['allocations'][-1]}" if s else ""
            transition = f"{max(s['peaks']) / s['peaks'][0]:.3f}" if s else ""
            print(f"| {name} | {config or 'default'} | {e['ratio']:.4f} | {e['lag_range']:.4f} | "
                  f"{calls} | {conv} | {peaks} | {transition} | {same} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
