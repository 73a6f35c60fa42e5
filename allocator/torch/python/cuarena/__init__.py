"""cuarena: a CUDA device-memory caching allocator, as PyTorch's CUDA allocator.

Three ways to turn it on, all before CUDA initialises in the process:

- ``cuarena.enable()`` in the job, before its first CUDA call;
- from the environment, with cuarena pip-installed (torch runs cuarena's ``torch.backends``
  entry point inside ``import torch``): ``CUARENA=1``, ``CUARENA_CONF=key:value,...``, or
  ``PYTORCH_CUDA_ALLOC_CONF=backend:cuarena,...`` as for PyTorch's own backends;
- ``python -m cuarena run script.py args...`` (or ``run -m module args...``).

Once enabled, cuarena serves every CUDA device of the process; PyTorch's statistics,
snapshots, CUDA graphs and ``torch.compile`` keep working through it. Sizes are in bytes.

Install from the repository root with torch already installed: ``pip install .`` (fetches
scikit-build-core, and CMake and Ninja if missing), or offline ``pip install
--no-build-isolation .`` with scikit-build-core, cmake and ninja installed. The library is
built for the installed torch's minor version; reinstall after upgrading torch.

Errors are :class:`CuarenaError` (a RuntimeError) and, for configurations,
:class:`ConfigError` (also a ValueError). ``import cuarena`` imports neither torch nor the
library; the first call that needs them does.
"""

from ._api import (
    built_for,
    check_config,
    config_keys,
    enable,
    enabled_config,
    is_enabled,
    library_path,
    memory_available,
    stats,
)
from ._errors import ConfigError, CuarenaError
from ._record import DEFAULT_MAX_ENTRIES, Recording, record

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CuarenaError",
    "DEFAULT_MAX_ENTRIES",
    "Recording",
    "built_for",
    "check_config",
    "config_keys",
    "enable",
    "enabled_config",
    "is_enabled",
    "library_path",
    "memory_available",
    "record",
    "stats",
    "__version__",
]
