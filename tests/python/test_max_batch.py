"""bench/train/max_batch.py's search and table, with the trials faked (the real ones need a GPU):
the largest batch that fits is found for every threshold, with few trials, and an error stops
the search."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "train"))
import max_batch  # noqa: E402


def search(limit: int, max_b: int = 64, error_at: int | None = None, start: int = 1,
           alone_limit: int | None = None) -> max_batch.Search:
    """A search whose trials fit up to `limit` (up to `alone_limit` when run alone)."""
    args = argparse.Namespace(max_batch=max_b, start=start)
    s = max_batch.Search(args, "gpt2", "native", "env", None, Path("."))

    def trial(batch, alone=False):
        runs = s.alone if alone else s.trials
        if batch in runs and not alone:
            return runs[batch]
        fits = batch <= (alone_limit if alone and alone_limit is not None else limit)
        r = {"batch": batch, "error": "exit 1"} if batch == error_at else {
            "batch": batch, "fits": fits, "tokens_per_s": 100.0 * batch}
        runs[batch] = r
        return r

    s.trial = trial
    return s


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 5, 8, 13, 31, 32, 33, 63, 64])
def test_largest_fitting_batch(limit):
    s = search(limit)
    assert s.largest() == limit
    assert len(s.trials) <= 14, sorted(s.trials)


@pytest.mark.parametrize("start", [1, 3, 8, 12, 64, 100])
@pytest.mark.parametrize("limit", [0, 1, 7, 8, 9, 11, 12, 13, 40, 64])
def test_any_start_finds_the_same_batch(limit, start):
    s = search(limit, start=start)
    assert s.largest() == limit
    assert len(s.trials) <= 16, sorted(s.trials)


def test_a_start_near_the_answer_saves_trials():
    assert len(search(9, start=8).trials) == 0
    near, far = search(9, start=8), search(9)
    assert near.largest() == far.largest() == 9
    assert len(near.trials) < len(far.trials)


@pytest.mark.parametrize("alone_limit,expect", [(9, 9), (12, 9), (7, 7), (0, 0)])
def test_the_lone_rerun_steps_down_until_it_fits(alone_limit, expect):
    s = search(9, alone_limit=alone_limit)
    assert s.largest_alone(s.largest()) == expect
    if expect:
        assert s.alone[expect]["fits"]
    assert all(not r["fits"] for b, r in s.alone.items() if b > expect)


def test_an_error_stops_the_search():
    assert search(40, error_at=32).largest() is None


def test_tokens_per_s_counts_every_step():
    res = {"task": {"batch": 8, "micro_batches": 4, "seq_lens": [100, 300]},
           "step_times_s": [1.0, 1.0]}
    assert max_batch.tokens_per_s(res) == pytest.approx((8 * 4 * 100 + 8 * 4 * 300) / 2.0)
    assert max_batch.tokens_per_s({"task": {"batch": 8}, "step_times_s": [1.0]}) is None
    # train.py's own JSON: the task's fields at the top level
    top = {"batch": 8, "micro_batches": 4, "seq_lens": [100, 300], "step_times_s": [1.0, 1.0]}
    assert max_batch.tokens_per_s(top) == pytest.approx((8 * 4 * 100 + 8 * 4 * 300) / 2.0)


def test_tokens_per_s_leaves_out_the_warm_up_steps():
    res = {"batch": 2, "micro_batches": 1, "seq_lens": [10] * 7,
           "step_times_s": [9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 1.0]}
    assert max_batch.tokens_per_s(res) == pytest.approx(2 * 10 * 2 / 2.0)
    assert max_batch.tokens_per_s(res, skip=0) == pytest.approx(2 * 10 * 7 / 47.0)


def test_table_compares_with_native():
    rows = [{"model": "gpt2", "allocator": "native", "batch": 10, "tokens_per_s": 1000.0},
            {"model": "gpt2", "allocator": "cuarena", "batch": 12, "tokens_per_s": 1100.0}]
    text = max_batch.table(rows, 16)
    assert "| gpt2 | cuarena | 12 | 1.200 | 1100 | 1.100 |" in text


def test_a_batch_at_the_bound_is_a_lower_bound():
    at, below = search(64), search(63)
    assert at.largest() == 64 and at.at_max()
    assert below.largest() == 63 and not below.at_max()
    rows = [{"model": "gpt2", "allocator": "native", "batch": 64, "at_max": True,
             "tokens_per_s": 1000.0},
            {"model": "gpt2", "allocator": "cuarena", "batch": 64, "at_max": True,
             "tokens_per_s": 1100.0}]
    text = max_batch.table(rows, 16)
    assert "| gpt2 | cuarena | 64+ | - | 1100 | 1.100 |" in text
    assert "raise --max-batch" in text
    assert "raise --max-batch" not in max_batch.table([dict(r, at_max=False) for r in rows], 16)


def test_parallel_searches_take_tokens_per_s_from_the_lone_runs(monkeypatch):
    limits = {"native": 8, "expandable": 9, "cuarena": 11}
    shared = {"native": 8, "expandable": 10, "cuarena": 11}  # expandable fits more beside others

    def trial(self, batch, alone=False):
        fits = batch <= (limits if alone else shared)[self.allocator]
        r = {"batch": batch, "fits": fits, "tokens_per_s": (1.0 if alone else 0.5) * batch}
        (self.alone if alone else self.trials)[batch] = r
        return r

    monkeypatch.setattr(max_batch.Search, "trial", trial)
    args = argparse.Namespace(max_batch=64, start=8, jobs=3, allocators="native,expandable,cuarena")
    got = {s.allocator: s for s in max_batch.search_model(args, "gpt2", "env", None, Path("."))}
    assert {a: s.best for a, s in got.items()} == limits
    assert got["expandable"].alone[9]["tokens_per_s"] == 9.0
    assert not got["expandable"].alone[10]["fits"]


@pytest.mark.parametrize("seq", [None, 128])
def test_a_trial_passes_the_sequence_length_on(monkeypatch, tmp_path, seq):
    seen = []
    monkeypatch.setattr(max_batch.compare, "run_logged", lambda cmd, env, log, timeout: (
        seen.append(cmd), 1)[1])
    args = argparse.Namespace(max_batch=64, steps=20, seed=0, cap_gib=16.0, python="python3",
                              timeout=10, seq=seq)
    r = max_batch.Search(args, "gpt2", "native", "env", None, tmp_path).trial(8)
    assert r["error"] == "exit 1"
    [cmd] = seen
    assert ("--seq" in cmd) == (seq is not None)
    if seq:
        assert cmd[cmd.index("--seq") + 1] == "128"
