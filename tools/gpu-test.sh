#!/usr/bin/env bash
# The GPU test suite, for a machine with an NVIDIA GPU, the CUDA toolkit and PyTorch (the H200):
# builds with CUDA and the PyTorch replayer, runs the GPU unit and stress tests (also under
# compute-sanitizer memcheck), and replays every bundled trace with real memory and --verify
# through cuarena and the alternatives. Ends with a line "N passed, N failed".
#
# Build dependencies come from the system or, where it lacks them, from Debian packages placed
# in .deps/ (see tools/fetch-gpu-deps.sh), unpacked under /opt/cuarena-deps. RMM (the rmm-pool
# and rmm-arena replay rows) comes from the wheels in .deps/wheels (tools/replay/README.md),
# unpacked into /opt/cuarena-deps/rmm; without them those rows are skipped.
# Where the system lacks them and .deps/ holds no .debs, the script says which build
# dependencies are missing and how to fetch them (tools/fetch-gpu-deps.sh), then tries anyway.
# Logs go to $OUT (or ./gpu-test-out). Parts, each meant to fit one 10-minute device call (the
# build is incremental after the first):
#   CUARENA_GPU_PART=1  the build and the C++ tests (gpu_tests, memcheck, core_tests)
#   CUARENA_GPU_PART=2  the replays and benchmarks
#   CUARENA_GPU_PART=3  the PyTorch suite tests/gpu_torch under real torch (torch_tests: cuarena
#                       installed through libcuarena_torch.so from build-gpu and the package
#                       from allocator/torch/python, no pip install; each scenario in a fresh
#                       process), except the training comparison
#   CUARENA_GPU_PART=4  the training comparison: bench/train/compare.py (train_compare: GPT-2,
#                       ResNet-50, GPT-2 varlen, 30 steps each under native, expandable segments
#                       and cuarena; its table goes to the log and to $OUT/train/compare.md), then
#                       tests/gpu_torch/test_training.py checking its compare.json (train_tests)
#   CUARENA_GPU_PART=build  only the build (what the other parts start with)
#   CUARENA_GPU_PART=5  the LD_PRELOAD shim (libcuarena_preload.so, from the same build):
#                       tests/shim/gpu/run.sh, in three steps: shim_programs (the CUDA programs of
#                       tests/shim/gpu without and with the shim, shim_stress under
#                       compute-sanitizer memcheck, CUARENA_LOG/CUARENA_TRACE; one PASS/FAIL line
#                       per case in its log, each case's output in $OUT/shim_gpu/), shim_jobs
#                       (tests/shim/jobs under pytest, CUARENA_SHIM_JOBS_REQUIRED=1: a missing
#                       framework fails) and shim_bench (bench/shim/compare.py, its results in
#                       $OUT/shim); the last two are skipped where their files are absent.
#                       The build for this part makes only shim_gpu and the cuarena CLI;
#                       CUARENA_SHIM_GROUPS="programs jobs" runs only those steps
# Unset runs everything (part 1, the shim, the training comparison, the whole PyTorch suite,
# part 2).
# The PyTorch suite (a fresh process per scenario, torch.compile among them) and the training
# comparison (nine training runs) each take minutes: too much to add to part 1 beside its build
# (timings in docs/results.md).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-test-out}
mkdir -p "$out"
passed=0
failed=0
step() {  # step NAME COMMAND...: runs COMMAND, logging to $out/NAME.log
  local name=$1
  shift
  if "$@" >"$out/$name.log" 2>&1; then
    passed=$((passed + 1))
    echo "PASS $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name (exit $?; last lines of $out/$name.log:)"
    tail -15 "$out/$name.log"
  fi
}

