#!/usr/bin/env bash
# Where a training step's time and bytes go, on a GPU machine with torch (one device call):
#   1. records PyTorch's allocation history of the real jobs under the native allocator (train.py
#      --record-history; run side by side, only the traces matter), so the simulator can replay
#      a whole job, warm-up steps and all: OUT/traces/<model>.pickle.gz;
#   2. runs the jobs one at a time under native and under the cuarena configurations given, with
#      cuarena's per-step driver calls and host time per driver call (cuarena.driver_us.*):
#      OUT/prof/<model>-<label>.json;
#   3. prints one line per run: peak reserved / peak requested, median step (steps 10..N), the
#      last steps' mapping calls and driver milliseconds per step by call.
#
#   bench/train/profile_jobs.sh OUT [STEPS]
#   PROFILE_MODELS="gpt2 gpt2_varlen" PROFILE_CONFIGS="whole_chunk_min:0 loop_plan:True" ...
#
# Needs build-gpu/lib/libcuarena_torch.so (built here when missing) and transformers,
# torchvision.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: profile_jobs.sh OUT [STEPS]}
steps=${2:-30}
mkdir -p "$out/traces" "$out/prof"
python=${PYTHON:-python3}
lib=$PWD/build-gpu/lib/libcuarena_torch.so
if [ ! -f "$lib" ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUARENA_WITH_TORCH=ON \
    -DPython3_EXECUTABLE="$(command -v "$python")" >"$out/build.log" 2>&1 &&
    cmake --build build-gpu -j 16 --target cuarena_torch >>"$out/build.log" 2>&1 ||
    { tail -20 "$out/build.log"; exit 1; }
fi
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF CUARENA CUARENA_CONF CUARENA_TRACE

# 1. Native histories, side by side.
pids=()
for m in ${TRACE_MODELS:-gpt2 gpt2_varlen resnet50}; do
  "$python" bench/train/train.py --model "$m" --steps "$steps" --out "$out/traces/$m.json" \
    --record-history "$out/traces/$m.pickle.gz" >"$out/traces/$m.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || echo "profile_jobs: a recording run failed"; done

# 2. One at a time: native, then cuarena under each configuration.
run() {  # run MODEL LABEL [CONFIG]
  local m=$1 label=$2 conf=${3-}
  if [ "$label" = native ]; then
    "$python" bench/train/train.py --model "$m" --steps "$steps" --out "$out/prof/$m-$label.json" \
      >"$out/prof/$m-$label.log" 2>&1
  else
    CUARENA_TORCH_LIB=$lib PYTHONPATH=$PWD/allocator/torch/python CUARENA_WITH_CONFIG="$conf" \
      "$python" bench/train/with_cuarena.py bench/train/train.py --model "$m" --steps "$steps" \
      --out "$out/prof/$m-$label.json" >"$out/prof/$m-$label.log" 2>&1
  fi || { echo "profile_jobs: $m $label failed:"; tail -5 "$out/prof/$m-$label.log"; }
}
for m in ${PROFILE_MODELS:-gpt2 gpt2_varlen}; do
  run "$m" native
  for conf in ${PROFILE_CONFIGS:-default whole_chunk_min:0 loop_plan:True,whole_chunk_min:0}; do
    label=cuarena-$(printf '%s' "$conf" | tr ':,' '=+')
    [ "$conf" = default ] && conf=
    run "$m" "$label" "$conf"
  done
done

# 3. The summary.
"$python" - "$out/prof" <<'EOF'
import json, statistics, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(f.read_text())
    ms = r["memory_stats"]
    ratio = ms["reserved_bytes.all.peak"] / max(1, ms["requested_bytes.all.peak"])
    med = statistics.median(r["step_times_s"][9:] or r["step_times_s"]) * 1e3
    calls = (r.get("cuarena_mapping_calls_per_step") or [])[-3:]
    drv = r.get("cuarena_driver_us_per_step") or []
    last = drv[-3:] if drv else []
    per_call = {}
    for d in last:
        for k, v in d.items():
            per_call[k] = per_call.get(k, 0) + v / len(last) / 1e3
    top = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_call.items(), key=lambda x: -x[1])[:4])
    print(f"{f.stem}: ratio {ratio:.4f} "
          f"reserved {ms['reserved_bytes.all.peak'] / 2**20:.0f} MiB median {med:.1f} ms "
          f"calls {calls} driver ms/step [{top}]")
EOF
tar czf "$out/profile.tar.gz" -C "$out" traces prof
