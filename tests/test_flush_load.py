"""The flush bound under load: many streams at once, the ledger's one writer, a provider that stalls.

Real parts: the anthropic SDK against the local provider (which stalls mid-stream on request), the
pipeline's `Generator` on one client and one ledger, SQLite on disk, and a second connection reading
what is on disk, as a process started after a SIGKILL would.
"""

from __future__ import annotations

import asyncio
import sqlite3
import struct
from pathlib import Path
from typing import Any

from residents.config import build_residence
from residents.generation.attempts import FLUSH_SECONDS, AttemptRunner
from residents.generation.run import Generator
from residents.ledger import Ledger, LedgerWriteError
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider.anthropic_messages import AnthropicProvider, make_client
from residents.records import Attempt, Generation, new_id

ROOT = Path(__file__).resolve().parent.parent
MODEL = "claude-3-opus-20240229"
STREAMS = 40
STALLING = 20  # few enough that a loaded 2-core machine still reads every stream in time


def wal_commits(db: Path) -> int:
    """Commits in the WAL file since it was last reset: frames of the current salt that end a transaction."""
    data = (db.parent / (db.name + "-wal")).read_bytes()
    if len(data) < 32:
        return 0
    page = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    commits, off = 0, 32
    while off + 24 + page <= len(data):
        head = data[off : off + 24]
        if head[8:16] != salts:
            break
        commits += struct.unpack(">I", head[4:8])[0] != 0
        off += 24 + page
    return commits


async def streaming_attempts(ledger: Ledger, n: int) -> list[str]:
    """`n` generations, each with one attempt streaming, as the pipeline records them before a stream."""
    ids = []
    for _ in range(n):
        g = Generation(id=new_id("g-"), residence="cairn", channel="c", model=MODEL)
        a = Attempt(id=new_id("a-"), generation_id=g.id, segment=0, index=1)
        await ledger.start_attempt(a, g)
        ids.append(a.id)
    return ids


async def test_chunk_writes_asked_for_at_once_share_one_commit(tmp_path: Path) -> None:
    """40 streams flushing at the same moment are written by at most two commits (the first alone, the
    rest together), not 40 queued ones, and every chunk is on disk for a second connection."""
    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as ledger:
        ids = await streaming_attempts(ledger, STREAMS)
        await ledger.db.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
        assert wal_commits(db) == 0
        await asyncio.gather(*(ledger.add_chunks(a, [(0, 0, "text", f"piece of {a}", None)]) for a in ids))
        assert 1 <= wal_commits(db) <= 2, f"{wal_commits(db)} commits for {STREAMS} chunk writes asked at once"
        with sqlite3.connect(db) as other:
            rows = dict(other.execute("SELECT attempt_id, text FROM attempt_chunks").fetchall())
        assert {a: bytes(t).decode() for a, t in rows.items()} == {a: f"piece of {a}" for a in ids}


async def test_a_change_that_fails_leaves_the_others_of_its_commit_alone(tmp_path: Path) -> None:
    """Changes sharing a commit are each all-or-nothing: one that fails (a chunk of an attempt that does
    not exist, with its second row) raises for its caller only; the others are on disk, the failed one's
    rows are not."""
    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as ledger:
        ids = await streaming_attempts(ledger, 3)
        writes = [ledger.add_chunks(a, [(0, 0, "text", "kept", None), (1, 0, "text", "kept too", None)]) for a in ids]
        bad = ledger.add_chunks("a-missing", [(0, 0, "text", "lost", None), (1, 0, "text", "lost too", None)])
        results = await asyncio.gather(writes[0], bad, *writes[1:], return_exceptions=True)
        assert isinstance(results[1], sqlite3.IntegrityError), results
        assert [r for i, r in enumerate(results) if i != 1] == [None, None, None]
        with sqlite3.connect(db) as other:
            rows = other.execute("SELECT attempt_id, count(*) FROM attempt_chunks GROUP BY attempt_id").fetchall()
        assert dict(rows) == {a: 2 for a in ids}


