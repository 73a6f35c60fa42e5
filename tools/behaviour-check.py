#!/usr/bin/env python3
"""Records what a build's replayer and steady-state tool say, so that two builds can be compared.

A refactoring of the policy core must change no placement, no driver call and no byte: every
`cuarena replay --json` output (all fields but timings) and every `cuarena_steady_state --json`
output must be byte-identical before and after. This script runs both tools over every bundled
trace, case and edge trace, under each configuration in CONFIGS, at device lags 1 and 64
(`sim_event_latency`), and writes one normalised JSON file per run (timings removed, keys sorted).

    tools/behaviour-check.py record BUILD_DIR OUT_DIR   # e.g. build /tmp/before
    tools/behaviour-check.py compare BEFORE_DIR AFTER_DIR

`compare` prints one line per run that differs (with the first differing field) and exits 1 if
any does, 0 when all are identical. The runs take a few minutes on two cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "data" / "traces"

CONFIGS = {
    "default": "",
    "memory-first": "whole_chunk_min:0",
    "own-first": "placement:own_first",
    "loop-plan": "loop_plan:True",
    "async": "upstream:async",
}
LAGS = (1, 64)
# Every simulator row: cuarena and the CPU models of PyTorch's allocator (upstreams by --config).
ALLOCATORS = "recorded,cuarena,torch-native-sim,torch-expandable-sim"
PASSES = 8
# Fields that measure time, not behaviour.
TIMING_KEYS = {"elapsed_s", "time_s", "seconds", "wall_s"}


def traces() -> list[Path]:
    found = []
    for pattern in ("*.pickle.gz", "*.pickle", "*.cuat", "*.cuat.gz"):
        for sub in ("", "more", "cases", "edge"):
            found += sorted((TRACES / sub).glob(pattern))
    return sorted(set(found))


def strip_timings(value):
    if isinstance(value, dict):
        return {k: strip_timings(v) for k, v in value.items()
                if k not in TIMING_KEYS and not k.endswith("_ns") and not k.endswith("_ms")}
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def runs(build: Path):
    """(name, argv, json path placeholder) for every run."""
    for trace in traces():
        tname = trace.name.split(".")[0]
        for cname, conf in CONFIGS.items():
            for lag in LAGS:
                config = ",".join(x for x in (conf, f"sim_event_latency:{lag}") if x)
                yield (f"replay-{tname}-{cname}-lag{lag}",
                       [str(build / "bin" / "cuarena"), "replay", str(trace), "--allocator",
                        ALLOCATORS, "--config", config, "--series", "--json"])
                yield (f"steady-{tname}-{cname}-lag{lag}",
                       [str(build / "bin" / "cuarena_steady_state"), str(trace), "--passes",
                        str(PASSES), "--config", config, "--json"])


def record(build: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failures = []

    def one(item):
        name, argv = item
        raw = out / f"{name}.raw.json"
        proc = subprocess.run(argv + [str(raw)], capture_output=True, text=True)
        result = {"exit": proc.returncode}
        if raw.exists():
            result["json"] = strip_timings(json.loads(raw.read_text()))
            raw.unlink()
        if proc.returncode != 0:
            result["stderr"] = proc.stderr
            failures.append(name)
        (out / f"{name}.json").write_text(json.dumps(result, sort_keys=True, indent=1) + "\n")

    items = list(runs(build))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(one, items))
    print(f"{len(items)} runs recorded in {out}; {len(failures)} exited non-zero"
          + (f": {', '.join(failures)}" if failures else ""))
    return 0


def first_difference(a, b, path="$"):
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'after' if k in b else 'before'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    differ = 0
    for name in names:
        a, b = before / name, after / name
        if not a.exists() or not b.exists():
            print(f"{name}: only in {'after' if b.exists() else 'before'}")
            differ += 1
            continue
        if a.read_bytes() != b.read_bytes():
            print(f"{name}: {first_difference(json.loads(a.read_text()), json.loads(b.read_text()))}")
            differ += 1
    print(f"{len(names)} runs compared: {len(names) - differ} identical, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="run the tools of BUILD_DIR, write OUT_DIR")
    r.add_argument("build", type=Path)
    r.add_argument("out", type=Path)
    c = sub.add_parser("compare", help="compare two recorded directories")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        for tool in ("cuarena", "cuarena_steady_state"):
            if not (args.build / "bin" / tool).exists():
                sys.exit(f"behaviour-check: {args.build / 'bin' / tool} is missing: build the "
                         "targets cuarena and cuarena_steady_state (-DCUARENA_PACKAGE_TOOLS=ON)")
        return record(args.build, args.out)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
