"""pytest setup for the Python tool tests: make `import cuarena_trace` work without installing."""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools" / "trace"))