async def test_streams_stalling_at_once_are_on_disk_within_the_flush_bound(tmp_path: Path) -> None:
    """20 generations at once, each sent ~60 characters at the same moment and then a 1.5 s
    stall: a second connection reads every stream's text within FLUSH_SECONDS (250 ms) of the server
    sending it. A timer of 250 ms, or 20 commits queued one after another, misses it."""
    db = tmp_path / "ledger.db"
    loop = asyncio.get_running_loop()
    sent: dict[str, float] = {}

    def answer(req: dict[str, Any]) -> Call:
        """Every stream's text goes out at one moment, once all requests are in, then each stalls."""
        tag = req["messages"][-1]["content"]
        at = sent.setdefault("", loop.time() + 1.0)
        sent[tag] = at
        return Call(
            sse=sse.stream(f"[{tag}] " + "words of the reply " * 3, finish=False, model=MODEL),
            end="stall",
            stall_seconds=1.5,
            delay_seconds=at - loop.time(),
        )

    res = build_residence(
        {"name": "cairn", "model": MODEL, "max_tokens": 1024, "policy": {"retries": {"max_attempts": 1}}},
        "<test>",
        None,
        ROOT,
    )
    server = ProviderServer(answer)
    await server.start()
    client = make_client(server.url, "test-key")
    try:
        async with Ledger.open(db) as ledger, Ledger.open(db) as reader:
            gen = Generator(AttemptRunner(AnthropicProvider(client), ledger))
            tags = [f"s{i:02d}" for i in range(STALLING)]
            tasks = [
                asyncio.create_task(
                    gen.generate(
                        res, "c", {"model": MODEL, "max_tokens": 1024, "messages": [{"role": "user", "content": tag}]}
                    )
                )
                for tag in tags
            ]
            try:
                full = {tag: f"[{tag}] " + "words of the reply " * 3 for tag in tags}
                on_disk: dict[str, float] = {}
                while len(on_disk) < len(tags) and loop.time() - sent.get("", loop.time() + 10) < 1.4:
                    await asyncio.sleep(0.005)
                    rows = await reader.db.execute_fetchall(
                        "SELECT c.text FROM attempt_chunks c JOIN attempts a ON a.id = c.attempt_id"
                        " WHERE a.outcome = 'streaming' ORDER BY c.attempt_id, c.seq"
                    )
                    now = loop.time()
                    texts = "".join(bytes(r[0]).decode() for r in rows)
                    for tag in tags:
                        if tag not in on_disk and full[tag] in texts:
                            on_disk[tag] = now
                assert len(sent) == len(tags) + 1, "a request reached the provider after the streams were sent"
                assert len(on_disk) == len(tags), (
                    f"{len(tags) - len(on_disk)} streams' text not on disk during the stall"
                )
                waited = sorted(on_disk[t] - sent[t] for t in tags)
                assert waited[-1] <= FLUSH_SECONDS, (
                    f"on disk {waited[-1] * 1000:.0f} ms after it was sent (bound 250 ms)"
                )
                gens = await asyncio.gather(*tasks)
                assert {g.status for g in gens} == {"failed"}  # the stall ends in a dropped connection
                assert sorted(g.text for g in gens) == sorted(full.values())
            finally:  # no stream outlives the ledger, whatever failed
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await client.close()
        await server.stop()


async def test_a_change_failing_outside_sqlite_leaves_the_others_of_its_commit_alone(tmp_path: Path) -> None:
    """A change that fails before SQLite sees it (a lone surrogate in a text parameter, an integer too
    big for SQLite) is that change's failure only: the changes sharing its commit still reach disk."""
    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as ledger:
        ids = await streaming_attempts(ledger, 3)
        writes = [ledger.add_chunks(a, [(0, 0, "text", "kept", None), (1, 0, "text", "kept too", None)]) for a in ids]
        surrogate = ledger.add_chunks(ids[0], [(5, 0, "te\ud800xt", "lost", None), (6, 0, "text", "lost", None)])
        huge = ledger.add_chunks(ids[1], [(2**70, 0, "text", "lost", None), (7, 0, "text", "lost", None)])
        results = await asyncio.gather(writes[0], surrogate, huge, *writes[1:], return_exceptions=True)
        assert isinstance(results[1], UnicodeEncodeError) and isinstance(results[2], OverflowError), results
        assert [results[0], *results[3:]] == [None, None, None], results
        with sqlite3.connect(db) as other:
            rows = other.execute("SELECT attempt_id, count(*) FROM attempt_chunks GROUP BY attempt_id").fetchall()
        assert dict(rows) == {a: 2 for a in ids}
        assert not other.in_transaction
        [(n,)] = await ledger.db.execute_fetchall("SELECT count(*) FROM attempt_chunks")
        assert n == 6


