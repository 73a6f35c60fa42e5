#!/usr/bin/env python3
"""The largest batch each allocator trains under a memory cap, and the tokens/s there.

    python3 bench/train/max_batch.py --out DIR [--cap-gib 16] [--models gpt2,gpt2_varlen]
        [--allocators native,expandable,cuarena] [--steps 20] [--max-batch 64] [--start 1]
        [--jobs 1] [--seq N]

For each model and allocator, a binary search over the micro-batch size (train.py --batch; 4
micro-batches a step, as in compare.py's jobs): a batch passes when train.py trains --steps steps
under --memory-cap without running out of memory (exit 3 is a clean out-of-memory, anything else
an error that stops the search). Every trial is a fresh process, started as compare.py starts it
(the same environments and cuarena routes). The search assumes that a batch that fits implies
every smaller one fits; it checks batch --start first (stepping down by halves while that fails)
and doubles up to the first failure, then bisects.

--jobs N runs the searches of up to N allocators of one model at once (each process is capped,
so N x --cap-gib must fit the GPU). Their tokens/s would then be measured on a shared GPU, so
each allocator's largest batch is run once more alone, and its tokens/s taken from that run;
should that run not fit (an allocator whose footprint depends on timing), the batch below is
tried, alone, until one fits.

Prints a markdown table (model | allocator | largest batch | vs native | tokens/s at it | vs
native; a batch shown as "N+" is --max-batch, which fit: raise it) and writes
DIR/max_batch.json (every trial) and DIR/max_batch.md. Exits 1 if a trial
failed other than by running out of memory. Needs a GPU, torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import compare  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--models", default="gpt2,gpt2_varlen")
    p.add_argument("--allocators", default=",".join(compare.ALLOCATORS))
    p.add_argument("--cap-gib", type=float, default=16.0, help="memory cap, GiB (default 16)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--max-batch", type=int, default=64, help="largest batch tried")
    p.add_argument("--start", type=int, default=1, help="first batch tried (default 1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="searches run at once, one per allocator (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq", type=int, default=None,
                   help="gpt2's sequence length (train.py's default 512): a shorter one makes a "
                        "sample a smaller unit of memory, so the search tells closer allocators "
                        "apart")
    p.add_argument("--timeout", type=float, default=900, help="seconds per trial")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--cuarena-route", default="auto", choices=("auto", "env", "wrapper", "run"))
    p.add_argument("--cuarena-lib", default=None)
    return p.parse_args(argv)


def tokens_per_s(res: dict, skip: int = 5) -> float | None:
    """Training tokens per second once warm: batch x micro-batches x sequence length of each
    step after the first `skip` (all of them if there are no more), over those steps' summed
    time. The first steps build the model's kernels and the allocators' caches and plans."""
    task = res.get("task") or res  # train.py writes the task's fields at the top level
    times = res.get("step_times_s") or []
    seqs = task.get("seq_lens") or []
    if not times or len(seqs) != len(times) or not task.get("batch"):
        return None
    if len(times) > skip:
        times, seqs = times[skip:], seqs[skip:]
    tokens = sum(task["batch"] * task.get("micro_batches", 1) * s for s in seqs)
    return tokens / sum(times)


class Search:
    """One model under one allocator: trials by batch, and the search over them."""

    def __init__(self, args, model: str, allocator: str, route: str, lib: str | None,
                 out: Path):
        self.args, self.model, self.allocator = args, model, allocator
        self.route, self.lib, self.out = route, lib, out
        self.trials: dict[int, dict] = {}
        self.alone: dict[int, dict] = {}  # the reruns for tokens/s, by batch
        self.best: int | None = None

    def trial(self, batch: int, alone: bool = False) -> dict:
        """Runs train.py at `batch` (once per batch; `alone`: the rerun for tokens/s, kept apart
        from the search's); the result with "fits" set, or "error"."""
        if batch in self.trials and not alone:
            return self.trials[batch]
        tag = "-alone" if alone else ""
        res_path = self.out / f"{self.model}-{self.allocator}-b{batch}{tag}.json"
        log_path = res_path.with_suffix(".log")
        res_path.unlink(missing_ok=True)
        train_args = ["--model", self.model, "--steps", str(self.args.steps), "--seed",
                      str(self.args.seed), "--batch", str(batch), "--memory-cap",
                      str(self.args.cap_gib), "--out", str(res_path)]
        if self.args.seq:
            train_args += ["--seq", str(self.args.seq)]
        cmd = compare.run_command(self.args.python, self.allocator, self.route, train_args)
        rc = compare.run_logged(cmd, compare.run_env(self.allocator, self.route, self.lib),
                                log_path, self.args.timeout)
        data = json.loads(res_path.read_text()) if res_path.is_file() else {}
        if rc == 0 and not data.get("oom"):
            r = {"batch": batch, "fits": True, "tokens_per_s": tokens_per_s(data),
                 "reserved_peak": (data.get("memory_stats") or {}).get("reserved_bytes.all.peak")}
        elif rc == 3 and data.get("oom"):
            r = {"batch": batch, "fits": False, "oom_step": data.get("step")}
        else:
            tail = log_path.read_text().splitlines()[-15:] if log_path.is_file() else []
            r = {"batch": batch, "error": f"exit {rc}", "log_tail": tail}
        r["command"] = cmd
        if alone:
            r["alone"] = True
            self.alone[batch] = r
        else:
            self.trials[batch] = r
        print(f"max_batch: {self.model} {self.allocator} batch {batch}{tag}: "
              f"{'fits' if r.get('fits') else r.get('error') or 'out of memory'}", flush=True)
        return r

    def largest(self) -> int | None:
        """The largest batch in [1, max_batch] that fits (0: not even 1); None on an error."""
        lo, hi = 0, None  # lo fits (0: nothing yet); hi does not (None: none found yet)
        b = max(1, min(self.args.start, self.args.max_batch))
        while True:  # halve from a start that does not fit
            r = self.trial(b)
            if "error" in r:
                return None
            if r["fits"]:
                lo = b
                break
            hi = b
            if b == 1:
                return 0
            b //= 2
        while hi is None:  # double up to the first failure
            b = min(2 * lo, self.args.max_batch)
            if b == lo:
                return lo
            r = self.trial(b)
            if "error" in r:
                return None
            if r["fits"]:
                lo = b
            else:
                hi = b
        while hi - lo > 1:
            mid = (lo + hi) // 2
            r = self.trial(mid)
            if "error" in r:
                return None
            lo, hi = (mid, hi) if r["fits"] else (lo, mid)
        return lo

    def at_max(self) -> bool:
        """--max-batch itself fit: the search stopped at its bound, not at memory's."""
        return bool(self.trials.get(self.args.max_batch, {}).get("fits"))

    def largest_alone(self, best: int) -> int | None:
        """After a search run beside others: `best` rerun alone, stepping down while it does
        not fit; the batch whose lone run fits (its result in self.alone), 0, or None on an
        error."""
        b = best
        while b > 0:
            r = self.trial(b, alone=True)
            if "error" in r:
                return None
            if r["fits"]:
                return b
            b -= 1
        return 0


def table(rows: list[dict], cap: float) -> str:
    """A row with "at_max" set found --max-batch fitting: its batch is a lower bound ("64+"),
    and no batch ratio involving it is shown."""
    out = [f"Largest micro-batch (x4 per step) trained under {cap:g} GiB, and tokens/s there:", "",
           "| model | allocator | largest batch | vs native | tokens/s | vs native |",
           "|---|---|---|---|---|---|"]
    bounded = False
    for r in rows:
        native = next((n for n in rows if n["model"] == r["model"] and n["allocator"] == "native"),
                      None)

        def ratio(key):
            a, b = r.get(key), native.get(key) if native else None
            if key == "batch" and (r.get("at_max") or (native and native.get("at_max"))):
                return "-"
            return f"{a / b:.3f}" if a and b else "-"

        tps = f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else "-"
        batch = r.get("batch", "error")
        if r.get("at_max"):
            batch, bounded = f"{batch}+", True
        out.append(f"| {r['model']} | {r['allocator']} | {batch} | "
                   f"{ratio('batch')} | {tps} | {ratio('tokens_per_s')} |")
    if bounded:
        out += ["", "N+: --max-batch (N) fit, so the largest batch is not known: raise --max-batch."]
    return "\n".join(out) + "\n"


def search_model(args, model: str, route: str, lib: str | None, out: Path) -> list[Search]:
    """Every allocator's search for `model`, --jobs at once; with --jobs > 1, each largest batch
    is then rerun alone for its tokens/s. Search.best holds the answer (None: an error)."""
    searches = [Search(args, model, a, route, lib, out) for a in args.allocators.split(",")]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for s, best in zip(searches, pool.map(Search.largest, searches)):
            s.best = best
    if args.jobs > 1:
        for s in searches:
            if s.best:
                s.best = s.largest_alone(s.best)
    return searches


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    route, lib = compare.cuarena_route(args)
    rows, trials, failed = [], {}, False
    for model in args.models.split(","):
        for s in search_model(args, model, route, lib, out):
            trials[f"{model}/{s.allocator}"] = list(s.trials.values()) + list(s.alone.values())
            row = {"model": model, "allocator": s.allocator}
            if s.best is None:
                failed = True
                row["error"] = next(t["error"] for t in trials[f"{model}/{s.allocator}"]
                                    if "error" in t)
            else:
                row["batch"] = s.best
                row["at_max"] = s.at_max()
                timed = s.alone if args.jobs > 1 else s.trials
                row["tokens_per_s"] = timed[s.best]["tokens_per_s"] if s.best else None
                if args.jobs > 1 and s.best:
                    row["reserved_peak"] = timed[s.best].get("reserved_peak")
            rows.append(row)
    text = table(rows, args.cap_gib)
    print(text)
    (out / "max_batch.md").write_text(text)
    (out / "max_batch.json").write_text(json.dumps(
        {"cap_gib": args.cap_gib, "steps": args.steps, "jobs": args.jobs, "rows": rows,
         "trials": trials}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
