"""Meaning in types: a post records why it exists, and `ledger verify` reads that, never the wording."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import Room, residence

from residents import truth
from residents.ledger import Ledger
from residents.ledger.connection import Connection
from residents.ledger.migrations import MIGRATIONS
from residents.ledger.store import stored_bytes
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.records import Generation, Post, PostKind, PostReason, Status, new_id


async def _reasons(ledger: Ledger, gid: str) -> list[tuple[str, str]]:
    rows = await ledger.db.execute_fetchall(
        "SELECT kind, reason FROM posts WHERE generation_id=$1 ORDER BY seq", (gid,)
    )
    return [(r[0], r[1]) for r in rows]


async def test_each_post_records_why_it_exists(pipeline) -> None:
    """Text, receipt, a refusal's notice, a retry's side notice and a declined /continue each say why."""
    res = pipeline.resident(
        residence(policy={"retries": {"max_attempts": 3, "backoff_seconds": 0}, "notices": {"retry_abandoned": True}})
    )
    room = Room()
    cut, _ = await pipeline.turn(res, room, "go", [Call(sse=sse.stream("A cut reply that stops mid", "max_tokens", 9))])
    assert await _reasons(pipeline.ledger, cut.generation.id) == [("partial", "text"), ("receipt", "receipt")]
    refused, _ = await pipeline.turn(res, room, "again", [Call(sse=sse.stream("No.", "refusal", 2))])
    assert await _reasons(pipeline.ledger, refused.generation.id) == [("notice", "refusal")]
    retried, _ = await pipeline.turn(
        res, room, "more", [Call(sse=sse.stream("a fragment " * 20), end="drop"), Call(sse=sse.stream("Whole words."))]
    )
    assert await _reasons(pipeline.ledger, retried.generation.id) == [
        ("speech", "text"),
        ("notice", "abandoned-notice"),
    ]
    declined = await res.continue_generation(room, "room", cut.generation.id)
    assert declined.declined and [(p.kind, p.reason) for p in declined.posts] == [("notice", "declined-continue")]
    assert await verify(pipeline.ledger) == []


async def _refused_with(ledger: Ledger, *notices: tuple[str, PostReason]) -> str:
    g = Generation(
        id=new_id("g-"),
        residence="cairn",
        channel="room",
        model="claude-3-opus-20240229",
        status=Status.REFUSED,
        stop_reason="refusal",
    )
    await ledger.create_generation(g)
    await ledger.finish_generation(g, [])
    await ledger.add_posts(
        [
            Post(new_id("p-"), g.id, i, PostKind.NOTICE, content, "room", reason=reason)
            for i, (content, reason) in enumerate(notices, 1)
        ]
    )
    return g.id


async def test_verify_tells_notices_apart_by_their_reason_not_their_wording(tmp_path) -> None:
    """A line worded like a retry notice but recorded as a refusal's is a second refusal notice."""
    refusal = truth.RECEIPT_PREFIX + truth.notice(truth.Ending(Status.REFUSED, "refusal", 2, 0))
    side = truth.RECEIPT_PREFIX + truth.abandoned_notice(1, 40)
    ledger = await Ledger.open(tmp_path / "l.db")
    try:
        await _refused_with(ledger, (refusal, PostReason.REFUSAL), (side, PostReason.ABANDONED_NOTICE))
        assert await verify(ledger) == []
        gid = await _refused_with(ledger, (refusal, PostReason.REFUSAL), (side, PostReason.REFUSAL))
        assert await verify(ledger) == [
            f"generation {gid}: refused generation has 2 notices of the refusal, expected 1"
        ]
    finally:
        await ledger.close()


async def test_a_post_whose_reason_does_not_fit_its_kind_is_a_violation(tmp_path) -> None:
    ledger = await Ledger.open(tmp_path / "l.db")
    try:
        line = truth.RECEIPT_PREFIX + truth.declined_continue(truth.Declined("no-generation-here", "cairn"))
        post = Post(new_id("p-"), None, 1, PostKind.NOTICE, line, "room", reason=PostReason.TEXT)
        await ledger.add_posts([post])
        assert await verify(ledger) == [f"post {post.id}: a notice post with reason 'text'"]
    finally:
        await ledger.close()


async def test_posts_recorded_before_the_reason_column_get_theirs_once_from_the_migration(tmp_path) -> None:
    """m016_post_reason derives each old post's reason once; afterwards nothing reads wording."""
    path = tmp_path / "old.db"
    db = await Connection.open(path)
    await db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    for name, sql in MIGRATIONS:
        if name == "m016_post_reason":
            break
        await db.executescript(f"BEGIN;\n{sql}\nINSERT INTO _migrations VALUES ('{name}', 0);\nCOMMIT;")
    await db.execute(
        "INSERT INTO generations (id, residence, channel, model, status, text, chars, standing,"
        " continuation_ended, created_at) VALUES ('g-1', 'cairn', 'room', 'm', 'refused', $1, 0, 'none',"
        " 'not-needed', 0)",
        (stored_bytes(""),),
    )
    old = [
        ("partial", "Some text"),
        ("receipt", truth.RECEIPT_PREFIX + truth.ceiling_sentence(9)),
        ("notice", truth.RECEIPT_PREFIX + truth.notice(truth.Ending(Status.REFUSED, "refusal", 2, 0))),
        ("notice", truth.RECEIPT_PREFIX + truth.abandoned_notice(2, 300)),
        ("notice", truth.RECEIPT_PREFIX + truth.declined_continue(truth.Declined("standing", "cairn", None, "none"))),
        ("notice", truth.RECEIPT_PREFIX + truth.key_rejected_notice("http-401")),
        ("notice", truth.RECEIPT_PREFIX + truth.notice(truth.Ending(Status.FAILED, None, None, 0, error="x"))),
    ]
    for i, (kind, content) in enumerate(old, 1):
        await db.execute(
            "INSERT INTO posts (id, generation_id, seq, kind, content, channel) VALUES ($1,$2,$3,$4,$5,$6)",
            (f"p-{i}", "g-1", i, kind, stored_bytes(content), "room"),
        )
    await db.close()
    ledger = await Ledger.open(path)
    try:
        g = await ledger.get_generation("g-1")
        assert g is not None
        assert [p.reason for p in g.posts] == [
            "text",
            "receipt",
            "refusal",
            "abandoned-notice",
            "declined-continue",
            "key-rejected",
            "no-text",
        ]
        assert all(isinstance(p.reason, PostReason) for p in g.posts)
    finally:
        await ledger.close()


async def test_a_ledger_opened_with_async_with_is_closed_however_the_block_ends(tmp_path) -> None:
    """`async with Ledger.open(path) as ledger:` is how every command opens one; the block's end closes it."""
    async with Ledger.open(tmp_path / "l.db") as ledger:
        assert (await ledger.db.execute_fetchall("SELECT count(*) FROM posts"))[0][0] == 0
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        await ledger.db.execute("SELECT 1")
    with pytest.raises(RuntimeError, match="inside"):
        async with Ledger.open(tmp_path / "l.db") as again:
            raise RuntimeError("inside")
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        await again.db.execute("SELECT 1")
    opened = await Ledger.open(tmp_path / "l.db")  # awaited, it is open until closed
    async with opened:
        pass
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        await opened.db.execute("SELECT 1")
