#!/usr/bin/env bash
# The whole CPU test suite: installs dependencies, builds, runs every test (GoogleTest via CTest
# and pytest), then builds the policy core, the replayer and the tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer and runs them there too.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install-deps.sh
cmake --preset default
cmake --build --preset default
ctest --preset default

cmake --preset asan
cmake --build --preset asan
ctest --preset asan
