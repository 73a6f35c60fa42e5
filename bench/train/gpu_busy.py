#!/usr/bin/env python3
"""Is a slower training step slower on the GPU or on the host? Runs train.py's GPT-2 task for
--steps steps, then profiles --profile more with torch.profiler and prints, per profiled step,
the wall time, the GPU's busy time (the sum of its kernels' and copies' durations) and the host
time inside the allocator's entry points PyTorch records (none for a plugged allocator: then
the gap wall - busy is the host's share).

    python3 bench/train/gpu_busy.py --model gpt2 --out r.json     # under whatever allocator

Run it under each allocator (compare.py's environment or bench/train/with_cuarena.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import train  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2", choices=("gpt2", "gpt2_varlen"))
    p.add_argument("--steps", type=int, default=12, help="warm-up steps before profiling")
    p.add_argument("--profile", type=int, default=3, help="steps profiled")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    targs = train.parse_args(["--model", args.model, "--out", "/dev/null"])
    train.seed_everything(0)
    task = train.GPT2Task(targs, varlen=args.model == "gpt2_varlen")
    for _ in range(args.steps):
        task.step()
    torch.cuda.synchronize()
    walls, busy = [], []
    for _ in range(args.profile):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            task.step()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
        gpu_us = 0.0
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                gpu_us += e.time_range.elapsed_us()
        busy.append(gpu_us / 1e3)
    res = {"model": args.model, "wall_ms": walls, "gpu_busy_ms": busy,
           "allocator": torch.cuda.get_allocator_backend(),
           "conf": os.environ.get("CUARENA_WITH_CONFIG")}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"gpu_busy: {args.model} {res['allocator']} {res['conf'] or ''}: wall "
          f"{statistics.median(walls):.1f} ms, GPU busy {statistics.median(busy):.1f} ms, "
          f"host-bound gap {statistics.median(walls) - statistics.median(busy):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
