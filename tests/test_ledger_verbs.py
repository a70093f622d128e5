"""What the ledger verbs tell a newcomer: where the demo's ledger is, who read a stump, the help."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from ledgerkit import Backend

from residents import cli
from residents.ledger import Ledger, access

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def stump_db(backend: Backend, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """A ledger (a file, or a database) holding the retry scenario's abandoned attempt, made private and
    read twice."""
    db = backend.location
    assert cli.main(["replay", str(ROOT / "scenarios" / "retry.yaml"), "--db", db, "--json"]) == 0
    capsys.readouterr()
    [(sid,)] = backend.rows("SELECT id FROM stumps WHERE cause='retry-abandoned' LIMIT 1")

    async def choose_and_read() -> None:
        async with Ledger.open(db) as lg:
            await access.set_access(lg, sid, "private", "cairn", None)
            await access.record_read(lg, sid, "mo (42)", "moderator")
            await access.record_read(lg, sid, "cairn", "resident")

    asyncio.run(choose_and_read())
    return db, sid


def test_ledger_show_of_a_stump_shows_its_access_and_who_read_its_text_and_when(stump_db, capsys):
    db, sid = stump_db
    assert cli.main(["ledger", "show", sid, "--db", db, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["access"] == "private"
    assert [(r["reader"], r["kind"]) for r in shown["reads"]] == [("mo (42)", "moderator"), ("cairn", "resident")]
    assert all(isinstance(r["at"], float) for r in shown["reads"]) and "text" in shown

    assert cli.main(["ledger", "show", sid, "--db", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "access: private" in lines
    read_by = next(line for line in lines if line.startswith("text read by: "))
    assert "mo (42) (moderator) at 20" in read_by and "cairn (resident) at 20" in read_by


def test_a_missing_ledger_names_the_demos_ledger(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["ledger", "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data/ledger.db: no ledger there" in err
    assert "the demo's ledger is data/demo.db, read with --db data/demo.db" in err


def test_ledger_alone_prints_its_help_and_exits_0(capsys):
    assert cli.main(["ledger"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: residents ledger") and "verify" in out and "show" in out


def test_demo_help_describes_db_in_a_whole_sentence(capsys):
    assert cli.main(["demo", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "--db PATH The ledger the demo writes. Without it, the demo writes data/demo.db in the configuration "
        "folder and replaces it on each run; a ledger named here is kept and each run is added to it."
    ) in help_text


def test_verify_counts_a_pending_generation_and_strict_names_it(tmp_path, capsys):
    """A generation still pending (a process stopped before settling it) is not a violation by itself;
    `--strict` makes it one, named."""
    from residents.records import Generation

    db = tmp_path / "l.db"

    async def build() -> None:
        async with Ledger.open(db) as lg:
            await lg.create_generation(Generation(id="g-open", residence="cairn", channel="c", model="m"))

    asyncio.run(build())
    assert cli.main(["ledger", "verify", "--db", str(db)]) == 0
    assert "1 unsettled" in capsys.readouterr().out
    assert cli.main(["ledger", "verify", "--db", str(db), "--strict"]) == 1
    assert capsys.readouterr().out.splitlines() == ["generation g-open: unsettled (status pending)"]
