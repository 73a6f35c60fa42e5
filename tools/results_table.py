#!/usr/bin/env python3
"""Prints a Markdown table from `cuarena replay --json` output (docs/results.md's tables).

    python3 tools/results_table.py results.json
"""

import argparse
import json
import sys


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def main(path):
    with open(path) as f:
        results = json.load(f)["results"]
    print("| trace | allocator | backend | reserved_ratio | alloc p50 / p99 us | free p50 / p99 us "
          "| replay s | OOMs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        a, fr = r.get("alloc_us"), r.get("free_us")
        lat_a = f"{fmt(a['p50'])} / {fmt(a['p99'])}" if a else "-"
        lat_f = f"{fmt(fr['p50'])} / {fmt(fr['p99'])}" if fr else "-"
        print(f"| {r['trace']} | {r['allocator']} | {r['backend']} | {r['reserved_ratio']:.4f} "
              f"| {lat_a} | {lat_f} | {r['elapsed_s']:.3f} | {r['ooms']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Print a Markdown table of `cuarena replay --json` results (one row per trace "
                    "and allocator: reserved_ratio, latency percentiles, replay time, OOMs).")
    parser.add_argument("results", help="a JSON file written by `cuarena replay --json FILE`")
    args = parser.parse_args()
    try:
        main(args.results)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"results_table.py: {args.results}: not cuarena replay results ({e})")
