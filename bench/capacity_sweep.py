#!/usr/bin/env python3
"""Does a job that fits on a device also fit on every larger one? (simulator, deterministic)

For each trace and cuarena config: the smallest capacity the replayer finds (--min-capacity),
then replays at capacities from there up to 1.10x the trace's peak requested bytes in 2 MiB
steps (at most --probes of them, spread evenly), and lists every capacity that ran out of
memory. An allocator whose failures depend on the layout can fail above its own minimum.

    python3 bench/capacity_sweep.py --config "" --config whole_chunk_min:0 \\
        --traces tests/data/traces/*.pickle.gz tests/data/traces/cases/*.gz

Runs build/bin/cuarena (CUARENA_BIN_DIR overrides the directory). Prints a Markdown table; exits
1 when a probe ran out of memory, 2 on bad input (a trace or config the replayer refuses).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("CUARENA_BIN_DIR", ROOT / "build" / "bin"))
STEP = 2 << 20


def replay(trace: str, config: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        cmd = [str(BIN / "cuarena"), "replay", trace, "--allocator", "cuarena", "--config", config,
               "--json", str(out), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if not out.exists():
            print(f"capacity_sweep: {' '.join(cmd)} failed (exit {done.returncode}):\n"
                  f"{done.stderr.strip()}", file=sys.stderr)
            sys.exit(2)
        return json.loads(out.read_text())["results"][0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 when every probe fit, 1 when one ran out "
                                "of memory, 2 on bad input.")
    p.add_argument("--config", action="append", default=None,
                   help="cuarena config (repeatable; '' = default)")
    p.add_argument("--traces", nargs="+", required=True,
                   help="trace files (PyTorch snapshots .pickle[.gz], RMM CSV, .cuat)")
    p.add_argument("--probes", type=int, default=60, help="most capacities tried per row")
    a = p.parse_args()
    if a.probes < 1:
        p.error("--probes must be at least 1")
    if not (BIN / "cuarena").exists():
        print(f"capacity_sweep: {BIN / 'cuarena'} not found (build first, or set "
              "CUARENA_BIN_DIR)", file=sys.stderr)
        return 2
    failed = False
    header = ("| trace | config | min capacity (MiB) | / peak requested | probes up to 1.10x peak "
              "| out of memory at (MiB) |\n|---|---|---|---|---|---|")
    for config in a.config or [""]:
        for trace in a.traces:
            r = replay(trace, config, ["--min-capacity"])
            if header:  # after the first replay: bad input leaves no empty table behind
                print(header)
                header = ""
            peak = r["peak_requested_bytes"]
            lo, hi = r["min_capacity_bytes"], int(1.10 * peak)
            steps = list(range(lo, max(lo, hi) + 1, STEP))
            if len(steps) > a.probes:
                steps = [steps[i * len(steps) // a.probes] for i in range(a.probes)]
            fails = [c for c in steps if replay(trace, config, ["--capacity", str(c)])["ooms"]]
            failed |= bool(fails)
            name = Path(trace).name.split(".")[0]
            shown = ", ".join(str(c >> 20) for c in fails[:8]) + (" ..." if len(fails) > 8 else "")
            print(f"| {name} | {config or 'default'} | {lo >> 20} | {lo / peak:.4f} | "
                  f"{len(steps)} | {shown or 'none'} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
