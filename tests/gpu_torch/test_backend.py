"""cuarena.enable() makes cuarena torch's CUDA allocator, in a fresh process."""

from gpu_harness import require_gpu_torch, run_scenario

require_gpu_torch()


def test_backend_is_cuarena():
    r = run_scenario('''
        initialized_after_enable = torch.cuda.is_initialized()
        enabled = cuarena.is_enabled()
        x = torch.ones(1024, device="cuda")
        total = float(x.sum().item())
        stats = torch.cuda.memory_stats()
        cuarena.enable()  # the same configuration again: a no-op
        emit({
            "backend": torch.cuda.get_allocator_backend(),
            "enabled": enabled,
            "enabled_after": cuarena.is_enabled(),
            "initialized_after_enable": initialized_after_enable,
            "stats_len": len(stats),
            "allocated": stats.get("allocated_bytes.all.current"),
            "sum": total,
        })
    ''')
    assert r["backend"] == "cuarena", r
    assert r["enabled"] and r["enabled_after"], r
    assert r["stats_len"] > 0, "torch.cuda.memory_stats() is empty under cuarena"
    assert r["allocated"] is not None and r["allocated"] >= 4096, r
    assert r["sum"] == 1024.0


def test_bad_config_is_config_error():
    r = run_scenario('''
        import cuarena
        try:
            cuarena.enable("no_such_key:1")
            outcome = ("no error", "")
        except cuarena.ConfigError as e:
            outcome = ("ConfigError", str(e))
        except Exception as e:  # noqa: BLE001
            outcome = (type(e).__name__, str(e))
        emit({"outcome": outcome[0], "message": outcome[1],
              "is_cuarena_error": issubclass(cuarena.ConfigError, cuarena.CuarenaError),
              "enabled": cuarena.is_enabled(),
              "backend": torch.cuda.get_allocator_backend()})
    ''', enable=False, env={"CUARENA_CONF": None})
    assert r["outcome"] == "ConfigError", r
    assert "no_such_key" in r["message"], r
    assert not r["enabled"], r
    assert r["backend"] != "cuarena", r