async def test_a_chunk_write_that_failed_is_written_again_not_left_as_a_hole(tmp_path: Path) -> None:
    """A chunk write that fails (here: refused by a trigger, as a full disk or a busy lock would) leaves its
    text pending: the next write carries it, so what is on disk is always a prefix of what arrived, never
    the text with a piece missing from its middle (which recovery after a crash would settle as said)."""
    from residents.generation.attempts import LedgerSink

    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as ledger:
        [aid] = await streaming_attempts(ledger, 1)
        sink = LedgerSink(ledger, aid)
        sink.start(0, "text", "", None)
        sink.add("one ")
        await sink.flush()
        await ledger.db.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON attempt_chunks BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        sink.add("two ")
        try:
            await sink.flush()
        except sqlite3.IntegrityError:
            pass
        else:
            raise AssertionError("the refused write did not fail")
        await ledger.db.execute("DROP TRIGGER refuse")
        sink.add("three")
        await sink.flush()
        await sink.close()
        assert await ledger.streamed_text(aid) == "one two three"
        assert sink.text() == "one two three"


async def test_a_change_that_fills_the_disk_fails_alone_and_says_so(tmp_path: Path) -> None:
    """A full disk (SQLite's page limit, here) rolls back the whole transaction, not just the statement:
    the change that hit it is told `database or disk is full`, and the changes sharing its commit are
    written again without it, so they still reach disk. Alone, too, the change is told the real cause."""
    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as ledger:
        ids = await streaming_attempts(ledger, 3)
        [(pages,)] = await ledger.db.execute_fetchall("PRAGMA page_count")
        await ledger.db.execute_fetchall(f"PRAGMA max_page_count={pages + 3}")
        big = [(0, 0, "text", "x" * 200_000, None), (1, 0, "text", "y", None)]
        results = await asyncio.gather(
            ledger.add_chunks(ids[0], [(0, 0, "text", "kept", None)]),
            ledger.add_chunks(ids[1], big),
            ledger.add_chunks(ids[2], [(0, 0, "text", "kept", None), (1, 0, "text", "kept too", None)]),
            return_exceptions=True,
        )
        assert results[0] is None and results[2] is None, results
        # Typed as a write the disk refused (the same change may be asked for again), SQLite's error its cause.
        assert isinstance(results[1], LedgerWriteError) and "full" in str(results[1]), results
        assert isinstance(results[1].__cause__, sqlite3.OperationalError), results
        alone = await asyncio.gather(ledger.add_chunks(ids[1], big), return_exceptions=True)
        assert isinstance(alone[0], LedgerWriteError) and "full" in str(alone[0]), alone
        with sqlite3.connect(db) as other:
            rows = other.execute("SELECT attempt_id, count(*) FROM attempt_chunks GROUP BY attempt_id").fetchall()
        assert dict(rows) == {ids[0]: 1, ids[2]: 2}
        await ledger.add_chunks(ids[1], [(0, 0, "text", "fits", None)])  # the connection is usable still


async def test_a_timed_write_that_failed_is_tried_again_while_the_provider_stalls(tmp_path: Path) -> None:
    """The timer's write fails (refused, as a busy lock or a full disk would) and no further delta comes
    (a stalled provider): the timer tries again, so the text reaches disk once the ledger takes writes,
    not only when the attempt settles."""
    from residents.generation.attempts import FLUSH_TIMER, LedgerSink

    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as ledger:
        [aid] = await streaming_attempts(ledger, 1)
        await ledger.db.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON attempt_chunks BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        sink = LedgerSink(ledger, aid)
        sink.start(0, "text", "before the stall", None)
        await asyncio.sleep(FLUSH_TIMER + 0.1)  # the timed write ran, and failed
        assert await ledger.streamed_text(aid) == ""
        await ledger.db.execute("DROP TRIGGER refuse")
        for _ in range(40):
            await asyncio.sleep(0.05)
            if await ledger.streamed_text(aid):
                break
        await sink.close()
        assert await ledger.streamed_text(aid) == "before the stall"


async def test_a_failed_change_of_a_cancelled_caller_is_reported_by_the_ledger(
    tmp_path: Path, caplog: Any, expected_errors: list[str]
) -> None:
    """A caller cancelled while its change waits for the commit is not there to be told the change failed:
    the ledger logs it (an ERROR naming the ledger and the error), not asyncio's anonymous 'never retrieved'."""
    import gc

    expected_errors.append("a change whose caller was cancelled failed")
    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as ledger:
        [aid] = await streaming_attempts(ledger, 1)
        task = asyncio.create_task(ledger.add_chunks("a-missing", [(0, 0, "text", "lost", None)]))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await ledger.add_chunks(aid, [(0, 0, "text", "after", None)])  # its commit follows the failed one
        gc.collect()
    logged = [r for r in caplog.records if r.name.startswith("residents.ledger")]
    assert any("cancelled" in r.getMessage() and "FOREIGN KEY" in r.getMessage() for r in logged), caplog.records
