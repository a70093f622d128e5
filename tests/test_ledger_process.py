"""The ledger across processes: one process writes a ledger, readers work beside it, any medium.

Whole `residents` processes against the local room and provider (conftest's E2E_MODULES).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from test_crash import (
    MODEL,
    check_ledger,
    crash_rig,
    db_rows,
    restart,
    streamed_chars,
    until,
    words,
)

from residents import truth
from residents.generation.attempts import FLUSH_CHARS
from residents.localservers import sse
from residents.localservers.provider import Call

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


# ---------------------------------------------------------------- one writer; readers beside it


async def residents(*args: str, cwd: Path, timeout: float = 60) -> tuple[int, str, str]:
    """One `residents` command as a process: its exit code, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CAIRN_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "residents",
        *args,
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT), "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_API_KEY": "k"},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def refusal(db: Path, pid: int) -> str:
    return (
        f"residents: {db}: in use by process {pid} on {socket.gethostname()}; one process writes a ledger at a time"
        " (the read-only `residents ledger` verbs work beside it)"
    )


def snapshot(db: Path) -> list[Any]:
    """Every row of the tables a writer's start could touch (recovery settles, posts, chains)."""
    return [
        db_rows(db, f"SELECT * FROM {table} ORDER BY rowid")
        for table in ("generations", "attempts", "stumps", "posts", "live_messages", "chain", "_migrations")
    ]


async def test_a_second_writer_is_refused_the_readers_work_beside_it_and_a_killed_holder_blocks_nothing(
    tmp_path: Path,
) -> None:
    async with crash_rig(tmp_path) as (room, provider, proc):
        db = proc.db
        # The first process, mid-reply: its attempt streaming, its live reply in the ledger.
        provider.enqueue(
            [Call(sse=sse.stream(words(3000, "h"), finish=False, model=MODEL), end="stall", stall_seconds=25)]
        )
        await restart(room, proc)
        room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
        await until(proc, lambda: streamed_chars(db) >= FLUSH_CHARS, timeout=8, interval=0.02)
        [(gid,)] = db_rows(db, "SELECT id FROM generations")
        before = snapshot(db)
        assert proc.proc is not None
        pid = proc.proc.pid

        # A second `residents run` (a restart script, a second terminal): one line, exit 2, nothing written.
        code, out, err = await residents("run", "--discord-api", room.url, "--db", str(db), cwd=tmp_path)
        assert (code, err.splitlines()) == (2, [refusal(db, pid)]), out + err
        # `residents demo --db` on it: the same.
        code, out, err = await residents("demo", "--headless", "--port", "0", "--db", str(db), cwd=tmp_path)
        assert (code, err.splitlines()) == (2, [refusal(db, pid)]), out + err
        # A replay writing into it: the same.
        code, out, err = await residents(
            "replay", str(ROOT / "scenarios" / "ceiling.yaml"), "--db", str(db), cwd=tmp_path
        )
        assert (code, err.splitlines()) == (2, [refusal(db, pid)]), out + err
        assert snapshot(db) == before  # its live reply was not settled as interrupted, nothing posted
        assert db_rows(db, "SELECT status FROM generations") == [("pending",)]

        # The read-only verbs, beside it.
        code, out, err = await residents("ledger", "list", "--db", str(db), "--json", cwd=tmp_path)
        assert code == 0 and [g["id"] for g in json.loads(out)] == [gid], err
        code, out, err = await residents("ledger", "show", gid, "--db", str(db), "--json", cwd=tmp_path)
        assert code == 0 and json.loads(out)["id"] == gid, err
        code, out, err = await residents("ledger", "stumps", "--db", str(db), cwd=tmp_path)
        assert code == 0, err
        code, out, err = await residents("ledger", "verify", "--db", str(db), cwd=tmp_path)
        assert code == 0, out + err
        code, out, err = await residents("ledger", "export", "--db", str(db), "--out", "-", cwd=tmp_path)
        assert code == 0 and len(out.splitlines()) == len(db_rows(db, "SELECT seq FROM chain")), err
        assert snapshot(db) == before

        # The holder dies without a word: the next start is not blocked, and settles what it left.
        await proc.kill()
        await restart(room, proc)
        await room.wait_for_message(
            lambda m: m["author"] == "cairn" and truth.INTERRUPTED_SENTENCE in m["content"], timeout=10
        )
        assert proc.proc is not None
        code, out, err = await residents("run", "--discord-api", room.url, "--db", str(db), cwd=tmp_path)
        assert (code, err.splitlines()) == (2, [refusal(db, proc.proc.pid)]), out + err
        led = await check_ledger(db)
        await led.close()


