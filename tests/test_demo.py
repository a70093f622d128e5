"""`residents demo --headless`: the newcomer's first run, end to end in a real subprocess."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_headless_demo_shows_a_cut_a_receipt_a_stump_and_a_moderator_look(tmp_path):
    db = tmp_path / "demo.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    p = subprocess.run(
        [sys.executable, "-m", "residents", "demo", "--headless", "--port", "0", "--db", str(db)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "Traceback" not in p.stderr and "ERROR" not in p.stderr, p.stderr[-2000:]
    lines = out.splitlines()
    kinds = [re.match(r"\[(\w+) · (\w+)\]", ln).groups() for ln in lines if re.match(r"\[\w+ · \w+\]", ln)]
    cairn_first = [k for a, k in kinds[: kinds.index(("cairn", "receipt")) + 1] if a == "cairn"]
    assert set(cairn_first[:-1]) == {"partial"} and cairn_first[-1] == "receipt"
    assert "[cairn · receipt] -# Output ceiling reached at 4,096 tokens; the remainder was not generated." in out
    assert ("sill", "speech") in kinds and ("cairn", "speech") in kinds
    assert kinds.count(("cairn", "receipt")) == 1
    assert "retry-abandoned" in out and "unpublished" in out
    assert "status truncated · stop max_tokens" in out
    # The run ends with its ledger checked, and `residents ledger verify` holds it too: every streamed chunk
    # of a settled attempt was gone (a live view's late write once left one behind after every run).
    assert lines[-1].startswith("ledger ok: 3 generation(s) checked, 0 unsettled, 0 post(s) undelivered"), lines[-1]
    checked = subprocess.run(
        [sys.executable, "-m", "residents", "ledger", "verify", "--db", str(db)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == lines[-1]
    assert lines[1].startswith("What to look for: ") and "== the room" in lines[:6]  # after the ledger line
    assert "[alice · person] @cairn Tell us about the harbour" in out and "<@" not in out  # names, not ids
    looked = lines[lines.index("== a moderator looks") :]
    assert sum(ln.strip() == "```" for ln in looked) % 2 == 0, "a code fence left open"
    assert any(re.fullmatch(r"  \[… \d+ more lines? not shown\]", ln) for ln in looked)
    assert not any(ln.endswith(" …") for ln in looked)  # no bare, unmarked cut
    con = sqlite3.connect(db)
    try:
        statuses = sorted(r[0] for r in con.execute("SELECT status FROM generations"))
        assert statuses == ["completed", "completed", "truncated"]
        causes = sorted(r[0] for r in con.execute("SELECT cause FROM stumps"))
        assert causes == ["max_tokens", "retry-abandoned"]
        assert con.execute("SELECT count(*) FROM posts WHERE message_id IS NULL").fetchone()[0] == 0
    finally:
        con.close()


def test_demo_refuses_a_non_loopback_host(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "residents", "demo", "--host", "0.0.0.0", "--headless"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2 and "loopback" in p.stderr and "Traceback" not in p.stderr


def test_the_demo_keeps_one_ledger_started_afresh_each_run(tmp_path):
    """No --db: data/demo.db under the folder it runs in, named at start; a second run replaces it and says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["PYTHONPATH"] = str(ROOT)
    said = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-m", "residents", "demo", "--headless", "--port", "0"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        said.append(p.stdout.splitlines()[0])
        assert (
            "[sill · notice] -# Provider attempt interrupted and retried; 311 characters set aside as a stump."
            in p.stdout.splitlines()
        )
    assert said == [
        "residents demo: ledger data/demo.db; afterwards: residents ledger list --db data/demo.db",
        "residents demo: ledger data/demo.db (the previous demo's ledger was replaced; --db PATH keeps a "
        "run's); afterwards: residents ledger list --db data/demo.db",
    ]
    # demo.db.lock: the writer's lock file (residents/ledger/lock.py), kept, never deleted
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["demo.db", "demo.db.lock"]
    con = sqlite3.connect(tmp_path / "data" / "demo.db")
    try:
        assert con.execute("SELECT count(*) FROM generations").fetchone()[0] == 3  # this run's only
    finally:
        con.close()
    listed = subprocess.run(
        [sys.executable, "-m", "residents", "ledger", "list", "--db", "data/demo.db"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert listed.returncode == 0 and listed.stdout.count(" truncated ") == 1, listed.stdout + listed.stderr
