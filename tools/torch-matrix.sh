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
# when any cell failed. A minor whose torch install fills the disk ("No space left on device")
# is not a failure of cuarena's: its row says "no disk" and a last line names it.
#
#   tools/torch-matrix.sh                 # every supported minor, 2.8 to 2.15
#   tools/torch-matrix.sh 2.8 2.15        # only these (tools/test.sh runs the oldest and newest)
#   tools/torch-matrix.sh --discard 2.15  # remove each environment once checked (CI's disk)
#
# Environments go to .venv-torch/2.X (kept unless --discard, so a rerun only reinstalls
# cuarena; delete the folder to start over), logs to .venv-torch/2.X/*.log. Each environment
# is 4-6 GB: torch and its CUDA libraries, without triton (torch.compile's compiler, 1 GB,
# which neither the import nor the CPU tests need). They are installed one requirement at a
# time, because pip keeps every wheel of one command on disk until it ends; the peak is then
# near the environment's own size. The first install of a minor takes two to three minutes on
# a fast link. Needs python3 with venv, a C++ compiler, the CUDA toolkit (nvcc) and PyPI.
set -uo pipefail
cd "$(dirname "$0")/.."

discard=0
if [ "${1:-}" = --discard ]; then
  discard=1
  shift
fi
minors=("$@")
if ((${#minors[@]} == 0)); then
  minors=(2.8 2.9 2.10 2.11 2.12 2.13 2.14 2.15)  # as CUARENA_TORCH_OLDEST..NEWEST in CMakeLists.txt
fi
root=$PWD/.venv-torch
mkdir -p "$root"
python=${PYTHON:-python3}

declare -A result
fails=0
nodisk=()  # minors not checked because the disk filled up installing torch
mark() {  # mark MINOR COLUMN ok|FAIL
  result[$1,$2]=$3
  [ "$3" = ok ] || fails=$((fails + 1))
}

pip_get() {  # pip_get PYTHON ARGS...: one pip install, no cache, patient with a slow link
  local py=$1
  shift
  "$py" -m pip install -q --no-cache-dir --retries 10 --timeout 60 "$@"
}

install_torch() {  # install_torch PYTHON MINOR ENV_DIR
  local py=$1 minor=$2 env_dir=$3 req
  pip_get "$py" --no-deps "torch==$minor.*" || return 1
  # torch's requirements for this platform, as its metadata states them (pip's own parser).
  "$py" - >"$env_dir/requirements.txt" <<'PY' || return 1
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("torch") or []:
    req = Requirement(line)
    if req.name != "triton" and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req).split(";")[0])
PY
  while IFS= read -r req; do
    pip_get "$py" "$req" || return 1
  done <"$env_dir/requirements.txt"
  pip_get "$py" scikit-build-core cmake ninja pytest
}

check_minor() {  # check_minor MINOR: fills its row of the table
  local minor=$1 env_dir=$root/$1 py=$root/$1/bin/python installed try start lib bad rc
  echo "torch-matrix: torch $minor in $env_dir"
  if [ ! -x "$py" ] || ! "$py" -c "import torch, sys; sys.exit(not torch.__version__.startswith('$minor.'))" 2>/dev/null; then
    rm -rf "$env_dir"
    "$python" -m venv "$env_dir" || { mark "$minor" install FAIL; return; }
  fi
  # torch (the newest patch of the minor) without its requirements, then each requirement but
  # triton on its own, then what the offline install needs. A download that breaks off is
  # retried (three tries); no pip cache, so a minor needs its own size only.
  installed=0
  for try in 1 2 3; do
    if install_torch "$py" "$minor" "$env_dir" >"$env_dir/pip.log" 2>&1; then
      installed=1
      break
    fi
    echo "torch-matrix: pip install of torch $minor failed (try $try of 3):"
    tail -5 "$env_dir/pip.log"
    df -h "$env_dir" | tail -1
  done
  if ((!installed)); then
    if grep -q "No space left on device" "$env_dir/pip.log"; then
      # The machine's disk, not cuarena: said in the table and the last line, not a failure.
      nodisk+=("$minor")
      result[$minor,install]="no disk ($(df -h --output=avail "$env_dir" | tail -1 | tr -d ' ') free)"
      echo "torch-matrix: torch $minor not checked: the disk filled up installing it"
      return
    fi
    echo "torch-matrix: pip could not install torch $minor (see $env_dir/pip.log)"
    mark "$minor" install FAIL
    return
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
    return
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
}

for minor in "${minors[@]}"; do
  check_minor "$minor"
  if ((discard)); then
    rm -rf "${root:?}/$minor"
  fi
done

echo
echo "| minor | torch | pip install | import torch, cuarena | bad key: one line | CPU tests |"
echo "|---|---|---|---|---|---|"
for minor in "${minors[@]}"; do
  echo "| $minor | ${result[$minor,torch]:--} | ${result[$minor,install]:--} | ${result[$minor,import]:--} | ${result[$minor,badkey]:--} | ${result[$minor,tests]:--} (${result[$minor,summary]:-not run}) |"
done
if ((${#nodisk[@]})); then
  echo "torch-matrix: not checked for lack of disk space (about 6 GB each): torch ${nodisk[*]}"
fi
exit $((fails > 0))
