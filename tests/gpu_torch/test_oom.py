"""Out of memory under cuarena: torch.OutOfMemoryError naming cuarena and the sizes, counted in
num_ooms, nothing leaked, and the process allocates normally afterwards; also under
set_per_process_memory_fraction, whose limit must hold."""

import re

import pytest

from gpu_harness import require_gpu_torch, run_scenario

require_gpu_torch()

CHUNK = 256 << 20
FRACTION = 0.05

SCENARIO = '''
CHUNK, FRACTION = %d, %r


def attempt(fn):
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001 - the type is part of the result
        return {"type": type(e).__name__, "is_oom": isinstance(e, torch.OutOfMemoryError),
                "message": str(e)}


torch.cuda.current_device()
free, total = torch.cuda.mem_get_info()
keep = torch.ones(1 << 18, device="cuda")
torch.cuda.synchronize()
base = torch.cuda.memory_allocated()

# 1. One tensor larger than the device.
err_big = attempt(lambda: torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda"))
after_big = torch.cuda.memory_allocated()
ooms_big = torch.cuda.memory_stats()["num_ooms"]

# 2. Under a per-process fraction: allocate chunks until the allocator refuses.
torch.cuda.set_per_process_memory_fraction(FRACTION)
chunks = []
err_frac = None
for _ in range(int(total * FRACTION) // CHUNK + 8):
    try:
        chunks.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
    except Exception as e:  # noqa: BLE001
        err_frac = {"type": type(e).__name__, "is_oom": isinstance(e, torch.OutOfMemoryError),
                    "message": str(e)}
        break
n_chunks = len(chunks)
reserved_at_limit = torch.cuda.memory_reserved()
del chunks
torch.cuda.synchronize()
after_frac = torch.cuda.memory_allocated()
again = torch.empty(CHUNK, dtype=torch.uint8, device="cuda")
again.fill_(5)
again_ok = bool((again == 5).all().item())
del again
torch.cuda.set_per_process_memory_fraction(1.0)
big = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
big.fill_(1)
big_ok = int(big[-1].item()) == 1
del big
torch.cuda.synchronize()
emit({"total": total, "base": base, "err_big": err_big, "after_big": after_big,
      "ooms_big": ooms_big, "err_frac": err_frac, "n_chunks": n_chunks,
      "reserved_at_limit": reserved_at_limit, "after_frac": after_frac, "again_ok": again_ok,
      "big_ok": big_ok, "final": torch.cuda.memory_allocated(),
      "ooms": torch.cuda.memory_stats()["num_ooms"], "keep_ok": bool((keep == 1).all().item())})
''' % (CHUNK, FRACTION)

SIZE_RE = re.compile(r"\d+(\.\d+)?\s*(bytes|B|KiB|MiB|GiB|TiB)\b")


@pytest.fixture(scope="module")
def r():
    return run_scenario(SCENARIO)


def _check_error(err):
    assert err is not None, "no error was raised"
    assert err["is_oom"], f"raised {err['type']}, not torch.OutOfMemoryError: {err['message']}"
    assert "cuarena" in err["message"].lower(), err["message"]
    assert SIZE_RE.search(err["message"]), f"no size in the message: {err['message']}"


def test_oom_bigger_than_device(r):
    _check_error(r["err_big"])
    assert r["ooms_big"] >= 1
    assert r["after_big"] == r["base"], "the failed allocation left memory allocated"


def test_oom_under_memory_fraction(r):
    _check_error(r["err_frac"])
    limit = FRACTION * r["total"]
    assert r["n_chunks"] * CHUNK <= limit, (r["n_chunks"], limit)
    # as in PyTorch, the fraction caps reserved memory (one 2 MiB granule of slack)
    assert r["reserved_at_limit"] <= limit + (2 << 20), (r["reserved_at_limit"], limit)
    # the allocator should get close to its limit before refusing (1 GiB of slack)
    assert r["n_chunks"] * CHUNK >= limit - (1 << 30), (r["n_chunks"], limit)
    assert r["ooms"] >= 2


def test_the_message_explains_itself(r):
    # What the process holds and could reuse, what the device and the others have, the largest
    # block that could be built, and the commands that find a setting that fits.
    msg = r["err_frac"]["message"]
    for part in ("allocated by PyTorch", "reserved by cuarena", "free and reusable",
                 "used by other processes", "largest block cuarena could build now is",
                 "CUARENA_TRACE=", "python -m cuarena replay", "--min-capacity"):
        assert part in msg, (part, msg)


def test_recovers_after_oom(r):
    assert r["after_frac"] == r["base"]
    assert r["again_ok"] and r["big_ok"] and r["keep_ok"]
    assert r["final"] == r["base"], "memory leaked across the out-of-memory errors"
