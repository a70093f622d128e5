"""`residents status` where no server is needed: a SQLite ledger's one writer (its file lock) or none, and
one clear line for a missing ledger, a malformed URL (exit 2) and a server that cannot be reached (1). What it says of
several processes on a PostgreSQL ledger is checked with them running, in `test_leases.py`."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from residents import cli
from residents.ledger import Ledger


async def test_a_sqlite_ledger_names_the_process_holding_its_lock_and_none_once_it_is_closed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    async with Ledger.open(db):
        assert cli.main(["status", "--db", db]) == 0
        line = capsys.readouterr().out.strip()
        assert line.startswith(f"{db}: process {os.getpid()} on {socket.gethostname()} holds it"), line
        assert cli.main(["status", "--db", db, "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got == {
            "ledger": db,
            "backend": "sqlite",
            "holder": {"pid": os.getpid(), "host": socket.gethostname()},
        }
    assert cli.main(["status", "--db", db]) == 0
    assert capsys.readouterr().out.startswith(f"{db}: no process holds it")
    assert cli.main(["status", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["holder"] is None
    async with Ledger.open(db):  # the lock is free for the next writer: status took nothing with it
        pass


def test_a_missing_ledger_and_an_unreachable_server_are_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "--db", str(tmp_path / "none.db")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"residents: {tmp_path / 'none.db'}: no ledger there"]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://ledger:secret@127.0.0.1:{port}/residents"
    assert cli.main(["status", "--db", url]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"residents: postgresql://ledger:***@127.0.0.1:{port}/residents: cannot open the ledger:")
    assert "secret" not in line
    assert cli.main(["status", "--db", "postgresql://ledger:secret@127.0.0.1:notaport/residents"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("residents: --db: not a usable PostgreSQL URL: Port could not be cast"), line
    assert "secret" not in line
