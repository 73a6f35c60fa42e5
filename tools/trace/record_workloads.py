#!/usr/bin/env python3
"""Record real PyTorch memory snapshots of workloads the bundled traces lack, on a GPU.

Each workload runs in a fresh process, three times: once under PyTorch's native allocator with
`torch.cuda.memory._record_memory_history` on (the snapshot, pickled and gzipped, is the trace),
and once each under `expandable_segments:True` and `backend:cudaMallocAsync`, recording only
`reserved_bytes.all.peak` (the ground truth a replay is compared with). Models are randomly
initialised with a fixed seed: nothing is downloaded.

    python3 tools/trace/record_workloads.py --out DIR [--workloads a,b] [--jobs 3]

writes DIR/<workload>.pickle.gz and DIR/reserved.json ({workload: {mode: bytes or error}}).
Workloads: llm_generate (transformers generate() with a growing KV cache), compile_train
(torch.compile mode="reduce-overhead": CUDA-graph training), cnn_varres_infer (ResNet-50
inference at varying batch and resolution). `--run NAME --mode M` runs one in this process.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

MODES = {
    "native": "",
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
}


def llm_generate(torch) -> None:
    """A Llama-style decoder (12 layers, 1024 wide), bf16, greedy generate() over requests of
    random batch and prompt length: the KV cache grows by one token per step."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=12, num_attention_heads=16,
                                   num_key_value_heads=16, max_position_embeddings=2048)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        batch = int(torch.randint(1, 17, (1,), generator=g))
        prompt = int(torch.randint(32, 513, (1,), generator=g))
        new = int(torch.randint(64, 257, (1,), generator=g))
        ids = torch.randint(3, cfg.vocab_size, (batch, prompt), generator=g).cuda()
        mask = torch.ones_like(ids)
        for row in range(batch):  # left padding, as batched generation uses
            pad = int(torch.randint(0, prompt // 2 + 1, (1,), generator=g))
            mask[row, :pad] = 0
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()


def compile_train(torch) -> None:
    """A 6-layer transformer encoder (1024 wide) trained with AdamW under
    torch.compile(mode="reduce-overhead"): forward and backward replay as CUDA graphs from
    PyTorch's graph pool."""
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 6), torch.nn.Linear(1024, 1024))
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = torch.compile(model, mode="reduce-overhead")
    for _ in range(16):
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(16, 512, 1024, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def cnn_varres_infer(torch) -> None:
    """torchvision ResNet-50, fp16, inference over 48 requests of random batch 1..32 at random
    (often non-square) resolutions 160..640: every shape is new to the allocator."""
    import torchvision

    torch.manual_seed(3)
    model = torchvision.models.resnet50().cuda().half().eval()
    g = torch.Generator().manual_seed(3)
    sides = list(range(160, 641, 32))
    with torch.no_grad():
        for _ in range(48):
            batch = int(torch.randint(1, 33, (1,), generator=g))
            h = sides[int(torch.randint(0, len(sides), (1,), generator=g))]
            w = sides[int(torch.randint(0, len(sides), (1,), generator=g))]
            x = torch.randn(batch, 3, h, w, generator=g).cuda().half()
            model(x).float().softmax(-1).argmax(-1).cpu()
    torch.cuda.synchronize()


WORKLOADS = {f.__name__: f for f in (llm_generate, compile_train, cnn_varres_infer)}
LOGS: Path | None = None  # --logs


def run_one(name: str, mode: str, out: Path | None) -> int:
    """In this process: run `name` under `mode`; print {"reserved": bytes} as the last line."""
    if MODES[mode]:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = MODES[mode]
    import torch

    if not torch.cuda.is_available():
        sys.exit("record_workloads: no CUDA device")
    if out is not None:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=10_000_000)
    WORKLOADS[name](torch)
    reserved = torch.cuda.memory_stats()["reserved_bytes.all.peak"]
    if out is not None:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with gzip.open(out, "wb", compresslevel=9) as f:
            pickle.dump(snapshot, f)
    print(json.dumps({"reserved": reserved}))
    return 0


def spawn(name: str, mode: str, out_dir: Path) -> tuple[str, str, object]:
    cmd = [sys.executable, __file__, "--run", name, "--mode", mode]
    if mode == "native":
        cmd += ["--trace", str(out_dir / f"{name}.pickle.gz")]
    start = time.monotonic()
    log = (LOGS or out_dir) / f"{name}.{mode}.log"
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True)
    f_tail = log.read_text()[-2000:]
    if p.returncode != 0:
        return name, mode, f"exit {p.returncode}: {f_tail.strip().splitlines()[-1:] or ''}"
    lines = p.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1])["reserved"]
    except (IndexError, ValueError, KeyError):
        return name, mode, f"no result line: {p.stdout[-300:]!r}"
    print(f"{name} {mode}: reserved {got} B in {time.monotonic() - start:.0f} s", flush=True)
    return name, mode, got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for the snapshots and reserved.json")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--jobs", type=int, default=3, help="processes at once (memory is per process)")
    ap.add_argument("--logs", type=Path, help="directory for each run's stderr (default: --out)")
    ap.add_argument("--run", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=sorted(MODES), default="native", help=argparse.SUPPRESS)
    ap.add_argument("--trace", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        return run_one(args.run, args.mode, args.trace)
    if args.out is None:
        ap.error("--out DIR is required")
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    global LOGS
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
        LOGS = args.logs
    results: dict[str, dict[str, object]] = {n: {} for n in names}
    # The native (recording) run of each workload first: it fills torch.compile's cache.
    order = [(n, m) for m in MODES for n in names]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        first = [pool.submit(spawn, n, "native", args.out) for n in names]
        for f in first:
            n, m, r = f.result()
            results[n][m] = r
        rest = [pool.submit(spawn, n, m, args.out) for n, m in order if m != "native"]
        for f in rest:
            n, m, r = f.result()
            results[n][m] = r
    (args.out / "reserved.json").write_text(json.dumps(results, indent=1) + "\n")
    bad = [f"{n} {m}: {r}" for n, d in results.items() for m, r in d.items() if not isinstance(r, int)]
    for b in bad:
        print("FAILED", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
