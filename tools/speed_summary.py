#!/usr/bin/env python3
"""Compares cuarena with torch-native over several `cuarena replay --backend cuda --json` runs.

    python3 tools/speed_summary.py run1.json run2.json run3.json [--json summary.json]

Each run replays every trace through both allocators on the same machine. Host timings on a
shared VM move by up to 2x between runs, so one run does not settle a speed target: for each
trace this prints, per run and as the median over runs, cuarena / torch-native for
  p50 alloc + free  (alloc p50 + free p50, microseconds),
  alloc p99, free p99,
  replay time       (elapsed_s, the whole replay),
and whether each speed target holds in the median: p50 alloc+free <= 0.5x, p99 <= 1x (each of
alloc and free), replay time < 1x.
"""

import argparse
import json
import statistics
import sys

METRICS = {
    "p50_alloc_free": lambda r: r["alloc_us"]["p50"] + r["free_us"]["p50"],
    "alloc_p99": lambda r: r["alloc_us"]["p99"],
    "free_p99": lambda r: r["free_us"]["p99"],
    "replay": lambda r: r["elapsed_s"],
}
TARGET = {"p50_alloc_free": 0.5, "alloc_p99": 1.0, "free_p99": 1.0, "replay": 1.0}


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        sys.exit(f"speed_summary: cannot read {path}: {e.strerror}")
    except ValueError as e:
        sys.exit(f"speed_summary: {path} is not JSON: {e}")
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        sys.exit(f"speed_summary: {path} has no 'results' list (not `cuarena replay --json` output)")
    rows = {}
    for r in results:
        if r.get("backend") == "cuda" and r["allocator"] in ("cuarena", "torch-native"):
            if "alloc_us" not in r or "free_us" not in r:
                sys.exit(f"speed_summary: {path}: {r['trace']} {r['allocator']} has no latencies")
            rows[(r["trace"], r["allocator"])] = r
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="JSON files from cuarena replay --backend cuda")
    p.add_argument("--json", help="also write the summary here")
    args = p.parse_args()
    runs = [load(path) for path in args.runs]
    traces = sorted({t for run in runs for (t, a) in run})
    summary = {"runs": args.runs, "traces": {}}
    print(f"cuarena / torch-native over {len(runs)} run(s); median [per run]; "
          "targets: p50 <= 0.5, p99 <= 1, replay < 1")
    print("| trace | p50 alloc+free | alloc p99 | free p99 | replay time |")
    print("|---|---|---|---|---|")
    for t in traces:
        cells, entry = [], {}
        for m, f in METRICS.items():
            ratios = []
            for i, run in enumerate(runs):
                c, n = run.get((t, "cuarena")), run.get((t, "torch-native"))
                if c is None or n is None:
                    sys.exit(f"speed_summary: {args.runs[i]} lacks cuarena or torch-native for {t}")
                ratios.append(f(c) / f(n) if f(n) > 0 else float("inf"))
            med = statistics.median(ratios)
            met = med <= TARGET[m] if m != "replay" else med < TARGET[m]
            entry[m] = {"median": med, "runs": ratios, "met": met}
            cells.append(f"{'**' if met else ''}{med:.2f}x{'**' if met else ''} "
                         f"[{', '.join(f'{r:.2f}' for r in ratios)}]")
        summary["traces"][t] = entry
        print(f"| {t} | " + " | ".join(cells) + " |")
    for m in METRICS:
        met = [t for t in traces if summary["traces"][t][m]["met"]]
        print(f"{m}: target met on {len(met)} of {len(traces)} traces (median)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
