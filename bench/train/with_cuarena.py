#!/usr/bin/env python3
"""Runs a Python script with cuarena installed as PyTorch's CUDA allocator, from the source tree
(no pip install): imports torch, enables cuarena before anything touches CUDA, then runs the
script as __main__ with its own arguments, as `python script.py args` would.

    CUARENA_TORCH_LIB=build-gpu/lib/libcuarena_torch.so PYTHONPATH=allocator/torch/python \\
        python3 bench/train/with_cuarena.py bench/train/train.py --model gpt2 --out r.json

The configuration is CUARENA_WITH_CONFIG if set (else cuarena's own default, which reads its
environment). compare.py uses this route when cuarena is not pip-installed; with the package
installed, CUARENA=1 does the same with no wrapper.
"""

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: with_cuarena.py SCRIPT [ARGS...]")
    script = sys.argv[1]
    import torch  # noqa: F401  (cuarena installs into torch: torch first)
    import cuarena

    cuarena.enable(os.environ.get("CUARENA_WITH_CONFIG") or None)
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
