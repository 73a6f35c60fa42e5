"""bench/train/max_batch.py's search and table, with the trials faked (the real ones need a GPU):
the largest batch that fits is found for every threshold, with few trials, and an error stops
the search."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "train"))
import max_batch  # noqa: E402


def search(limit: int, max_b: int = 64, error_at: int | None = None) -> max_batch.Search:
    args = argparse.Namespace(max_batch=max_b)
    s = max_batch.Search(args, "gpt2", "native", "env", None, Path("."))

    def trial(batch):
        if batch in s.trials:
            return s.trials[batch]
        r = {"batch": batch, "error": "exit 1"} if batch == error_at else {
            "batch": batch, "fits": batch <= limit, "tokens_per_s": 100.0 * batch}
        s.trials[batch] = r
        return r

    s.trial = trial
    return s


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 5, 8, 13, 31, 32, 33, 63, 64])
def test_largest_fitting_batch(limit):
    s = search(limit)
    assert s.largest() == limit
    assert len(s.trials) <= 14, sorted(s.trials)


def test_an_error_stops_the_search():
    assert search(40, error_at=32).largest() is None


def test_tokens_per_s_counts_every_step():
    res = {"task": {"batch": 8, "micro_batches": 4, "seq_lens": [100, 300]},
           "step_times_s": [1.0, 1.0]}
    assert max_batch.tokens_per_s(res) == pytest.approx((8 * 4 * 100 + 8 * 4 * 300) / 2.0)
    assert max_batch.tokens_per_s({"task": {"batch": 8}, "step_times_s": [1.0]}) is None


def test_table_compares_with_native():
    rows = [{"model": "gpt2", "allocator": "native", "batch": 10, "tokens_per_s": 1000.0},
            {"model": "gpt2", "allocator": "cuarena", "batch": 12, "tokens_per_s": 1100.0}]
    text = max_batch.table(rows, 16)
    assert "| gpt2 | cuarena | 12 | 1.200 | 1100 | 1.100 |" in text
