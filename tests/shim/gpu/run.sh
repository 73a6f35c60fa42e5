#!/usr/bin/env bash
# The LD_PRELOAD shim on a GPU: runs the programs of tests/shim/gpu without the shim and with
# LD_PRELOAD=BUILD_DIR/lib/libcuarena_preload.so, then the other helpers' suites where present.
#
#   tests/shim/gpu/run.sh BUILD_DIR OUT_DIR [programs] [jobs] [bench]    (default: all three)
#
# programs: each program without the shim (--expect-no-shim: the real driver must pass the same
#   checks) and with it (--expect-shim: the shim must really be loaded, and CUARENA_SUMMARY=1 must
#   print its summary line with calls_served > 0); shim_oom under CUARENA_CONF=memory_limit:256MiB,
#   per_process_memory_fraction:0.1 and with no cap (the device's own memory); shim_stress also
#   under compute-sanitizer --tool memcheck with the shim (through `env LD_PRELOAD=...`, so only
#   the target process gets it); CUARENA_LOG=1 and CUARENA_TRACE=path (the trace must replay
#   with BUILD_DIR/bin/cuarena when that is built). Then, to show the checks can fail, some
#   programs under BUILD_DIR/lib/libshim_gpu_broken_preload.so (broken_preload.cpp: immediate
#   reuse of freed blocks, the driver's ranges left as the pool's): each must fail with the check
#   that catches it (cases *.broken_caught).
# jobs: python3 -m pytest -q tests/shim/jobs, when that folder exists.
# bench: python3 bench/shim/compare.py --out OUT_DIR/shim --shim (the shim), when that file exists.
# Both get CUARENA_PRELOAD_LIB (the shim) and CUARENA_BUILD_DIR in their environment.
#
# One line per case, PASS NAME / FAIL NAME / SKIP NAME, each case's output in
# OUT_DIR/shim_gpu/NAME.log (a failure prints its last lines); the last line is
# "N passed, N failed". Exit 0 when nothing failed, 77 when no CUDA device is visible (the first
# program says so; CTest counts that as skipped), 1 otherwise.
# Environment: PYTHON (python3), COMPUTE_SANITIZER (compute-sanitizer), SHIM_STRESS_MEMCHECK_OPS
# (operations a thread for the stress under memcheck, 2500: 20,000 in all), SHIM_CHURN_MAX_RATIO
# (1.10: the churn case's bound on the shim's peak reserved over the program's peak live bytes),
# SHIM_CHURN_REQUIRED (1: a churn ratio past the bound fails; else it prints MISS).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR OUT_DIR [programs] [jobs] [bench]" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=$(cd "$1" && pwd) || exit 2
mkdir -p "$2/shim_gpu" || exit 2
out=$(cd "$2" && pwd)
logs=$out/shim_gpu
shift 2
groups=${*:-programs jobs bench}
bin=$build/bin
shim=$build/lib/libcuarena_preload.so
broken=$build/lib/libshim_gpu_broken_preload.so
python=${PYTHON:-python3}
sanitizer=${COMPUTE_SANITIZER:-compute-sanitizer}
cd "$root" || exit 2

passed=0
failed=0
skipped=0
no_device=0
# record NAME RC [REASON]: counts and prints a case's result.
record() {
  local name=$1 rc=$2 reason=${3:-}
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "PASS $name"
  elif [ "$rc" -eq 77 ]; then
    skipped=$((skipped + 1))
    no_device=1
    echo "SKIP $name ($(grep -m1 -o 'no CUDA device.*' "$logs/$name.log" || echo 'skipped'))"
  else
    failed=$((failed + 1))
    echo "FAIL $name (${reason:-exit $rc}; last lines of $logs/$name.log:)"
    tail -15 "$logs/$name.log" | sed 's/^/    /'
  fi
}

# run_case NAME COMMAND...: PASS when COMMAND exits 0.
run_case() {
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1
  record "$name" $?
}

preload=(env "LD_PRELOAD=$shim${LD_PRELOAD:+:$LD_PRELOAD}" CUARENA_SUMMARY=1)

