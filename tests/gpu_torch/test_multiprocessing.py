"""torch.multiprocessing with the spawn start method under cuarena: a CUDA tensor allocated by
cuarena goes to a child through a Queue (CUDA IPC: shareIpcHandle in the parent, getIpcDevPtr
in the child) and the child, which enables cuarena too (the scenario's prelude runs again at
its import), returns its sum."""

from gpu_harness import require_gpu_torch, run_scenario

require_gpu_torch()

SCENARIO = '''
import torch.multiprocessing as mp


def child(q_in, q_out):
    t = q_in.get()
    s = float(t.double().sum().item())
    big = q_in.get()
    q_out.put({"sum": s, "big_sum": float(big.double().sum().item()),
               "backend": torch.cuda.get_allocator_backend(),
               "enabled": cuarena.is_enabled(), "device": str(t.device)})
    del t, big
    q_in.get()  # wait until the parent has the answer, then release the tensors


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    t = torch.arange(1000, dtype=torch.float32, device="cuda")     # small: a slab block
    big = torch.full((8 << 20,), 0.5, device="cuda")                 # 32 MiB: a large block
    torch.cuda.synchronize()
    p = ctx.Process(target=child, args=(q_in, q_out))
    p.start()
    q_in.put(t)
    q_in.put(big)
    got = q_out.get(timeout=240)
    q_in.put("done")
    p.join(timeout=120)
    emit({"child": got, "sum": float(t.double().sum().item()),
          "big_sum": float(big.double().sum().item()), "exitcode": p.exitcode,
          "backend": torch.cuda.get_allocator_backend()})
'''


def test_spawned_child_reads_a_shared_cuda_tensor():
    r = run_scenario(SCENARIO, timeout=400)
    assert r["backend"] == "cuarena"
    assert r["exitcode"] == 0, r
    c = r["child"]
    assert c["backend"] == "cuarena" and c["enabled"], c
    assert c["sum"] == r["sum"] == 499500.0
    assert c["big_sum"] == r["big_sum"] == float(8 << 20) * 0.5
