"""`residents run` with its ledger on a disk that fills: the real command against the local room and provider.

The ledger lives on a small tmpfs mounted for the test (the tests run as root here and in CI). Once
`residents run` is up, a file takes every free byte of it, a person mentions the resident, and the
ledger refuses the turn's writes ("database or disk is full"). What must hold: nothing is posted that
the ledger does not hold, the process keeps running without a traceback, and once the file is removed
the mention is answered, its generation settled with its true outcome (never `pending`, never "Process
stopped"), `verify` clean; a restart afterwards posts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from roomkit import error_guard, running_room
from test_crash import (
    MODEL,
    Process,
    bot_messages,
    check_ledger,
    db_rows,
    restart,
    streamed_chars,
    until,
    words,
    write_config,
)

from residents import truth
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the block, unmounted however it ends."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    assert done.returncode == 0, f"cannot mount a tmpfs (the test needs root): {done.stderr.decode()}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path) -> Path:
    """A file that takes every free byte of `disk`; removing it is the operator freeing space."""
    filler = disk / "filler"
    block = b"\0" * 65536
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
        for size in (4096, 512, 1):  # the last pages the large writes could not take
            while True:
                try:
                    f.write(block[:size])
                except OSError:
                    break
    return filler


async def answered(proc: Process, room: Any, before: int, text: str) -> None:
    """The resident's reply after the first `before` messages is `text` exactly, every post of it recorded."""
    await until(proc, lambda: " ".join(m["content"] for m in bot_messages(room)[before:]).split() == text.split(), 30)
    await until(proc, lambda: db_rows(proc.db, "SELECT count(*) FROM posts WHERE message_id IS NULL") == [(0,)], 10)


def shown_is_on_disk(room: Any, before: int, db: Path) -> bool:
    """What the room shows of the reply being written (live messages, marker aside) is text the ledger holds."""
    shown = " ".join(m["content"].removesuffix(truth.LIVE_MARKER) for m in bot_messages(room)[before:]).split()
    rows = db_rows(
        db,
        "SELECT text FROM attempt_chunks WHERE attempt_id = (SELECT id FROM attempts ORDER BY started_at DESC LIMIT 1)"
        " ORDER BY seq",
    )
    on_disk = "".join(bytes(r[0]).decode() for r in rows).split()
    return " ".join(on_disk).startswith(" ".join(shown))


@pytest.mark.parametrize("live", [False, True], ids=["posted", "live"])
async def test_a_mention_while_the_ledger_disk_is_full_is_answered_once_space_is_back(
    tmp_path: Path, live: bool
) -> None:
    """`live`: the resident shows its reply as it streams (policy `delivery.live`), so the disk fills while
    the reply is on screen: nothing more is shown than the ledger holds, and the settled room is the same."""
    write_config(tmp_path)
    if live:
        with open(tmp_path / "policies" / "crash.yaml", "a") as policy:
            policy.write("delivery:\n  live: true\n")
    provider = ProviderServer()
    await provider.start()
    with small_disk(tmp_path / "disk", "8m") as disk:
        async with error_guard() as guard, running_room(["general"]) as room:
            guard.ignore.append(lambda p: "aiohttp" in p and "Error handling request" in p)
            db = disk / "ledger.db"
            proc = Process(tmp_path, room.url, provider.url, db)
            try:
                provider.enqueue([Call(sse=sse.stream("The harbour is calm.", model=MODEL))])
                await restart(room, proc)
                room.post("general", "alice", "Hello, @cairn", mentions=["cairn"])
                await room.wait_for_message(lambda m: m["author"] == "cairn", timeout=15)
                await until(
                    proc, lambda: db_rows(db, "SELECT count(*) FROM posts WHERE message_id IS NULL") == [(0,)], 5
                )

                # 1. The disk is full before the mention: the turn waits to record its attempt, nothing is posted.
                first = words(3000, "f")
                provider.enqueue([Call(sse=sse.stream(first, model=MODEL))])
                filler = fill(disk)
                before = len(bot_messages(room))
                room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
                await until(proc, lambda: "not recorded yet" in proc.output(), 20)
                assert "database or disk is full" in proc.output()
                await asyncio.sleep(2)  # the ledger keeps refusing: the turn keeps waiting, the process runs on
                assert proc.proc is not None and proc.proc.returncode is None, proc.output()
                assert len(bot_messages(room)) == before
                os.unlink(filler)  # the operator frees space
                await answered(proc, room, before, first)

                # 2. The disk fills mid-stream: the provider generates the rest, the ledger refuses the text and
                #    the settlement, the generation waits `pending`, nothing is posted; then space comes back.
                second = words(6000, "s")
                body = sse.stream(second, model=MODEL)
                provider.enqueue([Call(sse=body, chunk_bytes=1500, chunk_delay=3.0 / (len(body) // 1500))])
                before = len(bot_messages(room))
                room.post("general", "alice", "And the lighthouse, @cairn?", mentions=["cairn"])
                await until(proc, lambda: streamed_chars(db) > 0, 15)
                filler = fill(disk)
                await until(proc, lambda: proc.output().count("not recorded yet") >= 2, 20)  # the settlement refused
                [(status,)] = db_rows(db, "SELECT status FROM generations ORDER BY created_at DESC LIMIT 1")
                assert status == "pending" and shown_is_on_disk(room, before, db)
                await asyncio.sleep(1)
                assert shown_is_on_disk(room, before, db)
                assert live or len(bot_messages(room)) == before
                os.unlink(filler)
                await answered(proc, room, before, second)

                # 3. Stopped while the ledger refuses a turn: a clean stop, and nothing of the turn recorded
                #    (its attempt and generation are one write, refused whole), so nothing is left open.
                provider.enqueue([Call(sse=sse.stream("Never recorded.", model=MODEL))])
                filler = fill(disk)
                room.post("general", "alice", "One more, @cairn", mentions=["cairn"])
                await until(proc, lambda: proc.output().count("not recorded yet") >= 3, 20)
                assert await proc.stop() == 0, proc.output()
                assert proc.tracebacks() == [], proc.output()
                assert proc.output().count("recorded after") >= 2
                assert "not recorded: the process stopped while the ledger refused writes" in proc.output()
                os.unlink(filler)

                led = await check_ledger(db)  # verify, pending generations counted as violations
                try:
                    gids = [r[0] for r in db_rows(db, "SELECT id FROM generations ORDER BY created_at")]
                    for gid, text in zip(gids[1:], (first, second), strict=True):
                        g = await led.get_generation(gid)
                        assert g is not None and (g.status, g.stop_reason, g.text) == ("completed", "end_turn", text)
                        assert {p.kind for p in g.posts} == {"speech"} and all(p.message_id for p in g.posts)
                finally:
                    await led.close()

                # A restart finds nothing left open: no receipt of a stop that did not happen, nothing posted.
                after = len(bot_messages(room))
                await restart(room, proc)
                assert "recovered after a stop" not in proc.output()
                assert await proc.stop() == 0, proc.output()
                assert len(bot_messages(room)) == after
                assert not any(truth.INTERRUPTED_SENTENCE in m["content"] for m in bot_messages(room))
                assert proc.tracebacks() == [], proc.output()
            finally:
                if proc.proc is not None and proc.proc.returncode is None:
                    proc.proc.kill()
                    await proc.proc.wait()
                await provider.stop()
