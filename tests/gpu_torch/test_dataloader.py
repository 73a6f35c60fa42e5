"""A pinned-memory DataLoader with worker processes feeding non_blocking copies to the GPU,
under cuarena: every batch arrives intact (the sums match the CPU's)."""

from gpu_harness import require_gpu_torch, run_scenario

require_gpu_torch()

SCENARIO = '''
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    torch.cuda.current_device()
    g = torch.Generator().manual_seed(0)
    data = torch.randn(4096, 256, generator=g)
    labels = torch.arange(4096)
    ds = TensorDataset(data, labels)
    dl = DataLoader(ds, batch_size=128, shuffle=False, pin_memory=True, num_workers=2)
    total = torch.zeros((), dtype=torch.float64, device="cuda")
    label_total = torch.zeros((), dtype=torch.int64, device="cuda")
    pinned, batches = [], 0
    for xb, yb in dl:
        pinned.append(xb.is_pinned() and yb.is_pinned())
        xg = xb.to("cuda", non_blocking=True)
        yg = yb.to("cuda", non_blocking=True)
        total += xg.double().sum()
        label_total += yg.sum()
        batches += 1
    torch.cuda.synchronize()
    emit({"gpu_sum": float(total.item()), "cpu_sum": float(data.double().sum().item()),
          "gpu_labels": int(label_total.item()), "cpu_labels": int(labels.sum().item()),
          "batches": batches, "all_pinned": all(pinned),
          "backend": torch.cuda.get_allocator_backend()})
'''


def test_pinned_dataloader_non_blocking():
    r = run_scenario(SCENARIO)
    assert r["backend"] == "cuarena"
    assert r["batches"] == 32
    assert r["all_pinned"], "DataLoader(pin_memory=True) gave unpinned batches"
    assert r["gpu_labels"] == r["cpu_labels"]
    assert abs(r["gpu_sum"] - r["cpu_sum"]) <= 1e-9 * max(1.0, abs(r["cpu_sum"])) + 1e-6, r
