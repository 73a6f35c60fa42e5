#!/usr/bin/env bash
# Fetches what tools/gpu-test.sh needs on a GPU machine without network access, into .deps/:
#   .deps/*.deb       Debian packages of the build dependencies (GoogleTest, Google Benchmark and
#                     its runtime library, CLI11, nlohmann-json, zlib's headers); gpu-test.sh
#                     unpacks them with dpkg -x under /opt/cuarena-deps when the system lacks them.
#   .deps/wheels/     the librmm-cu13 and rapids-logger wheels for the replay's rmm-pool /
#                     rmm-arena rows (tools/replay/README.md): librmm-cu13 26.10, the version the
#                     README's results were measured with, and the rapids-logger version its
#                     metadata asks for (0.3.*). They and the .debs are a few MiB, well inside
#                     the 64 MiB the GPU machine receives with the repository. --no-rmm leaves
#                     the wheels out.
#
# Run it on a machine with network access (Debian's apt for the .debs, PyPI for the wheels), from
# anywhere in the repository:
#   tools/fetch-gpu-deps.sh            # the .debs and the RMM wheels
#   tools/fetch-gpu-deps.sh --no-rmm   # only the .debs
#   tools/fetch-gpu-deps.sh --no-apt   # only the RMM wheels
# Idempotent: a package whose .deb (or wheel) is already in .deps/ is not fetched again. Ends by
# listing what .deps/ holds and its total size. Do not commit .deps/.
# The .debs come from this machine's Debian release (they are unpacked, not installed, on the
# GPU machine); fetch them on a release no newer than the GPU machine's, since
# libbenchmark1debian's library needs the glibc and libstdc++ it was built against.
set -euo pipefail
cd "$(dirname "$0")/.."

want_apt=1
want_rmm=1
for arg in "$@"; do
  case "$arg" in
    --rmm) want_rmm=1 ;;
    --no-rmm) want_rmm=0 ;;
    --no-apt) want_apt=0 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "fetch-gpu-deps: unknown argument '$arg' (known: --no-rmm, --no-apt, --rmm, --help)" >&2
      exit 2
      ;;
  esac
done

debs=(libgtest-dev libbenchmark-dev libbenchmark1debian libcli11-dev nlohmann-json3-dev zlib1g-dev)
rmm_spec='librmm-cu13==26.10.*'  # the version of README.md's results (tools/replay/README.md)

mkdir -p .deps
fetched=()

if [ "$want_apt" = 1 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "fetch-gpu-deps: apt-get not found; fetch ${debs[*]} as .deb files into .deps/ by hand" >&2
    exit 1
  fi
  missing=()
  for p in "${debs[@]}"; do
    if ls .deps/"${p}"_*.deb >/dev/null 2>&1; then
      echo "fetch-gpu-deps: have $(basename "$(ls .deps/"${p}"_*.deb | head -1)")"
    else
      missing+=("$p")
    fi
  done
  if ((${#missing[@]})); then
    download() { (cd .deps && apt-get download "${missing[@]}"); }
    if ! download; then
      # A stale package index is the usual cause (404 on the .deb); refresh it once.
      sudo=""
      [ "$(id -u)" -eq 0 ] || sudo=sudo
      echo "fetch-gpu-deps: apt-get download failed; running apt-get update and retrying"
      $sudo apt-get update -qq
      download
    fi
    for p in "${missing[@]}"; do fetched+=("$(basename "$(ls .deps/"${p}"_*.deb | head -1)")"); done
  fi
fi

if [ "$want_rmm" = 1 ]; then
  mkdir -p .deps/wheels
  pip=(python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .deps/wheels)
  if ! ls .deps/wheels/librmm_cu13-26.10*.whl >/dev/null 2>&1; then
    before=$(ls .deps/wheels)
    "${pip[@]}" "$rmm_spec"
    fetched+=($(comm -13 <(echo "$before") <(ls .deps/wheels)))
  else
    echo "fetch-gpu-deps: have $(basename "$(ls .deps/wheels/librmm_cu13-26.10*.whl | head -1)")"
  fi
  # rapids-logger: the version librmm's own metadata requires.
  rmm_whl=$(ls .deps/wheels/librmm_cu13-26.10*.whl | head -1)
  logger_spec=$(python3 - "$rmm_whl" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "rapids-logger" in line.replace("_", "-"):
            print(line.split(":", 1)[1].split(";")[0].strip().replace(" ", ""))
            break
    else:
        print("rapids-logger")
EOF
)
  if ! ls .deps/wheels/rapids_logger-*.whl >/dev/null 2>&1; then
    before=$(ls .deps/wheels)
    "${pip[@]}" "$logger_spec"
    fetched+=($(comm -13 <(echo "$before") <(ls .deps/wheels)))
  else
    echo "fetch-gpu-deps: have $(basename "$(ls .deps/wheels/rapids_logger-*.whl | head -1)") (librmm asks for $logger_spec)"
  fi
fi

echo "fetch-gpu-deps: fetched ${#fetched[@]} file(s)${fetched[*]:+: ${fetched[*]}}"
echo "fetch-gpu-deps: .deps/ holds:"
find .deps -type f \( -name '*.deb' -o -name '*.whl' \) -printf '%s\t%p\n' | sort -k2 |
  awk -F'\t' '{ printf "  %8.2f MiB  %s\n", $1 / 1048576, $2 }'
total=$(find .deps -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
awk -v t="$total" 'BEGIN { printf "fetch-gpu-deps: total %.2f MiB in .deps/\n", t / 1048576 }'
if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
  echo "fetch-gpu-deps: warning: over 60 MiB; the GPU machine receives at most 64 MiB with the repository" >&2
fi
