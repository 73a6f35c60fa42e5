"""torch.cuda's memory API (statistics, peaks, empty_cache, summary, mem_get_info) and
torch.accelerator's, which reads c10's second allocator registry, under cuarena."""

import pytest

from gpu_harness import require_gpu_torch, run_scenario

require_gpu_torch()

MiB = 1 << 20
# float32 tensors of these byte sizes: a small one, 1 MiB, 10 MiB, 100 MiB.
SIZES = [4000, 1 * MiB, 10 * MiB, 100 * MiB]

KEYS = ["allocated_bytes.all.current", "reserved_bytes.all.peak", "requested_bytes.all.current",
        "num_ooms", "active.all.current", "segment.all.current", "allocation.large_pool.current",
        "allocation.small_pool.current"]

SCENARIO = '''
import gc

SIZES = %r
dev = torch.cuda.current_device()  # initialises CUDA (cuarena is already in place)
torch.cuda.synchronize()
base_stats = torch.cuda.memory_stats()
base_alloc = torch.cuda.memory_allocated()
base_req = base_stats.get("requested_bytes.all.current", 0)
ts = [torch.empty(n // 4, dtype=torch.float32, device="cuda") for n in SIZES]
torch.cuda.synchronize()
nbytes = [t.nbytes for t in ts]
live = {
    "allocated": torch.cuda.memory_allocated(),
    "max_allocated": torch.cuda.max_memory_allocated(),
    "reserved": torch.cuda.memory_reserved(),
    "max_reserved": torch.cuda.max_memory_reserved(),
}
stats = torch.cuda.memory_stats()
own = cuarena.stats()
summary = torch.cuda.memory_summary()
accel_allocated = torch.accelerator.memory_allocated()
accel_stats = torch.accelerator.memory_stats()
accel_reserved = torch.accelerator.memory_reserved()
free, total = torch.cuda.mem_get_info()
props_total = torch.cuda.get_device_properties(dev).total_memory

del ts
torch.cuda.synchronize()
after_del = {"allocated": torch.cuda.memory_allocated(),
             "max_allocated": torch.cuda.max_memory_allocated(),
             "reserved": torch.cuda.memory_reserved()}
free_cached, _ = torch.cuda.mem_get_info()
available = cuarena.memory_available()
torch.cuda.reset_peak_memory_stats()
after_reset = {"allocated": torch.cuda.memory_allocated(),
               "max_allocated": torch.cuda.max_memory_allocated(),
               "reserved": torch.cuda.memory_reserved(),
               "peak_reserved": torch.cuda.memory_stats()["reserved_bytes.all.peak"]}
torch.cuda.empty_cache()
after_empty = {"allocated": torch.cuda.memory_allocated(),
               "reserved": torch.cuda.memory_reserved()}

# torch.accelerator.empty_cache goes through c10's registry, not torch.cuda's pointer.
t = torch.empty(100 * 2**20 // 4, device="cuda")
torch.cuda.synchronize()
del t
torch.cuda.synchronize()
accel_before_empty = torch.accelerator.memory_reserved()
torch.accelerator.empty_cache()
accel_after_empty = torch.accelerator.memory_reserved()

emit({
    "base_alloc": base_alloc, "base_req": base_req, "nbytes": nbytes, "live": live,
    "stats": {k: stats.get(k) for k in %r},
    "stats_keys": sorted(stats),
    "own": {k: own.get(k) for k in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                                    "cuarena.map_calls", "cuarena.memory_first",
                                    "cuarena.driver_us.cuMemMap", "cuarena.driver_us.cuMemCreate")},
    "summary": summary,
    "accel_allocated": accel_allocated, "accel_reserved": accel_reserved,
    "accel_stats_allocated": accel_stats.get("allocated_bytes.all.current"),
    "accel_stats_reserved": accel_stats.get("reserved_bytes.all.current"),
    "accel_stats_len": len(accel_stats),
    "free": free, "total": total, "props_total": props_total,
    "after_del": after_del, "free_cached": free_cached, "available": available,
    "after_reset": after_reset, "after_empty": after_empty,
    "accel_before_empty": accel_before_empty, "accel_after_empty": accel_after_empty,
})
''' % (SIZES, KEYS)


@pytest.fixture(scope="module")
def r():
    return run_scenario(SCENARIO)


