#!/usr/bin/env bash
# The whole CPU test suite: installs dependencies, builds, runs every test (GoogleTest via CTest
# and pytest), then builds the policy core, the replayer and the tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer and runs them there too.
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT

tools/install-deps.sh
cmake --preset default
cmake --build --preset default
ctest --preset default | tee -a "$log"

cmake --preset asan
cmake --build --preset asan
ctest --preset asan | tee -a "$log"

# One closing line over both runs. ctest counts skipped tests (the GPU tests, without a GPU)
# among the passed; they are listed as "(Skipped)" and reported apart here.
awk '/tests passed, [0-9]+ tests failed out of/ {failed += $4; total += $NF}
     /\(Skipped\)$/ {skipped++}
     END {printf "%d passed, %d failed, %d skipped\n", total - failed - skipped, failed, skipped}' "$log"