if ls .deps/*.deb >/dev/null 2>&1; then
  mkdir -p /opt/cuarena-deps
  for f in .deps/*.deb; do dpkg -x "$f" /opt/cuarena-deps; done
  export CMAKE_PREFIX_PATH=/opt/cuarena-deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=/opt/cuarena-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# Build dependencies: say what is missing where neither the system nor .deps/ provides it.
have_header() {
  local d
  for d in /usr/include /usr/local/include /opt/cuarena-deps/usr/include; do
    [ -e "$d/$1" ] && return 0
  done
  return 1
}
missing_deps=()
have_header gtest/gtest.h || missing_deps+=("GoogleTest (libgtest-dev)")
have_header benchmark/benchmark.h ||
  missing_deps+=("Google Benchmark (libbenchmark-dev libbenchmark1debian)")
have_header CLI/CLI.hpp || missing_deps+=("CLI11 (libcli11-dev)")
have_header nlohmann/json.hpp || missing_deps+=("nlohmann-json (nlohmann-json3-dev)")
have_header zlib.h || missing_deps+=("zlib headers (zlib1g-dev)")
if ((${#missing_deps[@]})); then
  echo "gpu-test: missing build dependencies (not in /usr/include, /usr/local/include, and"
  echo "  .deps/ has no .deb files for them):"
  printf '  - %s\n' "${missing_deps[@]}"
  echo "  Fetch them on a machine with network access and copy .deps/ here, then rerun:"
  echo "    tools/fetch-gpu-deps.sh      # fills .deps/ with the .debs (and the RMM wheels)"
  echo "  (or install them: apt-get install libgtest-dev libbenchmark-dev libcli11-dev"
  echo "   nlohmann-json3-dev zlib1g-dev). Trying the build anyway."
fi
python=$(command -v python3)
rmm_root=
if ls .deps/wheels/*.whl >/dev/null 2>&1; then
  rmm_root=/opt/cuarena-deps/rmm
  mkdir -p "$rmm_root"
  for f in .deps/wheels/*.whl; do "$python" -m zipfile -e "$f" "$rmm_root"; done
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >>"$out/gpu.txt" 2>&1
nvcc --version | tail -2 >>"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

part=${CUARENA_GPU_PART:-all}
# Part 5 needs only the shim, its GPU programs and the replayer (a quarter of the build).
targets=
[ "$part" = 5 ] && targets="--target shim_gpu cuarena"
step build bash -c "cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCUARENA_WITH_TORCH=ON -DPython3_EXECUTABLE=$python -DCUARENA_RMM_ROOT=$rmm_root \
  -DZLIB_ROOT=/opt/cuarena-deps/usr && cmake --build build-gpu -j 16 $targets"
built=build-gpu/bin/gpu_tests
[ "$part" = 5 ] && built=build-gpu/lib/libcuarena_preload.so
if [ ! -e "$built" ]; then
  echo "$passed passed, $((failed + 1)) failed"
  exit 1
fi
case "$part" in
  all | 1 | 2 | 3 | 4 | 5) ;;
  build) echo "$passed passed, $failed failed"; exit 0 ;;  # the build alone
  *) echo "gpu-test: CUARENA_GPU_PART must be build, 1, 2, 3, 4 or 5 (or unset), not '$part'"; exit 2 ;;
esac
if [ "$part" = all ] || [ "$part" = 1 ]; then
step gpu_tests build-gpu/bin/gpu_tests --gtest_output=json:"$out/gpu_tests.json"
grep -h "gpu-replay" "$out/gpu_tests.log" || true
# (CudaSegmentBackends.* provokes out-of-memory on purpose, which memcheck counts as an API error.)
step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
  build-gpu/bin/gpu_tests --gtest_filter='CudaVmmBackend.*:Upstreams/CudaAllocator.BlocksHold*:Upstreams/CudaAllocator.MultiThread*'
step core_tests build-gpu/bin/core_tests
fi
if [ "$part" = all ] || [ "$part" = 5 ]; then
  # The shim: each step is one part of tests/shim/gpu/run.sh (its cases' PASS/FAIL lines shown).
  for shim_part in ${CUARENA_SHIM_GROUPS:-programs jobs bench}; do
    step "shim_$shim_part" env PYTHON="$python" CUARENA_SHIM_JOBS_REQUIRED=1 \
      tests/shim/gpu/run.sh build-gpu "$out" "$shim_part"
    grep -E '^(PASS|FAIL|SKIP) ' "$out/shim_$shim_part.log" || true
  done
fi
# The PyTorch suite and the training comparison, from the source tree: the adapter the build
# made, the package's sources on PYTHONPATH (no pip install: it would rebuild everything).
# CUARENA_GPU_TORCH_REQUIRED=1 turns the suite's "no library / no CUDA" skips into failures.
torch_env=(env "CUARENA_TORCH_LIB=$PWD/build-gpu/lib/libcuarena_torch.so"
  "CUARENA_CLI=$PWD/build-gpu/bin/cuarena"
  "PYTHONPATH=$PWD/allocator/torch/python${PYTHONPATH:+:$PYTHONPATH}"
  CUARENA_GPU_TORCH_REQUIRED=1)
if [ "$part" = all ] || [ "$part" = 4 ]; then
  rm -f "$out/train/compare.json"  # the training test must never read an earlier run's
  step train_compare "${torch_env[@]}" "$python" bench/train/compare.py \
    --models gpt2,resnet50,gpt2_varlen --steps 30 --out "$out/train"
  cat "$out/train/compare.md" 2>/dev/null || tail -20 "$out/train_compare.log"
fi
if [ "$part" = all ] || [ "$part" = 3 ] || [ "$part" = 4 ]; then
  # (all: the whole suite, its training test reading train_compare's results; 3: all but the
  # training test; 4: only the training test.)
  torch_suite=(tests/gpu_torch)
  torch_step=torch_tests
  if [ "$part" = 3 ]; then torch_suite+=(--ignore=tests/gpu_torch/test_training.py); fi
  if [ "$part" = 4 ]; then torch_suite=(tests/gpu_torch/test_training.py); torch_step=train_tests; fi
  step "$torch_step" "${torch_env[@]}" CUARENA_TRAIN_COMPARE_JSON="$out/train/compare.json" \
    "$python" -m pytest -q -rs -x -p no:cacheprovider "${torch_suite[@]}" \
    --junitxml="$out/$torch_step.xml"
  tail -25 "$out/$torch_step.log"
fi
if [ "$part" = all ] || [ "$part" = 2 ]; then
step replay_verify bash -c "build-gpu/bin/cuarena replay tests/data/traces/*.pickle.gz \
  --backend sim,cuda --verify --json $out/gpu_replay.json && \
  $python -c \"import json,sys; rs=json.load(open('$out/gpu_replay.json'))['results']; \
bad=[(r['trace'],r['allocator']) for r in rs if r.get('counters',{}).get('verify_failures',0)]; \
print('verify failures:', bad); sys.exit(1 if bad else 0)\""
cat "$out/replay_verify.log" | head -90
# Speed: the same replays without --verify (no tagging kernels), so replay time is the
# allocators' own; every allocator in one process run, PyTorch's in fresh processes. Host
# timings on a shared VM move by up to 2x between runs, so CUARENA_SPEED_RUNS runs (default 3)
# are summarised as medians of cuarena / torch-native by tools/speed_summary.py.
# Every run is pinned to one core (PyTorch's child processes inherit it), so the scheduler does
# not move the replay thread between cores mid-run; both allocators run under the same pinning.
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 3); fi
speed_runs=()
for i in $(seq 1 "${CUARENA_SPEED_RUNS:-3}"); do
  step "replay_speed_$i" "${pin[@]}" build-gpu/bin/cuarena replay tests/data/traces/*.pickle.gz --backend cuda \
    --json "$out/gpu_replay_speed_$i.json"
  speed_runs+=("$out/gpu_replay_speed_$i.json")
done
step speed_summary "$python" tools/speed_summary.py "${speed_runs[@]}" --json "$out/speed_summary.json"
cat "$out/speed_summary.log"
# Memory first (whole_chunk_min:0): every granule its own handle, against the simulator.
step replay_memory_first build-gpu/bin/cuarena replay tests/data/traces/*.pickle.gz --backend sim,cuda \
  --allocator cuarena --config whole_chunk_min:0 --verify --json "$out/gpu_replay_memory_first.json"
grep -E "cuarena" "$out/replay_memory_first.log" | head -12
# torch-expandable is left out: its search fails inside PyTorch ("CUDA error: context is
# destroyed" after an out-of-memory probe; open problem, see README).
step replay_min_capacity bash -c "build-gpu/bin/cuarena replay \
  tests/data/traces/bert_varlen_infer.pickle.gz --backend cuda --min-capacity \
  --allocator cuarena,cuarena-async,cuarena-malloc,torch-native,torch-async,cuda-malloc,cuda-async,cub,rmm-pool,rmm-arena \
  --json $out/gpu_min_capacity.json && \
  $python -c \"import json,sys; rs=json.load(open('$out/gpu_min_capacity.json'))['results']; \
g=2<<20; bad=[r['allocator'] for r in rs if r['backend'] == 'cuda' and \
r.get('min_capacity_bytes', 0) < r['peak_requested_bytes'] // g * g]; \
print('rows without a plausible min capacity:', bad); sys.exit(1 if bad else 0)\""
cat "$out/replay_min_capacity.log" | head -30
step vmm_costs build-gpu/bin/cuarena_vmm_costs
cat "$out/vmm_costs.log"
if [ "${CUARENA_GPU_BENCH:-1}" = 1 ]; then
  step gpu_bench build-gpu/bin/cuarena_gpu_bench --benchmark_min_time=0.2 \
    --benchmark_out="$out/gpu_bench.json" --benchmark_out_format=json
  grep -E "^(AllocFree|MixedTrace|Threads)" "$out/gpu_bench.log" | cut -c1-140
fi
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
