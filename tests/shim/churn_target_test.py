"""The shim's churn target on the CPU: tests/data/traces/shim/churn.cuat.gz (4 streams,
1 KiB-256 MiB, frees while kernels run, recorded on the H200) replayed on the simulator with
the device 2000 events behind the host, as it was on the GPU, and the shim's defaults
(SHIM_DEFAULTS: ShimConfig::parse's, checked by tests/shim/unit/shim_config_test.cpp), must
reserve at most 1.10 times its peak of requested bytes (1.082; 1.155 with 128 MiB whole chunks,
2.34 without wait_before_grow). CUARENA_CLI: the cuarena executable."""

import json
import os
import subprocess
from pathlib import Path

SHIM_DEFAULTS = ("wait_before_grow:True,internal_dependencies:False,whole_chunk_max:32MiB,"
                 "whole_chunk_min:4MiB,loop_plan:False")
TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "shim" / "churn.cuat.gz"


def test_churn_within_ten_percent_at_lag_2000(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run([os.environ["CUARENA_CLI"], "replay", str(TRACE), "--allocator", "cuarena",
                    "--config", "sim_event_latency:2000," + SHIM_DEFAULTS, "--json", str(out)], check=True)
    ratio = json.loads(out.read_text())["results"][0]["reserved_ratio"]
    assert ratio <= 1.10, f"reserved/requested {ratio:.4f} at simulated lag 2000"
