"""torch.compile(mode="reduce-overhead") under cuarena: inductor's CUDA graph trees use the
allocator's private pools and its checkpoint API (getCheckpointState after each recording,
setCheckpointPoolState when a new recording starts while graphs are being replayed,
checkPoolLiveAllocations on the slow path, which inductor's default config asserts)."""

import pytest

from gpu_harness import require_gpu_torch, run_scenario

require_gpu_torch()

SCENARIO = '''
import copy
from torch._dynamo.utils import counters


def rel(a, b):
    return float((a - b).abs().max().item() / (b.abs().max().item() + 1e-12))


torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
    torch.nn.Linear(512, 16)).cuda()
eager = copy.deepcopy(model)
compiled = torch.compile(model, mode="reduce-overhead")
gen = torch.Generator(device="cuda").manual_seed(1)
out = {"train_loss_diff": [], "train_grad_diff": [], "infer_diff": [], "infer32_diff": []}

# Training steps (forward and backward graphs), then inference at two batch sizes: each new
# recording after replays makes the tree restore the pool's checkpointed state.
for i in range(6):
    torch.compiler.cudagraph_mark_step_begin()
    x = torch.randn(64, 128, device="cuda", generator=gen)
    loss = compiled(x).square().mean()
    loss.backward()
    loss_c = loss.detach().clone()
    grads_c = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    loss_e = eager(x).square().mean()
    loss_e.backward()
    out["train_loss_diff"].append(rel(loss_c, loss_e))
    out["train_grad_diff"].append(max(rel(a, p.grad) for a, p in zip(grads_c,
                                                                       eager.parameters())))
    eager.zero_grad(set_to_none=True)

with torch.no_grad():
    for bs, key in ((64, "infer_diff"), (32, "infer32_diff")):
        for i in range(5):
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.randn(bs, 128, device="cuda", generator=gen)
            y = compiled(x).clone()
            out[key].append(rel(y, eager(x)))

torch.cuda.synchronize()
segs = torch.cuda.memory._snapshot()["segments"]
out["private_pool_segments"] = sum(1 for s in segs
                                   if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0))
out["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
out["backend"] = torch.cuda.get_allocator_backend()
emit(out)
'''


@pytest.fixture(scope="module")
def r():
    return run_scenario(SCENARIO, timeout=900)


def test_reduce_overhead_used_cuda_graphs(r):
    assert r["backend"] == "cuarena"
    assert r["cudagraph_skips"] == 0, "inductor skipped CUDA graphs; nothing of cuarena was tested"


def test_reduce_overhead_training_matches_eager(r):
    assert len(r["train_loss_diff"]) == 6
    assert max(r["train_loss_diff"]) < 1e-3, r["train_loss_diff"]
    assert max(r["train_grad_diff"]) < 1e-3, r["train_grad_diff"]


def test_reduce_overhead_inference_matches_eager(r):
    assert max(r["infer_diff"]) < 1e-3, r["infer_diff"]
    assert max(r["infer32_diff"]) < 1e-3, r["infer32_diff"]
