#!/usr/bin/env bash
# gpu_busy.py under native and the given cuarena configurations, one after another.
#   bench/train/gpu_busy_all.sh OUT [CONFIG...]     (CONFIG "default": cuarena's default)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$1; shift
mkdir -p "$out"
lib=$PWD/build-gpu/lib/libcuarena_torch.so
export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
python3 bench/train/gpu_busy.py --out "$out/native.json" 2>&1 | tail -1
i=0
for conf in "$@"; do
  i=$((i + 1))
  [ "$conf" = default ] && conf=
  CUARENA_TORCH_LIB=$lib PYTHONPATH=$PWD/allocator/torch/python CUARENA_WITH_CONFIG="$conf" \
    python3 bench/train/with_cuarena.py bench/train/gpu_busy.py --out "$out/cuarena$i.json" 2>&1 | tail -1
done
