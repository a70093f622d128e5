"""The ledger across processes: one process writes a ledger, readers work beside it, any medium.

Whole `residents` processes against the local room and provider (conftest's E2E_MODULES).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

from conftest import ROOT

WITHOUT_AIOSQLITE = """
import asyncio, importlib, pkgutil, sys
sys.modules["aiosqlite"] = None  # any `import aiosqlite` now raises ImportError
import residents
for m in pkgutil.walk_packages(residents.__path__, "residents."):
    if not m.name.endswith("__main__"):  # a command line, run when imported
        importlib.import_module(m.name)
from residents.ledger import Ledger
from residents.ledger.verify import check
from residents.records import Generation

async def main(path):
    async with Ledger.open(path) as ledger:
        await ledger.create_generation(Generation(id="g-1", residence="cairn", channel="room", model="m"))
        assert (await ledger.get_generation("g-1")).residence == "cairn"
        assert (await check(ledger)).ok
    print("ok")

asyncio.run(main(sys.argv[1]))
"""


def test_every_module_imports_and_a_ledger_works_without_aiosqlite(tmp_path) -> None:
    """No module needs aiosqlite: each imports, and a ledger opens, writes, reads and verifies."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_AIOSQLITE, str(tmp_path / "l.db")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("aiosqlite")]
