#!/usr/bin/env bash
# Installs what cuarena builds and tests with: Debian packages (compiler, CMake, Ninja,
# GoogleTest, Google Benchmark, CLI11, nlohmann-json, zlib, clang-format, tmux: `cuarena top`'s
# terminal test), and from PyPI pytest, matplotlib (`cuarena replay --report`), textual
# (`python -m cuarena top`), torch 2.11.0 and scikit-build-core (for the Python package
# `cuarena` and its tests; torch's PyPI wheel is the CUDA 13.0 build with its nvidia-*
# dependencies, about 3-4 GB, and imports without a GPU).
# CUARENA_NO_TORCH=1 skips torch and scikit-build-core (their tests then skip).
# Idempotent: installs only what is missing. Needs root or sudo for apt-get.
set -euo pipefail

packages=(g++ cmake ninja-build python3 python3-pip libgtest-dev libbenchmark-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev clang-format tmux)
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

# pip into the interpreter CMake finds (python3); past PEP 668's marker on Debian's own Python.
pip_install() {
  local flags=(-q)
  if python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    flags+=(--break-system-packages)
  fi
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install "${flags[@]}" "$@"
}

if ! python3 -m pytest --version >/dev/null 2>&1; then
  echo "install-deps: installing pytest"
  pip_install pytest
fi

# The replayer's --report draws with matplotlib, in the same interpreter (its tests need it).
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  echo "install-deps: installing matplotlib"
  pip_install matplotlib
fi

# `python -m cuarena top`'s live screen (its tests run it in tmux).
if ! python3 -c 'import textual' >/dev/null 2>&1; then
  echo "install-deps: installing textual"
  pip_install textual
fi

torch_version=2.11.0  # the torch the adapter is built and tested against (allocator/torch)
if [ "${CUARENA_NO_TORCH:-0}" != 1 ]; then
  have=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
  if [ "$have" != "$torch_version" ]; then
    echo "install-deps: installing torch==$torch_version${have:+ (found $have)} (about 3-4 GB)"
    start=$SECONDS
    # A multi-GB download that breaks off fails pip's hash check: try again (three tries), with
    # no cache so a broken file is not reused.
    for try in 1 2 3; do
      if pip_install --no-cache-dir --retries 10 --timeout 60 "torch==$torch_version"; then break; fi
      if ((try == 3)); then echo "install-deps: pip could not install torch==$torch_version"; exit 1; fi
      echo "install-deps: torch download failed (try $try of 3), trying again"
    done
    echo "install-deps: torch installed in $((SECONDS - start)) s"
  fi
  if ! python3 -c 'import scikit_build_core' >/dev/null 2>&1; then
    echo "install-deps: installing scikit-build-core"
    pip_install scikit-build-core
  fi
fi