# ---------------------------------------------------------------- read-only media


@contextlib.contextmanager
def read_only_medium(folder: Path) -> Iterator[Callable[[], None]]:
    """A tmpfs at `folder` (tests run as root), and a function that remounts it read-only: then
    nothing can write there, root included (a chmod would not stop root)."""
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], check=True, timeout=10)
    try:
        yield lambda: subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, timeout=10)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True, timeout=10)


@pytest.mark.parametrize("left", ["closed", "crashed"])
async def test_a_ledger_on_read_only_media_is_read_by_the_read_only_verbs(tmp_path: Path, left: str) -> None:
    """`closed`: the file alone (no -wal, no -shm: SQLite's `mode=ro` cannot open it, `immutable` can);
    `crashed`: its write-ahead log and index left beside it, holding the last writes."""
    with read_only_medium(tmp_path / "media") as remount_read_only:
        db = tmp_path / "media" / "ledger.db"
        code, out, err = await residents(
            "replay", str(ROOT / "scenarios" / "ceiling.yaml"), "--db", str(db), "--json", cwd=tmp_path
        )
        assert code == 0, err
        if left == "crashed":  # the files as a writer left them open: a change only in the WAL
            with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as writer:
                writer.execute("PRAGMA wal_autocheckpoint=0")
                writer.execute("UPDATE generations SET channel='moved'")
                for suffix in ("", "-wal", "-shm"):
                    shutil.copyfile(f"{db}{suffix}", f"{db}.copy{suffix}")
            for suffix in ("", "-wal", "-shm"):
                os.replace(f"{db}.copy{suffix}", f"{db}{suffix}")
            assert os.path.getsize(f"{db}-wal") > 0
        files = sorted(os.listdir(db.parent))
        remount_read_only()
        code, out, err = await residents("ledger", "list", "--db", str(db), "--json", cwd=tmp_path)
        assert code == 0, err
        rows = json.loads(out)
        assert len(rows) == 2 and all((r["channel"] == "moved") == (left == "crashed") for r in rows)
        row = rows[0]
        code, out, err = await residents("ledger", "show", row["id"], "--db", str(db), "--json", cwd=tmp_path)
        assert code == 0 and json.loads(out)["id"] == row["id"], err
        code, out, err = await residents("ledger", "stumps", "--db", str(db), "--json", cwd=tmp_path)
        assert code == 0 and len(json.loads(out)) >= 1, err
        code, out, err = await residents("ledger", "verify", "--db", str(db), cwd=tmp_path)
        if left == "closed":
            assert code == 0, out + err
        else:  # the change only the WAL holds is read, and the chain shows it was made behind its back
            assert code == 1 and out.count("the ledger no longer matches it: channel (entry replay, ledger moved)") == 2
        code, out, err = await residents("ledger", "export", "--db", str(db), "--out", "-", cwd=tmp_path)
        assert code == 0 and out.count("\n") > 1, err
        # A writer is told in one line why it cannot start there.
        code, out, err = await residents("ledger", "migrate", "--db", str(db), cwd=tmp_path)
        assert (code, err.splitlines()) == (
            1,
            [f"residents: {db}.lock: cannot lock the ledger for writing: Read-only file system"],
        )
        assert sorted(os.listdir(db.parent)) == files
