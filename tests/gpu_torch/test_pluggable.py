"""The pluggable ABI of libcuarena_torch.so: torch.cuda.memory.CUDAPluggableAllocator(lib,
"cuarena_malloc", "cuarena_free") + change_current_allocator in a fresh process (no
cuarena.enable), with the optional hooks PyTorch's wrapper takes; tensors of many sizes compute
correctly and empty_cache() reaches cuarena_reset."""

import os

from gpu_harness import find_lib, require_gpu_torch, run_scenario

require_gpu_torch()

SCENARIO = '''
import ctypes

path = _os.environ.get("CUARENA_TORCH_LIB")
if not path:  # a pip-installed package: its own library (import cuarena loads neither it nor CUDA)
    import cuarena
    path = str(cuarena.library_path())
alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "cuarena_malloc", "cuarena_free")
lib = ctypes.CDLL(path)
hooks = {}
raw = alloc.allocator()
for setter, symbol in (("set_init_fn", "cuarena_init"), ("set_reset_fn", "cuarena_reset"),
                       ("set_memory_fraction_fn", "cuarena_set_memory_fraction"),
                       ("set_base_alloc_fn", "cuarena_base_alloc"),
                       ("set_record_stream_fn", "cuarena_record_stream")):
    if hasattr(raw, setter):
        getattr(raw, setter)(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
        hooks[setter] = True
    else:
        hooks[setter] = False
torch.cuda.memory.change_current_allocator(alloc)

torch.manual_seed(0)
a_cpu = torch.randn(512, 512)
a = a_cpu.cuda()
c = a @ a
ok_matmul = bool(torch.allclose(c.cpu(), a_cpu @ a_cpu, rtol=1e-3, atol=1e-3))
sizes_ok = True
ts = []
for n in (1, 100, 4096, 1 << 20, 50 << 20):
    t = torch.full((n,), 3, dtype=torch.uint8, device="cuda")
    ts.append(t)
for t in ts:
    sizes_ok = sizes_ok and int(t.sum(dtype=torch.int64).item()) == 3 * t.numel()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    d = torch.ones(1 << 20, device="cuda")
    d.mul_(2)
d.record_stream(torch.cuda.current_stream())
torch.cuda.synchronize()
ok_stream = float(d.sum().item()) == 2.0 * (1 << 20)
del ts, c, d
torch.cuda.synchronize()
torch.cuda.empty_cache()
emit({"hooks": hooks, "ok_matmul": ok_matmul, "sizes_ok": sizes_ok, "ok_stream": ok_stream,
      "backend": torch.cuda.get_allocator_backend()})
'''


def test_pluggable_allocator_computes():
    lib, _ = find_lib()
    r = run_scenario(SCENARIO, enable=False,
                     env={"CUARENA_TORCH_LIB": os.fspath(lib) if lib else None,
                          "CUARENA_CONF": None})
    assert r["ok_matmul"], r
    assert r["sizes_ok"], r
    assert r["ok_stream"], r
