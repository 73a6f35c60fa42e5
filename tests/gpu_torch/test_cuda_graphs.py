"""CUDA graphs under cuarena: a captured forward+backward replayed with new inputs equals eager;
two graphs sharing one pool (graph_pool_handle); the pools' memory goes back after the graphs
and their outputs are deleted and empty_cache() runs."""

import pytest

from gpu_harness import SEGMENTS_TO_JSON, require_gpu_torch, run_scenario

require_gpu_torch()

SCENARIO = SEGMENTS_TO_JSON + '''
import copy, gc


def rel(a, b):
    return float((a - b).abs().max().item() / (b.abs().max().item() + 1e-12))


def pool_segments(pool_ids=None):
    segs = segments_json(torch.cuda.memory._snapshot()["segments"])
    if pool_ids is None:
        return [s for s in segs if s["segment_pool_id"] not in (None, [0, 0])]
    return [s for s in segs if s["segment_pool_id"] in pool_ids]


torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256),
    torch.nn.LayerNorm(256), torch.nn.Linear(256, 10)).cuda()
ref = copy.deepcopy(model)
static_x = torch.randn(64, 256, device="cuda")
static_t = torch.randn(64, 10, device="cuda")


def step(m, x, t):
    loss = torch.nn.functional.mse_loss(m(x), t)
    loss.backward()
    return loss


# Warm up on a side stream (PyTorch's recipe), then capture forward + backward.
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        step(model, static_x, static_t)
torch.cuda.current_stream().wait_stream(s)
model.zero_grad(set_to_none=True)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_loss = step(model, static_x, static_t)
graph_pool = list(g.pool())

gen = torch.Generator(device="cuda").manual_seed(1)
losses, loss_diffs, grad_diffs = [], [], []
for i in range(5):
    x = torch.randn(64, 256, device="cuda", generator=gen)
    t = torch.randn(64, 10, device="cuda", generator=gen)
    static_x.copy_(x)
    static_t.copy_(t)
    g.replay()
    ref.zero_grad(set_to_none=True)
    loss_ref = step(ref, x, t)
    losses.append(float(static_loss.item()))
    loss_diffs.append(rel(static_loss, loss_ref))
    grad_diffs.append(max(rel(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                               ref.parameters())))

# Two graphs in one pool; the second reads the first's output.
pool = torch.cuda.graph_pool_handle()
a_in = torch.randn(1 << 20, device="cuda")
W = torch.randn(1024, 1024, device="cuda")


def f1(a):
    return (a * 2 + 1).sin()


def f2(y):
    y = y.view(1024, 1024)
    return (y @ W).relu() + y.cos()


s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):
        f2(f1(a_in))
torch.cuda.current_stream().wait_stream(s)
g1 = torch.cuda.CUDAGraph()
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g1, pool=pool):
    y1 = f1(a_in)
with torch.cuda.graph(g2, pool=pool):
    y2 = f2(y1)
shared_diffs = []
for i in range(5):
    a_in.copy_(torch.randn(1 << 20, device="cuda", generator=gen))
    g1.replay()
    g2.replay()
    e2 = f2(f1(a_in))
    shared_diffs.append(rel(y2, e2))
del e2
torch.cuda.synchronize()
pool_ids = [graph_pool, list(pool)]
segs_during = pool_segments(pool_ids)
shared_pool_segments = len(pool_segments([list(pool)]))
allocated_before = torch.cuda.memory_allocated()
reserved_before = torch.cuda.memory_reserved()

del g, g1, g2, static_loss, y1, y2, loss_ref, x, t
model.zero_grad(set_to_none=True)  # the grads live in the first graph's pool
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
brief = lambda segs: [(s["segment_pool_id"], s["total_size"], s["allocated_size"]) for s in segs]
left_with_workspaces = brief(pool_segments(pool_ids))
# cuBLAS keeps a workspace per (handle, stream), allocated during the capture from the graph's
# pool; PyTorch frees those only when asked, and until then they pin their segments.
torch._C._cuda_clearCublasWorkspaces()
torch.cuda.empty_cache()
emit({
    "losses": losses, "loss_diffs": loss_diffs, "grad_diffs": grad_diffs,
    "shared_diffs": shared_diffs,
    "pool_segments_during": len(segs_during), "shared_pool_segments": shared_pool_segments,
    "left_with_workspaces": left_with_workspaces,
    "pool_segments_left": brief(pool_segments(pool_ids)),
    "pool_segments_after": len(pool_segments(pool_ids)),
    "allocated_before": allocated_before, "allocated_after": torch.cuda.memory_allocated(),
    "reserved_before": reserved_before, "reserved_after": torch.cuda.memory_reserved(),
})
'''


@pytest.fixture(scope="module")
def r():
    return run_scenario(SCENARIO)


def test_captured_training_step_equals_eager(r):
    assert len(set(r["losses"])) == 5, f"replays did not see the new inputs: {r['losses']}"
    assert max(r["loss_diffs"]) < 1e-4, r["loss_diffs"]
    assert max(r["grad_diffs"]) < 1e-4, r["grad_diffs"]


def test_two_graphs_share_a_pool(r):
    assert max(r["shared_diffs"]) < 1e-4, r["shared_diffs"]
    assert r["pool_segments_during"] >= 1, "no snapshot segment carries a graph pool's id"
    assert r["shared_pool_segments"] >= 1, "the shared pool has no segment in the snapshot"


def test_graph_memory_returns_after_delete(r):
    assert r["pool_segments_after"] == 0, (r["pool_segments_left"], r["left_with_workspaces"])
    assert r["allocated_after"] < r["allocated_before"], r
    assert r["reserved_after"] < r["reserved_before"], r
