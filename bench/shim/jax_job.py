#!/usr/bin/env python3
"""A small deterministic JAX training job: an MLP with layer norm, trained with Adam (written
out, no optax) on random regression data drawn inside the jitted step from a fixed PRNGKey.

    python3 bench/shim/jax_job.py --steps 30 --out r.json

It knows nothing about cuarena; the allocator is chosen from outside (XLA_PYTHON_CLIENT_ALLOCATOR,
LD_PRELOAD). Unless --no-det-flags, it appends to XLA_FLAGS what makes XLA:GPU pick the same
kernels in every process (no autotuning by timing, deterministic ops). The JSON: results
(per-step losses, a SHA-256 of the final parameters), step_times_s, versions, environment.
Exits 3 when JAX has no GPU backend.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

DET_FLAGS = "--xla_gpu_autotune_level=0 --xla_gpu_exclude_nondeterministic_ops=true"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--no-det-flags", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_det_flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + DET_FLAGS).strip()
    import jax
    import jax.numpy as jnp
    import numpy as np

    if jax.default_backend() not in ("gpu", "cuda"):
        print(f"jax_job.py: no GPU backend (JAX uses {jax.default_backend()})", file=sys.stderr)
        return 3

    d_in, d_out = 512, 256
    sizes = [d_in] + [args.width] * args.depth + [d_out]
    key = jax.random.PRNGKey(args.seed)
    init_key, data_key = jax.random.split(key)

    def init(k):
        params = []
        for m, n in zip(sizes[:-1], sizes[1:]):
            k, sub = jax.random.split(k)
            params.append({"w": jax.random.normal(sub, (m, n), jnp.float32) * (2.0 / m) ** 0.5,
                           "b": jnp.zeros((n,), jnp.float32)})
        return params

    def forward(params, x):
        for layer in params[:-1]:
            x = x @ layer["w"] + layer["b"]
            x = (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)
            x = jax.nn.gelu(x)
        return x @ params[-1]["w"] + params[-1]["b"]

    target_w = jax.random.normal(jax.random.PRNGKey(args.seed + 7), (d_in, d_out)) / d_in ** 0.5

    def loss_fn(params, i):
        x = jax.random.normal(jax.random.fold_in(data_key, i), (args.batch, d_in), jnp.float32)
        y = jnp.sin(x @ target_w)
        return jnp.mean((forward(params, x) - y) ** 2)

    @jax.jit
    def step(params, m, v, i):
        loss, grads = jax.value_and_grad(loss_fn)(params, i)
        t = (i + 1).astype(jnp.float32)
        b1, b2, eps = 0.9, 0.999, 1e-8
        m = jax.tree.map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
        scale = args.lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        params = jax.tree.map(lambda p, m_, v_: p - scale * m_ / (jnp.sqrt(v_) + eps),
                              params, m, v)
        return params, m, v, loss

    params = init(init_key)
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    losses, times = [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        params, m, v, loss = step(params, m, v, jnp.int32(i))
        losses.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - t0)

    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    dev = jax.devices()[0]
    result = {
        "job": "jax_mlp", "steps": args.steps, "seed": args.seed, "sizes": sizes,
        "batch": args.batch,
        "results": {"losses": losses, "params_sha256": digest.hexdigest()},
        "step_times_s": times,
        "jax": jax.__version__, "device": getattr(dev, "device_kind", str(dev)),
        "env": {k: os.environ.get(k) for k in (
            "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE",
            "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_FLAGS", "LD_PRELOAD")},
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"jax_job.py: {args.steps} steps, final loss {losses[-1] if losses else float('nan'):.6f}"
          f", allocator {os.environ.get('XLA_PYTHON_CLIENT_ALLOCATOR', 'default (bfc)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
