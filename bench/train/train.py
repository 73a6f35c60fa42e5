#!/usr/bin/env python3
"""An ordinary PyTorch training run, for comparing CUDA allocators side by side.

It knows nothing about cuarena: which allocator serves it is decided from outside (environment,
or a wrapper that installs cuarena before this script runs; see compare.py). Everything that
could differ between runs is seeded, and deterministic algorithms are asked for, so that runs
under different allocators compute the same losses.

    python3 bench/train/train.py --model {gpt2,resnet50,gpt2_varlen} --steps 30 --out r.json

Models:
  gpt2         GPT-2 small (transformers.GPT2LMHeadModel(GPT2Config()), randomly initialised),
               bf16 autocast, AdamW, gradient accumulation over 4 micro-batches of 8 x 512
               random tokens.
  gpt2_varlen  the same with the sequence length of each step drawn from [64, 1024] by a seeded
               generator (a varying shape every step: what fragments a caching allocator).
  resnet50     torchvision.models.resnet50(weights=None), fp16 autocast with GradScaler, SGD,
               batches of 64 random 224x224 images.
  llama_generate
               inference: a Llama-style decoder (transformers.LlamaForCausalLM, 12 layers, 1024
               wide, bf16, randomly initialised), one greedy generate() request per step, of a
               seeded random batch 1..16, prompt 32..512 tokens (left-padded) and 64..256 new
               tokens: a KV cache growing one token per forward, shapes that never repeat.
               Its "loss" is the sum of the generated token ids, and it reports tokens/s.

--memory-cap GIB caps the process (set_per_process_memory_fraction); out of memory then ends the
run with {"oom": true, ...} in --out and exit status 3 (bench/train/max_batch.py searches on it).

--record-history PATH records PyTorch's allocation history for the whole run
(torch.cuda.memory._record_memory_history, no stacks) and writes the snapshot there (.pickle or
.pickle.gz): a trace that `cuarena replay` and `cuarena_steady_state` read.

The JSON written to --out: per-step losses (full precision) and step times (wall time between
two torch.cuda.synchronize() calls), torch.cuda.max_memory_reserved() and
max_memory_allocated(), the device's used memory (total - free from torch.cuda.mem_get_info,
what nvidia-smi shows, all processes) sampled after every step and its peak,
torch.cuda.get_allocator_backend(), versions, the GPU's name and the allocator environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

# Deterministic cuBLAS needs this before CUDA initialises (compare.py sets it too).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

MODELS = ("gpt2", "resnet50", "gpt2_varlen", "llama_generate")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", required=True, help="result JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=None,
                   help="micro-batch size (default: 8 for GPT-2, 64 for ResNet-50)")
    p.add_argument("--micro-batches", type=int, default=4,
                   help="gradient accumulation steps for GPT-2 (default 4)")
    p.add_argument("--seq", type=int, default=512, help="sequence length for gpt2 (default 512)")
    p.add_argument("--min-seq", type=int, default=64, help="gpt2_varlen's shortest sequence")
    p.add_argument("--max-seq", type=int, default=1024, help="gpt2_varlen's longest sequence")
    p.add_argument("--memory-cap", type=float, default=None, metavar="GIB",
                   help="cap the process at this many GiB "
                        "(torch.cuda.set_per_process_memory_fraction of the device's total); "
                        "running out of memory then writes {\"oom\": true, ...} to --out and "
                        "exits 3")
    p.add_argument("--record-history", default=None, metavar="PATH",
                   help="write PyTorch's allocation history of the run here (a snapshot pickle)")
    return p.parse_args(argv)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


class GPT2Task:
    """GPT-2 small on random tokens; fixed or per-step varying sequence length."""

    def __init__(self, args, varlen: bool):
        from transformers import GPT2Config, GPT2LMHeadModel

        self.cfg = GPT2Config()
        self.batch = args.batch or 8
        self.micro = args.micro_batches
        self.varlen = varlen
        self.seq = args.seq
        self.seq_rng = random.Random(args.seed + 2)
        self.min_seq, self.max_seq = args.min_seq, min(args.max_seq, self.cfg.n_positions)
        torch.manual_seed(args.seed)
        self.model = GPT2LMHeadModel(self.cfg).cuda()
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1)
        self.gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
        self.seq_lens: list[int] = []

    def step(self) -> torch.Tensor:
        seq = self.seq_rng.randint(self.min_seq, self.max_seq) if self.varlen else self.seq
        self.seq_lens.append(seq)
        total = torch.zeros((), device="cuda", dtype=torch.float32)
        for _ in range(self.micro):
            tokens = torch.randint(0, self.cfg.vocab_size, (self.batch, seq), device="cuda",
                                   generator=self.gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = self.model(input_ids=tokens, labels=tokens, use_cache=False)
            loss = out.loss / self.micro
            loss.backward()
            total += loss.detach().float()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total

    def info(self) -> dict:
        import transformers

        return {"transformers": transformers.__version__, "batch": self.batch,
                "micro_batches": self.micro, "seq_lens": self.seq_lens,
                "params": sum(p.numel() for p in self.model.parameters()),
                "attn_implementation": getattr(self.model.config, "_attn_implementation", None)}


class ResNetTask:
    """ResNet-50 on random images, fp16 autocast with a GradScaler."""

    def __init__(self, args):
        import torchvision

        self.batch = args.batch or 64
        torch.manual_seed(args.seed)
        self.model = torchvision.models.resnet50(weights=None).cuda()
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9,
                                   weight_decay=1e-4)
        self.scaler = torch.amp.GradScaler("cuda")
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
        self.scales: list[float] = []

    def step(self) -> torch.Tensor:
        images = torch.randn(self.batch, 3, 224, 224, device="cuda", generator=self.gen)
        labels = torch.randint(0, 1000, (self.batch,), device="cuda", generator=self.gen)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.loss_fn(self.model(images), labels)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        self.scales.append(float(self.scaler.get_scale()))
        return loss.detach().float()

    def info(self) -> dict:
        import torchvision

        return {"torchvision": torchvision.__version__, "batch": self.batch,
                "grad_scales": self.scales,
                "params": sum(p.numel() for p in self.model.parameters())}


class GenerateTask:
    """Greedy generate() with a Llama-style decoder: one request of random shape per step."""

    def __init__(self, args):
        import transformers

        self.cfg = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
            num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
        torch.manual_seed(args.seed)
        self.model = transformers.LlamaForCausalLM(self.cfg).to("cuda", torch.bfloat16).eval()
        self.rng = random.Random(args.seed + 3)
        self.max_batch = args.batch or 16
        self.new_tokens: list[int] = []
        self.shapes: list[tuple[int, int, int]] = []

    def step(self) -> torch.Tensor:
        batch = self.rng.randint(1, self.max_batch)
        prompt = self.rng.randint(32, 512)
        new = self.rng.randint(64, 256)
        ids = torch.randint(3, self.cfg.vocab_size, (batch, prompt), device="cuda")
        mask = torch.ones_like(ids)
        for row in range(batch):  # left padding, as batched generation uses
            mask[row, :self.rng.randint(0, prompt // 2)] = 0
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False, pad_token_id=0)
        self.shapes.append((batch, prompt, new))
        self.new_tokens.append(batch * new)
        return out[:, prompt:].sum().float()

    def info(self) -> dict:
        import transformers

        return {"transformers": transformers.__version__, "requests": self.shapes,
                "new_tokens_per_step": self.new_tokens,
                "params": sum(p.numel() for p in self.model.parameters())}


def main(argv=None) -> int:
    args = parse_args(argv)
    seed_everything(args.seed)
    if not torch.cuda.is_available():
        print("train.py: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.cuda.current_device()
    torch.cuda.synchronize()
    free0, total_mem = torch.cuda.mem_get_info()
    used_before = total_mem - free0
    if args.memory_cap is not None:
        cap = args.memory_cap * (1 << 30)
        if not 0 < cap <= total_mem:
            print(f"train.py: --memory-cap {args.memory_cap} GiB is not within the device's "
                  f"{total_mem / (1 << 30):.1f} GiB", file=sys.stderr)
            return 2
        torch.cuda.set_per_process_memory_fraction(cap / total_mem)

    if args.record_history:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=50_000_000)
    t_build = time.perf_counter()
    try:
        if args.model == "resnet50":
            task = ResNetTask(args)
        elif args.model == "llama_generate":
            task = GenerateTask(args)
        else:
            task = GPT2Task(args, varlen=args.model == "gpt2_varlen")
    except torch.OutOfMemoryError:
        if args.memory_cap is None:
            raise
        with open(args.out, "w") as f:
            json.dump({"oom": True, "model": args.model, "step": -1,
                       "memory_cap_gib": args.memory_cap}, f, indent=1)
        print(f"train.py: out of memory building {args.model} under {args.memory_cap} GiB",
              file=sys.stderr)
        return 3
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t_build

    losses: list[float] = []
    times: list[float] = []
    used: list[int] = []
    # Physical allocations and releases per step (cudaMalloc/cudaFree for PyTorch's allocator,
    # cuMemCreate/cuMemRelease for cuarena's): 0 once an allocator has converged.
    device_calls: list[int] = []

    def calls_so_far() -> int:
        s = torch.cuda.memory_stats()
        return int(s.get("num_device_alloc", 0) + s.get("num_device_free", 0))

    # cuarena's own counters when it serves this process (its package imported and enabled);
    # {} otherwise.
    cuarena_mod = sys.modules.get("cuarena")

    def cuarena_counters() -> dict:
        if cuarena_mod is None:
            return {}
        try:
            return cuarena_mod.stats()
        except cuarena_mod.CuarenaError:
            return {}

    # Its mapping calls per step too (cuMemMap, cuMemUnmap, cuMemSetAccess): a layout that
    # converged makes none; each costs ~40 us on an H200.
    mapping_keys = ("cuarena.map_calls", "cuarena.unmap_calls", "cuarena.access_calls")

    def mapping_calls_so_far() -> int:
        own = cuarena_counters()
        return int(sum(own.get(k, 0) for k in mapping_keys))

    mapping_calls: list[int] = []

    # Host time inside cuarena's driver calls (cuarena.driver_us.<call>, microseconds).
    def driver_us_so_far() -> dict:
        return {k[len("cuarena.driver_us."):]: v for k, v in cuarena_counters().items()
                if k.startswith("cuarena.driver_us.")}

    driver_us: list[dict] = []

    for step in range(args.steps):
        calls_before = calls_so_far()
        mapping_before = mapping_calls_so_far()
        driver_before = driver_us_so_far()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            loss = task.step()
            loss_value = float(loss.item())
        except torch.OutOfMemoryError as e:
            if args.memory_cap is None:
                raise
            with open(args.out, "w") as f:
                json.dump({"oom": True, "model": args.model, "step": step,
                           "memory_cap_gib": args.memory_cap, "task": task.info(),
                           "message": str(e).splitlines()[0] if str(e) else ""}, f, indent=1)
            print(f"train.py: out of memory at step {step} under {args.memory_cap} GiB",
                  file=sys.stderr)
            return 3
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss_value)
        free, _ = torch.cuda.mem_get_info()
        used.append(total_mem - free)
        device_calls.append(calls_so_far() - calls_before)
        mapping_calls.append(mapping_calls_so_far() - mapping_before)
        driver_now = driver_us_so_far()
        driver_us.append({k: v - driver_before.get(k, 0) for k, v in driver_now.items()
                          if v != driver_before.get(k, 0)})

    if args.record_history:
        import gzip
        import pickle

        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        opener = gzip.open if args.record_history.endswith(".gz") else open
        with opener(args.record_history, "wb") as f:
            pickle.dump(snap, f)

    stats = torch.cuda.memory_stats()
    own = cuarena_counters()
    cuarena_stats = {k: own[k] for k in (
        *mapping_keys, "cuarena.events_recorded", "cuarena.sweep_polls",
        "cuarena.sweep_polls_pending", "cuarena.loop_plans", "cuarena.planned_allocations",
        "cuarena.stream_waits", "cuarena.plans_refused",
        "cuarena.stream_cache_hits", "cuarena.granules_stolen") if k in own} or None
    result = {
        "model": args.model,
        "steps": args.steps,
        "seed": args.seed,
        "memory_cap_gib": args.memory_cap,
        "losses": losses,
        "step_times_s": times,
        "device_calls_per_step": device_calls,
        "cuarena_mapping_calls_per_step": mapping_calls if cuarena_mod is not None else None,
        "cuarena_driver_us_per_step": driver_us if cuarena_mod is not None else None,
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "memory_reserved_end": torch.cuda.memory_reserved(),
        "device_used_bytes": used,
        "device_used_peak_bytes": max(used) if used else None,
        "device_used_before_bytes": used_before,
        "device_total_bytes": total_mem,
        "allocator_backend": torch.cuda.get_allocator_backend(),
        "memory_stats": {k: stats.get(k) for k in (
            "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "reserved_bytes.all.peak", "allocated_bytes.all.peak", "requested_bytes.all.peak")},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(dev),
        "python": platform.python_version(),
        "build_s": build_s,
        "env": {k: os.environ.get(k) for k in (
            "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUARENA", "CUARENA_CONF",
            "CUARENA_TORCH_LIB", "CUBLAS_WORKSPACE_CONFIG")},
        "cuarena_stats": cuarena_stats,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "argv": sys.argv,
        **task.info(),
    }
    if isinstance(task, GenerateTask) and times:
        result["tokens_per_s"] = sum(task.new_tokens) / sum(times)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"train.py: {args.model} under {result['allocator_backend']}: "
          f"final loss {losses[-1] if losses else float('nan'):.6f}, "
          f"peak reserved {result['max_memory_reserved'] / 2**20:.0f} MiB, "
          f"median step {sorted(times)[len(times) // 2] * 1e3 if times else 0:.1f} ms"
          + (f", sweep polls pending {cuarena_stats['cuarena.sweep_polls_pending']} of "
             f"{cuarena_stats['cuarena.sweep_polls']}"
             if cuarena_stats and "cuarena.sweep_polls" in cuarena_stats else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
