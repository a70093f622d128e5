"""The ledger's tests' throwaway PostgreSQL server: `bench/pgserver.py`, shared with the scale benchmark
(`python -m bench scale`), which may not import tests. Where no server can be started, a test that asks
for one fails saying so: it is not skipped.
"""

from __future__ import annotations

import glob  # noqa: F401  (a test empties `pgkit.glob.glob` to find no binaries)
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ sits beside the package, not in it
    sys.path.insert(0, str(ROOT))

from bench.pgserver import READY_WITHIN, Server, binaries, execute, fetch, server  # noqa: E402

__all__ = ["READY_WITHIN", "Server", "binaries", "execute", "fetch", "server"]
