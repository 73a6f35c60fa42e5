"""Tensor.record_stream under cuarena: a block allocated on s1, used on s2 behind a long kernel
and freed from the host while s2 still works on it must not be handed to a new allocation on s1
before s2 is done. If it were, s1's writes to the new tensor would land first and s2's later
reads and writes would clobber or see them."""

import pytest

from gpu_harness import require_gpu_torch, run_scenario

require_gpu_torch()

SCENARIO = '''
s1 = torch.cuda.Stream()
s2 = torch.cuda.Stream()
results = []
# A small size (cuarena's slabs) and a large one (best-fit blocks).
for numel in (1024, 16 << 20):
    with torch.cuda.stream(s1):
        a = torch.empty(numel, device="cuda")
        a.fill_(1.0)
    a_ptr = a.data_ptr()
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(CYCLES)      # s2 is busy for a while
        seen = a.clone()              # reads a after the sleep: must still be 1.0
        a.fill_(7.0)                  # then writes a known pattern
        after = a.clone()             # and reads it back: must be 7.0
        a.record_stream(s2)
    del a                             # freed from the host while s2 still sleeps
    s2_busy_at_free = not s2.query()
    with torch.cuda.stream(s1):
        b = torch.empty(numel, device="cuda")
        b.fill_(-1.0)                 # runs at once on s1 unless the allocator waited
    torch.cuda.synchronize()
    results.append({
        "numel": numel,
        "s2_busy_at_free": s2_busy_at_free,
        "reused_address": b.data_ptr() == a_ptr,
        "seen_ok": bool((seen == 1.0).all().item()),
        "after_ok": bool((after == 7.0).all().item()),
        "b_ok": bool((b == -1.0).all().item()),
    })
    del b, seen, after
emit({"results": results})
'''.replace("CYCLES", str(1 << 30))  # about half a second at the H200's ~2 GHz


@pytest.fixture(scope="module")
def r():
    return run_scenario(SCENARIO)


@pytest.mark.parametrize("index", [0, 1], ids=["small", "large"])
def test_record_stream_protects_the_block(r, index):
    res = r["results"][index]
    assert res["s2_busy_at_free"], f"s2 finished before the free; the test proved nothing: {res}"
    assert res["seen_ok"], f"s2 read data written by s1's new allocation: {res}"
    assert res["after_ok"], res
    assert res["b_ok"], f"s2's writes clobbered s1's new allocation (reused too early): {res}"