def _format_size(sz, pref_sz):
    # torch.cuda.memory_summary's own formatting (torch/cuda/memory.py)
    prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_sz < 768 * 1024:
            break
        prefix = new_prefix
        sz //= 1024
        pref_sz /= 1024
    return f"{sz:6d} {prefix}"


def test_memory_allocated_counts_the_tensors(r):
    n = len(SIZES)
    total = sum(r["nbytes"])
    assert total == sum(SIZES)
    grew = r["live"]["allocated"] - r["base_alloc"]
    assert grew >= total, r["live"]
    assert grew <= 1.25 * total + 512 * n, (grew, total)
    assert r["live"]["max_allocated"] >= r["live"]["allocated"]
    assert r["live"]["reserved"] >= r["live"]["allocated"]
    assert r["live"]["max_reserved"] >= r["live"]["reserved"]


def test_memory_stats_has_pytorch_keys(r):
    missing = [k for k in KEYS if r["stats"][k] is None]
    assert not missing, f"memory_stats() lacks {missing}; has {r['stats_keys'][:40]}"
    assert r["stats"]["allocated_bytes.all.current"] == r["live"]["allocated"]
    assert r["stats"]["requested_bytes.all.current"] - r["base_req"] == sum(r["nbytes"])
    assert r["stats"]["reserved_bytes.all.peak"] >= r["live"]["reserved"]
    assert r["stats"]["num_ooms"] == 0
    assert r["stats"]["active.all.current"] >= len(SIZES)
    assert r["stats"]["segment.all.current"] >= 1
    # the 100 MiB tensor is in the large pool, the 4000-byte one in the small pool (as in PyTorch)
    assert r["stats"]["allocation.large_pool.current"] >= 1
    assert r["stats"]["allocation.small_pool.current"] >= 1


def test_memory_summary_shows_the_numbers(r):
    s = r["summary"]
    assert isinstance(s, str) and "Allocated memory" in s
    cur = r["stats"]["allocated_bytes.all.current"]
    line = next(ln for ln in s.splitlines() if "Allocated memory" in ln)
    assert _format_size(cur, cur) in line, (line, cur)


def test_empty_cache_and_peaks(r):
    assert r["after_del"]["allocated"] == r["base_alloc"]
    assert r["after_del"]["max_allocated"] >= r["live"]["allocated"]
    assert r["after_reset"]["max_allocated"] == r["after_reset"]["allocated"]
    assert r["after_reset"]["peak_reserved"] == r["after_reset"]["reserved"]
    assert r["after_empty"]["allocated"] == r["base_alloc"]
    assert r["after_empty"]["reserved"] < r["after_del"]["reserved"], (r["after_del"],
                                                                     r["after_empty"])


def test_cuarena_stats_add_its_own_counters_to_torchs(r):
    own = r["own"]
    # No CUDA-graph pool here: cuarena's main allocator holds everything torch counts.
    assert own["allocated_bytes.all.current"] == r["stats"]["allocated_bytes.all.current"]
    assert own["reserved_bytes.all.current"] == r["live"]["reserved"]
    assert own["cuarena.map_calls"] > 0, own  # the tensors' memory was mapped
    assert own["cuarena.memory_first"] == 1, own  # the default
    # Host time inside the driver, per call: the maps and creates behind those tensors took some
    assert own["cuarena.driver_us.cuMemMap"] > 0 and own["cuarena.driver_us.cuMemCreate"] > 0, own


def test_mem_get_info_and_memory_available(r):
    assert r["total"] == r["props_total"]
    assert 0 < r["free"] <= r["total"]
    # cuarena's answer counts cached memory it could hand out: at least what the driver reports
    # free (taken just before), at most the device
    assert r["free_cached"] <= r["available"] <= r["total"], (r["free_cached"], r["available"])


def test_accelerator_registry_is_cuarena(r):
    assert r["accel_stats_len"] > 0, "torch.accelerator.memory_stats() is empty"
    assert r["accel_allocated"] == r["live"]["allocated"]
    assert r["accel_stats_allocated"] == r["stats"]["allocated_bytes.all.current"]
    assert r["accel_reserved"] == r["live"]["reserved"]
    assert r["accel_after_empty"] < r["accel_before_empty"], (r["accel_before_empty"],
                                                              r["accel_after_empty"])
