"""The ledger's own connection (`residents/ledger/connection.py`): public sqlite3 only, one thread, in order.

The ledger once reached into private internals of `aiosqlite` (`_execute`, `_conn`, `_tx`) that older
versions its bound allowed lacked; it now owns its connection, and `aiosqlite` is no dependency at all
(tests/test_ledger_process.py runs the package with it unimportable).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from residents.ledger.connection import Connection


async def test_calls_run_on_one_thread_in_the_order_asked(tmp_path) -> None:
    db = await Connection.open(tmp_path / "c.db")
    try:
        threads: list[int] = []
        await db.execute("CREATE TABLE t (n INTEGER)")
        calls = [
            db.run(
                lambda conn, n: (
                    threads.append(threading.get_ident()),
                    conn.execute("INSERT INTO t VALUES ($1)", (n,)),
                ),
                n,
            )
            for n in range(50)
        ]
        await asyncio.gather(*calls)
        assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
        assert [r[0] for r in await db.execute_fetchall("SELECT n FROM t ORDER BY rowid")] == list(range(50))
    finally:
        await db.close()


async def test_a_call_whose_caller_is_cancelled_still_runs_to_its_end(tmp_path) -> None:
    """A COMMIT asked for is never skipped because its caller went away: no transaction is left open."""
    db = await Connection.open(tmp_path / "c.db")
    try:
        await db.execute("CREATE TABLE t (n INTEGER)")
        await db.execute("BEGIN IMMEDIATE")
        await db.execute("INSERT INTO t VALUES (1)")
        gate = threading.Event()
        blocked = db.run(lambda conn: gate.wait(5))
        commit = asyncio.ensure_future(db.execute("COMMIT"))
        await asyncio.sleep(0)
        commit.cancel()  # while the thread is still busy: the COMMIT has not run yet
        gate.set()
        await blocked
        with pytest.raises(asyncio.CancelledError):
            await commit
        assert await db.run(lambda conn: conn.in_transaction) is False
        assert [r[0] for r in await db.execute_fetchall("SELECT n FROM t")] == [1]
    finally:
        await db.close()


async def test_a_closed_connection_says_so(tmp_path) -> None:
    db = await Connection.open(tmp_path / "c.db")
    await db.close()
    with pytest.raises(sqlite3.ProgrammingError, match=r"c\.db: the connection is closed"):
        await db.execute("SELECT 1")
    await db.close()  # twice is harmless