# The summary line the shim prints at exit, with calls it served; echoes why not, if not.
summary_problem() {
  local log=$1 line
  line=$(grep -m1 '^cuarena: summary: ' "$log") || {
    echo "no 'cuarena: summary:' line (CUARENA_SUMMARY=1)"
    return
  }
  local key
  for key in peak_requested_bytes peak_reserved_bytes reserved_ratio calls_served \
    calls_passed_through; do
    [[ $line == *" $key="* ]] || { echo "summary line lacks $key: $line"; return; }
  done
  [[ $line =~ calls_served=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] ||
    echo "the shim served no calls: $line"
}

# summary_case NAME COMMAND...: PASS when COMMAND exits 0 and its output holds the shim's
# summary line with served calls.
summary_case() {
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1
  local rc=$? problem=
  if [ "$rc" -eq 0 ]; then problem=$(summary_problem "$logs/$name.log"); fi
  if [ -n "$problem" ]; then record "$name" 1 "$problem"; else record "$name" "$rc"; fi
}

# shim_case NAME [VAR=VALUE...] -- COMMAND...: summary_case with COMMAND under the shim,
# CUARENA_SUMMARY=1 and the variables given.
shim_case() {
  local name=$1
  shift
  local vars=()
  while [ "$1" != -- ]; do
    vars+=("$1")
    shift
  done
  shift
  summary_case "$name" "${preload[@]}" "${vars[@]}" "$@"
}

# caught_case NAME PATTERN... -- COMMAND...: COMMAND under the broken allocator must exit 1 with,
# for each PATTERN (an extended regular expression), a line matching it.
caught_case() {
  local name=$1
  shift
  local patterns=()
  while [ "$1" != -- ]; do
    patterns+=("$1")
    shift
  done
  shift
  env "LD_PRELOAD=$broken" "$@" >"$logs/$name.log" 2>&1
  local rc=$? pattern
  if [ "$rc" -ne 1 ]; then
    record "$name" 1 "exit $rc under the broken allocator, not 1"
    return
  fi
  for pattern in "${patterns[@]}"; do
    if ! grep -qE "$pattern" "$logs/$name.log"; then
      record "$name" 1 "under the broken allocator no line matches '$pattern'"
      return
    fi
  done
  record "$name" 0
}

# churn_case NAME MAX_RATIO -- COMMAND...: shim_case, and the summary's peak_reserved_bytes at most
# MAX_RATIO times the peak_live_bytes=N line COMMAND prints. Until cuarena meets the churn
# target, a ratio past it prints MISS (not counted as a failure) unless SHIM_CHURN_REQUIRED=1.
churn_case() {
  local name=$1 max=$2
  shift 3
  summary_case "$name" "${preload[@]}" "$@"
  local log=$logs/$name.log reserved live ratio
  reserved=$(grep -m1 -o 'peak_reserved_bytes=[0-9]*' "$log" | cut -d= -f2)
  live=$(grep -m1 -o '^peak_live_bytes=[0-9]*' "$log" | cut -d= -f2)
  if [ -z "$reserved" ] || [ -z "$live" ] || [ "$live" -eq 0 ]; then
    failed=$((failed + 1))
    echo "FAIL $name.ratio (no peak_reserved_bytes or peak_live_bytes in $log)"
    return
  fi
  ratio=$(awk -v r="$reserved" -v l="$live" 'BEGIN { printf "%.4f", r / l }')
  if awk -v r="$reserved" -v l="$live" -v m="$max" 'BEGIN { exit !(r / l <= m) }'; then
    passed=$((passed + 1))
    echo "PASS $name.ratio ($ratio = $reserved / $live <= $max)"
  elif [ "${SHIM_CHURN_REQUIRED:-0}" = 1 ]; then
    failed=$((failed + 1))
    echo "FAIL $name.ratio ($ratio = $reserved / $live > $max)"
  else
    echo "MISS $name.ratio ($ratio = $reserved / $live > $max: a target not met yet, not" \
      "counted; SHIM_CHURN_REQUIRED=1 makes it a failure)"
  fi
}

run_programs() {
  # Without a device every program skips: say so once and stop.
  run_case basic_static "$bin/shim_basic_static" --expect-no-shim
  if [ "$no_device" = 1 ]; then return; fi
  if [ ! -f "$shim" ]; then
    failed=$((failed + 1))
    echo "FAIL shim_library ($shim not built: the runs under the shim fail too)"
  fi
  shim_case basic_static.shim -- "$bin/shim_basic_static" --expect-shim
  run_case basic_shared "$bin/shim_basic_shared" --expect-no-shim
  shim_case basic_shared.shim -- "$bin/shim_basic_shared" --expect-shim
  local p
  for p in free_reuse ranges ipc stress vmm; do
    run_case "$p" "$bin/shim_$p" --expect-no-shim
    shim_case "$p.shim" -- "$bin/shim_$p" --expect-shim
  done
  # Churn: 4 non-blocking streams, 1 KiB .. 256 MiB, half of them cudaMalloc/cudaFree, frees while
  # kernels still run. The shim's peak reserved over the program's own peak live bytes (held
  # frees count as waste here, not as requested).
  churn_case stress.shim_churn "${SHIM_CHURN_MAX_RATIO:-1.10}" -- "$bin/shim_stress" \
    --expect-shim --threads 4 --ops 3000 --max-live 24 --min-size 1KiB --max-size 256MiB \
    --sync-percent 50
  # Shareable memory left to the driver: exports work, XLA's handles stay the driver's.
  shim_case vmm.shim_serve_shareable_off CUARENA_CONF=serve_shareable:False -- \
    "$bin/shim_vmm" --expect-shim --shareable-stays
  # Every free fenced at once: the same block comes back, so each case tests the fence's order.
  shim_case free_reuse.shim_fence_each_free CUARENA_CONF=pending_free_bytes:1 -- \
    "$bin/shim_free_reuse" --expect-shim --expect-reuse
  run_case oom "$bin/shim_oom" --expect-no-shim
  shim_case oom.shim_memory_limit CUARENA_CONF=memory_limit:256MiB -- \
    "$bin/shim_oom" --expect-shim --limit 256MiB
  shim_case oom.shim_memory_fraction CUARENA_CONF=per_process_memory_fraction:0.1 -- \
    "$bin/shim_oom" --expect-shim --limit-fraction 0.1
  shim_case oom.shim_device -- "$bin/shim_oom" --expect-shim

  # memcheck: the sanitizer starts `env`, which starts the program with the shim preloaded
  # (the sanitizer follows child processes; LD_PRELOAD reaches only the program).
  if command -v "$sanitizer" >/dev/null; then
    summary_case stress.shim_memcheck env CUARENA_SUMMARY=1 \
      "$sanitizer" --tool memcheck --error-exitcode 1 \
      env "LD_PRELOAD=$shim${LD_PRELOAD:+:$LD_PRELOAD}" \
      "$bin/shim_stress" --expect-shim --ops "${SHIM_STRESS_MEMCHECK_OPS:-2500}"
  else
    skipped=$((skipped + 1))
    echo "SKIP stress.shim_memcheck ($sanitizer not found)"
  fi

  # The broken allocator (shared-cudart programs only: it interposes cudaMalloc & co. by name).
  caught_case free_reuse.broken_caught \
    "check failed: (R, A's copy of X,|Y) has .*not (A's|B's) pattern" \
    "check failed: (R, A's copy of X,|Y \(allocated on B\)) has .*wrong words" -- \
    "$bin/shim_free_reuse" --expect-shim
  caught_case ranges.broken_caught \
    "check failed: cudaMalloc\(.*cuMemGetAddressRange_v2 at its (base|middle|last byte)" \
    "check failed: cudaMalloc\(.*cuPointerGetAttributes at its" -- \
    "$bin/shim_ranges" --expect-shim
  caught_case ipc.broken_caught "check failed: child: the opened .* not the parent's pattern" -- \
    "$bin/shim_ipc" --expect-shim
  caught_case stress.broken_caught \
    "check failed: thread [0-9]+: [0-9]+ bytes .*not its pattern" -- \
    "$bin/shim_stress" --expect-shim

  # CUARENA_LOG=1: stderr lines prefixed "cuarena:" besides the summary.
  shim_case log.shim CUARENA_LOG=1 -- "$bin/shim_basic_shared" --expect-shim
  local events
  events=$(grep '^cuarena:' "$logs/log.shim.log" | grep -vc '^cuarena: summary: ')
  if [ "$events" -eq 0 ]; then
    failed=$((failed + 1))
    echo "FAIL log.shim.lines (CUARENA_LOG=1 printed no 'cuarena:' event lines)"
  else
    passed=$((passed + 1))
    echo "PASS log.shim.lines ($events event lines)"
  fi

  # CUARENA_TRACE=path: a trace at exit, which the replayer reads.
  local trace=$logs/basic_shared.cuat
  rm -f "$trace"
  shim_case trace.shim "CUARENA_TRACE=$trace" -- "$bin/shim_basic_shared" --expect-shim
  if [ ! -s "$trace" ]; then
    failed=$((failed + 1))
    echo "FAIL trace.shim.file (CUARENA_TRACE=$trace wrote no trace)"
  elif [ -x "$bin/cuarena" ]; then
    run_case trace.shim.replay "$bin/cuarena" replay "$trace" --backend sim
  else
    passed=$((passed + 1))
    echo "PASS trace.shim.file ($(stat -c %s "$trace") bytes; $bin/cuarena not built, not replayed)"
  fi
}

python_env=(env "CUARENA_PRELOAD_LIB=$shim" "CUARENA_BUILD_DIR=$build" PYTHONUNBUFFERED=1)

run_jobs() {
  if [ -d tests/shim/jobs ]; then
    run_case shim_jobs "${python_env[@]}" "$python" -m pytest -q -rs -p no:cacheprovider \
      tests/shim/jobs
  else
    skipped=$((skipped + 1))
    echo "SKIP shim_jobs (tests/shim/jobs not present)"
  fi
}

run_bench() {
  if [ -f bench/shim/compare.py ]; then
    run_case shim_bench "${python_env[@]}" "$python" bench/shim/compare.py --out "$out/shim" \
      --shim "$shim"
  else
    skipped=$((skipped + 1))
    echo "SKIP shim_bench (bench/shim/compare.py not present)"
  fi
}

for g in $groups; do
  case "$g" in
    programs) run_programs ;;
    jobs) run_jobs ;;
    bench) run_bench ;;
    *) echo "run.sh: unknown part '$g' (programs, jobs, bench)" >&2; exit 2 ;;
  esac
  if [ "$no_device" = 1 ]; then break; fi
done
if [ $skipped -gt 0 ]; then echo "$skipped skipped"; fi
echo "$passed passed, $failed failed"
if [ $failed -gt 0 ]; then exit 1; fi
if [ "$no_device" = 1 ] && [ $passed -eq 0 ]; then exit 77; fi
exit 0
