#!/usr/bin/env python3
"""A small deterministic CuPy job: per step, a random matrix of a seeded, varying size, a matrix
product, a 2-D FFT round trip (a circular autocorrelation), element-wise math and reductions.

    python3 bench/shim/cupy_job.py --pool off --steps 40 --out r.json

--pool default keeps CuPy's memory pool; --pool off calls cupy.cuda.set_allocator(None), so
every array is its own cudaMalloc (what the LD_PRELOAD shim serves). It knows nothing about
cuarena. The JSON: results (per-step sums as floats, a SHA-256 of every step's output bytes),
step_times_s, versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", choices=("default", "off"), default="off")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-n", type=int, default=256)
    p.add_argument("--max-n", type=int, default=4096)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import cupy as cp

    if args.pool == "off":
        cp.cuda.set_allocator(None)
    sizes = random.Random(args.seed).choices(range(args.min_n, args.max_n + 1, 64), k=args.steps)
    rng = cp.random.RandomState(args.seed)
    keep = cp.zeros((args.max_n,), cp.float64)  # lives across steps, so frees interleave
    sums, times = [], []
    digest = hashlib.sha256()
    for n in sizes:
        t0 = time.perf_counter()
        a = rng.standard_normal((n, n), dtype=cp.float32)
        b = (a @ a.T) / n
        f = cp.fft.rfft2(b)
        c = cp.fft.irfft2(f * cp.conj(f), s=b.shape)
        x = cp.tanh(c / (cp.abs(c).max() + 1)) + cp.sort(a, axis=1)
        keep[:n] += x.sum(axis=0, dtype=cp.float64)
        s = float(x.sum(dtype=cp.float64))
        digest.update(cp.asnumpy(x).tobytes())
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
        sums.append(s)
        del a, b, f, c, x
    digest.update(cp.asnumpy(keep).tobytes())
    result = {
        "job": "cupy_math", "pool": args.pool, "steps": args.steps, "seed": args.seed,
        "sizes": sizes,
        "results": {"sums": sums, "keep_sum": float(keep.sum()), "sha256": digest.hexdigest()},
        "step_times_s": times,
        "cupy": cp.__version__, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "pool_used_bytes_end": cp.get_default_memory_pool().used_bytes(),
        "env": {"LD_PRELOAD": os.environ.get("LD_PRELOAD")},
    }
    with open(args.out, "w") as f_out:
        json.dump(result, f_out, indent=1)
    print(f"cupy_job.py: pool {args.pool}, {args.steps} steps, last sum {sums[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
