#!/usr/bin/env bash
# The PyTorch drop-in against several torch minors, as a user installs it: for each minor, a
# fresh virtual environment with that torch from PyPI, `pip install --no-build-isolation .`
# into it, and then in it:
#   import      python -c "import torch, cuarena" works, and the library loads
#   bad key     CUARENA_CONF=bogus:1 python -c "import torch" ends with exit 2 in at most 3
#               lines naming the variable, the key and its position
#   CPU tests   tests/python/test_package.py and test_package_lib.py against the installed
#               package's library (no GPU needed)
# Ends with a table (minor / torch / install / import / bad key / CPU tests) and exits non-zero
# when any cell failed.
#
#   tools/torch-matrix.sh                 # every supported minor, 2.8 to 2.15
#   tools/torch-matrix.sh 2.8 2.15        # only these (tools/test.sh runs the oldest and newest)
#
# Environments go to .venv-torch/2.X (kept, so a rerun only reinstalls cuarena; delete the
# folder to start over), logs to .venv-torch/2.X/*.log. Each environment is about 6-7 GB (torch
# and its CUDA libraries); the first install of a minor takes one to two minutes on a fast link.
# Needs python3 with venv, a C++ compiler, the CUDA toolkit (nvcc) and network access to PyPI.
set -uo pipefail
cd "$(dirname "$0")/.."

minors=("$@")
if ((${#minors[@]} == 0)); then
  minors=(2.8 2.9 2.10 2.11 2.12 2.13 2.14 2.15)  # as CUARENA_TORCH_OLDEST..NEWEST in CMakeLists.txt
fi
root=$PWD/.venv-torch
mkdir -p "$root"
python=${PYTHON:-python3}

declare -A result
fails=0
mark() {  # mark MINOR COLUMN ok|FAIL
  result[$1,$2]=$3
  [ "$3" = ok ] || fails=$((fails + 1))
}

for minor in "${minors[@]}"; do
  env_dir=$root/$minor
  py=$env_dir/bin/python
  echo "torch-matrix: torch $minor in $env_dir"
  if [ ! -x "$py" ] || ! "$py" -c "import torch, sys; sys.exit(not torch.__version__.startswith('$minor.'))" 2>/dev/null; then
    rm -rf "$env_dir"
    "$python" -m venv "$env_dir" || { mark "$minor" install FAIL; continue; }
  fi
  # torch first (the newest patch of the minor), then what the offline install needs. A download
  # that breaks off is retried (three tries); no pip cache, so a minor needs its own size only.
  installed=0
  for try in 1 2 3; do
    if "$py" -m pip install -q --no-cache-dir --retries 10 --timeout 60 "torch==$minor.*" \
        scikit-build-core cmake ninja pytest >"$env_dir/pip.log" 2>&1; then
      installed=1
      break
    fi
    echo "torch-matrix: pip install of torch $minor failed (try $try of 3):"
    tail -5 "$env_dir/pip.log"
    df -h "$env_dir" | tail -1
  done
  if ((!installed)); then
    echo "torch-matrix: pip could not install torch $minor (see $env_dir/pip.log)"
    mark "$minor" install FAIL
    continue
  fi
  result[$minor,torch]=$("$py" -c "import torch; print(torch.__version__)" 2>/dev/null)
  start=$SECONDS
  if "$py" -m pip install --no-build-isolation --force-reinstall --no-deps . \
      >"$env_dir/install.log" 2>&1; then
    mark "$minor" install ok
    echo "torch-matrix: cuarena installed against torch ${result[$minor,torch]} in $((SECONDS - start)) s"
  else
    mark "$minor" install FAIL
    tail -20 "$env_dir/install.log"
    continue
  fi
  # Outside the repository, so that the installed package is the one imported.
  lib=$(cd /tmp && "$py" -c "import torch, cuarena; print(cuarena.library_path()); cuarena.built_for()" 2>"$env_dir/import.log")
  if [ -n "$lib" ] && [ -f "$lib" ]; then mark "$minor" import ok; else mark "$minor" import FAIL; fi
  bad=$(cd /tmp && CUARENA_CONF=bogus:1 "$py" -c "import torch" 2>&1)
  rc=$?
  if [ $rc -eq 2 ] && [ "$(printf '%s\n' "$bad" | wc -l)" -le 3 ] &&
     [[ $bad == *"CUARENA_CONF: unknown key 'bogus' at position 0"* ]]; then
    mark "$minor" badkey ok
  else
    mark "$minor" badkey FAIL
    printf 'torch-matrix: CUARENA_CONF=bogus:1 gave exit %s:\n%s\n' "$rc" "$bad"
  fi
  if CUARENA_TORCH_LIB=$lib "$py" -m pytest -q -p no:cacheprovider tests/python/test_package.py \
      tests/python/test_package_lib.py >"$env_dir/pytest.log" 2>&1; then
    mark "$minor" tests ok
  else
    mark "$minor" tests FAIL
    tail -20 "$env_dir/pytest.log"
  fi
  result[$minor,summary]=$(tail -1 "$env_dir/pytest.log")
done

echo
echo "| minor | torch | pip install | import torch, cuarena | bad key: one line | CPU tests |"
echo "|---|---|---|---|---|---|"
for minor in "${minors[@]}"; do
  echo "| $minor | ${result[$minor,torch]:--} | ${result[$minor,install]:--} | ${result[$minor,import]:--} | ${result[$minor,badkey]:--} | ${result[$minor,tests]:--} (${result[$minor,summary]:-not run}) |"
done
exit $((fails > 0))
