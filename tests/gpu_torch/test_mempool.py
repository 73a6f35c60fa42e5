"""torch.cuda.MemPool under cuarena: allocations inside use_mem_pool land in the pool's own
segments (memory_snapshot(pool.id)), others do not; deleting the pool gives its memory back;
MemPool(use_on_oom=True) where constructible."""

import pytest

from gpu_harness import SEGMENTS_TO_JSON, block_containing, ranges_containing, require_gpu_torch, \
    run_scenario

require_gpu_torch()

SCENARIO = SEGMENTS_TO_JSON + '''
import gc

torch.cuda.current_device()
torch.cuda.synchronize()
reserved_start = torch.cuda.memory_reserved()
pool = torch.cuda.MemPool()
pool_id = list(pool.id)
uc_before = pool.use_count()
with torch.cuda.use_mem_pool(pool):
    uc_inside = pool.use_count()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    xs = torch.empty(1000, device="cuda")
    x.fill_(7)
    xs.fill_(1.5)
uc_after = pool.use_count()
y = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
y.fill_(3)
torch.cuda.synchronize()
pool_segs = segments_json(torch.cuda.memory_snapshot(pool.id))
pool_segs_method = segments_json(pool.snapshot())
all_segs = segments_json(torch.cuda.memory._snapshot()["segments"])
ptrs = {"x": x.data_ptr(), "xs": xs.data_ptr(), "y": y.data_ptr()}
values_ok = bool((x == 7).all().item()) and bool((xs == 1.5).all().item())
del x, xs
torch.cuda.synchronize()
reserved_with_pool = torch.cuda.memory_reserved()
del pool
gc.collect()
torch.cuda.empty_cache()
reserved_pool_deleted = torch.cuda.memory_reserved()
del y
torch.cuda.synchronize()
torch.cuda.empty_cache()
reserved_end = torch.cuda.memory_reserved()

# use_on_oom: reported, not required
oom_pool = {}
try:
    p2 = torch.cuda.MemPool(use_on_oom=True)
    with torch.cuda.use_mem_pool(p2):
        z = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        z.fill_(1)
    oom_pool = {"constructible": True, "sum": int(z.sum().item())}
    del z, p2
    gc.collect()
    torch.cuda.empty_cache()
except Exception as e:  # noqa: BLE001
    oom_pool = {"constructible": False, "error": f"{type(e).__name__}: {e}"}

emit({"pool_id": pool_id, "uc": [uc_before, uc_inside, uc_after], "pool_segs": pool_segs,
      "pool_segs_method": pool_segs_method, "all_segs": all_segs, "ptrs": ptrs,
      "values_ok": values_ok, "reserved": {"start": reserved_start,
      "with_pool": reserved_with_pool, "pool_deleted": reserved_pool_deleted, "end": reserved_end},
      "oom_pool": oom_pool, "reserved_after_oom_pool": torch.cuda.memory_reserved()})
'''


@pytest.fixture(scope="module")
def r():
    return run_scenario(SCENARIO)


def test_pool_use_count(r):
    before, inside, after = r["uc"]
    assert before >= 1, r["uc"]
    assert inside >= before, r["uc"]
    assert after == before, r["uc"]


def test_allocations_land_in_the_pool(r):
    assert r["values_ok"]
    segs = r["pool_segs"]
    assert segs, "memory_snapshot(pool.id) shows no segment"
    for name in ("x", "xs"):
        ptr = r["ptrs"][name]
        assert ranges_containing(segs, ptr), f"{name} is not in the pool's segments"
        blk = block_containing(segs, ptr)
        assert blk is not None and blk["state"] == "active_allocated", (name, blk)
    assert not ranges_containing(segs, r["ptrs"]["y"]), "an allocation outside the pool landed in it"
    assert ranges_containing(r["all_segs"], r["ptrs"]["y"]), "y is in no segment at all"
    for s in segs:
        if s["segment_pool_id"] is not None:
            assert s["segment_pool_id"] == r["pool_id"], s
    assert sorted(s["address"] for s in r["pool_segs_method"]) == \
        sorted(s["address"] for s in segs)


def test_deleting_the_pool_returns_memory(r):
    res = r["reserved"]
    assert res["pool_deleted"] < res["with_pool"], res
    assert res["pool_deleted"] <= res["with_pool"] - (64 << 20), res
    assert res["end"] <= res["start"], res


def test_use_on_oom_pool(r):
    p = r["oom_pool"]
    if not p.get("constructible"):
        pytest.skip(f"MemPool(use_on_oom=True) not constructible: {p.get('error')}")
    assert p["sum"] == 8 << 20
    assert r["reserved_after_oom_pool"] <= r["reserved"]["end"], r
