#!/usr/bin/env bash
# Installs what cuarena builds and tests with: Debian packages (compiler, CMake, Ninja,
# GoogleTest, Google Benchmark, CLI11, nlohmann-json, zlib) and pytest from PyPI.
# Idempotent: installs only what is missing. Needs root or sudo for apt-get.
set -euo pipefail

packages=(g++ cmake ninja-build python3 python3-pip libgtest-dev libbenchmark-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! python3 -m pytest --version >/dev/null 2>&1; then
  echo "install-deps: installing pytest"
  python3 -m pip install -q pytest 2>/dev/null ||
    python3 -m pip install -q --break-system-packages pytest
fi
