"""Crash: `residents run` killed with SIGKILL mid-stream and mid-delivery, then restarted.

The real command runs as a subprocess against a local room and a local provider served from this
test process, so the room and the provider outlive the kill, exactly as Discord and Anthropic
outlive a crashed bot. On restart, start-up recovery (residents/generation/recovery.py settles, then
residents/delivery/resume.py plans and delivers) must record the generation as interrupted with the text
that reached the ledger (within the 2,048-character flush bound), deliver or close every
undelivered post, post nothing twice, and leave `verify` clean.

The first half drives recovery directly over ledger states written the way the pipeline writes
them, one for each window a crash can fall in, so each rule is pinned down without a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from residents import truth
from residents.config import build_residence
from residents.delivery.outbox import Outbox
from residents.delivery.resume import RoomUnavailable, Seen, recover, resume_delivery
from residents.generation.attempts import FLUSH_CHARS, AttemptRunner
from residents.generation.run import Generator
from residents.ledger import Ledger
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider.anthropic_messages import AnthropicProvider, make_client
from residents.records import Attempt, Generation, Post, Segment, Stump, new_id
from residents.replay.run import CollectingRoom
from residents.resident import Resident

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roomkit import error_guard, eventually, running_room  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = "claude-3-opus-20240229"


def words(n_chars: int, tag: str = "w") -> str:
    """Distinct words, so a prefix or a duplicate is unambiguous."""
    out, i = [], 0
    while sum(map(len, out)) + len(out) < n_chars:
        out.append(f"{tag}{i:05d}")
        i += 1
    return " ".join(out)[:n_chars]


# ---------------------------------------------------------------- ledger states, one per crash window


async def pending(ledger: Ledger, residence: str = "cairn", standing: str = "none", channel: str = "100") -> Generation:
    g = Generation(id=new_id("g-"), residence=residence, channel=channel, model=MODEL, standing=standing)
    await ledger.create_generation(g)
    return g


async def streaming(ledger: Ledger, g: Generation, chunks: list[str], segment: int = 1, index: int = 1) -> Attempt:
    a = Attempt(id=new_id("a-"), generation_id=g.id, segment=segment, index=index)
    await ledger.start_attempt(a)
    for seq, c in enumerate(chunks):
        await ledger.add_chunk(a.id, seq, c)
    return a


async def ended(
    ledger: Ledger,
    g: Generation,
    text: str,
    stop: str | None,
    outcome: str,
    segment: int = 1,
    index: int = 1,
    tokens: int | None = 100,
) -> Attempt:
    a = await streaming(ledger, g, [], segment, index)
    a.text, a.stop_reason, a.outcome, a.output_tokens, a.ended_at = text, stop, outcome, tokens, time.time()
    await ledger.finish_attempt(a)
    return a


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    led = await Ledger.open(tmp_path / "ledger.db")
    try:
        yield led
    finally:
        await led.close()


async def test_a_stream_cut_by_a_stop_is_settled_as_interrupted_with_its_flushed_text(ledger: Ledger) -> None:
    g = await pending(ledger)
    a = await streaming(ledger, g, ["First flushed piece. ", "Second piece, cut mid-wo"])
    rec = await recover(ledger, {"cairn"})
    assert rec.interrupted == [g.id]
    got = await ledger.get_generation(g.id)
    assert got is not None
    kept = "First flushed piece. Second piece, cut mid-wo"
    assert (got.status, got.stop_reason, got.text) == ("incomplete", truth.INTERRUPTED, kept)
    [att] = got.attempts
    assert (att.id, att.outcome, att.error, att.discard_reason, att.text) == (
        a.id,
        "incomplete",
        truth.INTERRUPTED,
        truth.INTERRUPTED,
        kept,
    )
    [stump] = got.stumps
    assert (stump.scope, stump.cause, stump.text, stump.published) == ("output", truth.INTERRUPTED, kept, False)
    assert [(p.kind, p.content) for p in got.posts] == [
        ("partial", kept),
        ("receipt", "-# " + truth.INTERRUPTED_SENTENCE),
    ]
    assert (
        truth.INTERRUPTED_SENTENCE
        == "Process stopped before this output was finished; the remainder was not generated."
    )
    assert await ledger.streamed_text(a.id) == ""  # chunks folded into the attempt's text
    assert await verify(ledger) == []


async def test_a_stop_before_any_text_leaves_one_notice(ledger: Ledger) -> None:
    g = await pending(ledger)  # the process stopped before the first attempt was recorded
    await recover(ledger)
    got = await ledger.get_generation(g.id)
    assert got is not None and got.status == "incomplete" and got.text == ""
    assert [(p.kind, p.content) for p in got.posts] == [
        ("notice", "-# Process stopped before this output was finished; no text was generated.")
    ]
    assert await verify(ledger) == []


async def test_an_attempt_that_ended_before_the_stop_settles_the_generation_by_its_outcome(ledger: Ledger) -> None:
    g = await pending(ledger)
    await ended(ledger, g, "A whole answer.", "end_turn", "completed")
    g2 = await pending(ledger)
    await ended(ledger, g2, "Cut at the ceiling", "max_tokens", "truncated", tokens=1024)
    rec = await recover(ledger)
    assert sorted(rec.settled) == sorted([g.id, g2.id]) and rec.interrupted == []
    done = await ledger.get_generation(g.id)
    cut = await ledger.get_generation(g2.id)
    assert done is not None and cut is not None
    assert (done.status, [(p.kind, p.content) for p in done.posts]) == ("completed", [("speech", "A whole answer.")])
    assert cut.status == "truncated" and [p.kind for p in cut.posts] == ["partial", "receipt"]
    assert cut.posts[-1].content == "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
    assert [s.cause for s in cut.stumps] == ["max_tokens"]
    assert await verify(ledger) == []


async def test_a_stop_during_a_retry_backoff_keeps_the_abandoned_text_and_closes_the_generation(ledger: Ledger) -> None:
    g = await pending(ledger)
    a = await streaming(ledger, g, ["Text before the provider failed"])
    a.text, a.outcome, a.discard_reason, a.error = (
        "Text before the provider failed",
        "abandoned",
        truth.RETRY_ABANDONED,
        "overloaded_error",
    )
    a.ended_at = time.time()
    await ledger.finish_attempt(
        a,
        [
            Stump(
                id=new_id("s-"),
                generation_id=g.id,
                attempt_id=a.id,
                cause=truth.RETRY_ABANDONED,
                text=a.text,
                output_tokens=None,
                residence="cairn",
            )
        ],
    )
    await recover(ledger)
    got = await ledger.get_generation(g.id)
    assert got is not None
    assert (got.status, got.stop_reason, got.text) == ("incomplete", truth.INTERRUPTED, "")
    assert [s.cause for s in got.stumps] == [truth.RETRY_ABANDONED]  # the fragment is still kept
    assert [p.kind for p in got.posts] == ["notice"]
    # The retry that would have replaced the abandoned attempt never started: the process stopped.
    assert await verify(ledger) == []


async def test_a_stop_during_bounded_continuation_keeps_the_unjudged_segment_as_a_stump(ledger: Ledger) -> None:
    g = await pending(ledger, standing="bounded")
    await ended(ledger, g, "Segment one, cut at the ceil", "max_tokens", "truncated", tokens=1024)
    s2 = await streaming(ledger, g, ["ing and segment two so f"], segment=2)
    await recover(ledger)
    got = await ledger.get_generation(g.id)
    assert got is not None
    assert (got.status, got.stop_reason, got.text) == ("incomplete", truth.INTERRUPTED, "Segment one, cut at the ceil")
    assert {(s.scope, s.cause, s.attempt_id, s.text) for s in got.stumps} == {
        ("attempt", truth.INTERRUPTED, s2.id, "ing and segment two so f"),
        ("output", truth.INTERRUPTED, got.segments[0].attempt_id, "Segment one, cut at the ceil"),
    }
    assert await verify(ledger) == []


async def test_a_continue_on_request_cut_by_a_stop_gets_its_one_receipt(ledger: Ledger) -> None:
    g = await pending(ledger, standing="on-request")
    a1 = await ended(ledger, g, "Cut at the ceil", "max_tokens", "truncated", tokens=1024)
    g.text, g.status, g.stop_reason, g.output_tokens, g.finished_at = (
        "Cut at the ceil",
        "truncated",
        "max_tokens",
        1024,
        time.time(),
    )
    g.continuation_ended = "disabled"
    g.segments = [Segment(1, a1.id, "max_tokens", len(g.text), 1024)]
    out = Stump(
        id=new_id("s-"),
        generation_id=g.id,
        attempt_id=a1.id,
        cause="max_tokens",
        text=g.text,
        output_tokens=1024,
        scope="output",
        residence="cairn",
    )
    await ledger.finish_generation(g, [out])
    posts = [
        Post(new_id("p-"), g.id, 1, "partial", g.text, "100"),
        Post(new_id("p-"), g.id, 2, "receipt", "-# " + truth.ceiling_sentence(1024), "100"),
    ]
    await ledger.add_posts(posts)
    for i, p in enumerate(posts):
        await ledger.mark_delivered(p, f"m{i}")
    a2 = await streaming(ledger, g, ["ing, and then"], segment=2)  # a moderator's /continue, cut
    rec = await recover(ledger)
    assert rec.stray == [g.id]
    got = await ledger.get_generation(g.id)
    assert got is not None and got.status == "truncated" and got.text == "Cut at the ceil"
    assert [(p.kind, p.message_id is None) for p in got.posts] == [
        ("partial", False),
        ("receipt", False),
        ("receipt", True),
    ]
    assert got.posts[-1].content == "-# " + truth.INTERRUPTED_SENTENCE
    assert any(s.attempt_id == a2.id and s.cause == truth.INTERRUPTED for s in got.stumps)
    assert await verify(ledger) == []


async def test_a_generation_settled_but_never_planned_gets_its_posts(ledger: Ledger) -> None:
    g = await pending(ledger)
    a = await ended(ledger, g, "Said in full.", "end_turn", "completed")
    g.text, g.status, g.stop_reason, g.finished_at = "Said in full.", "completed", "end_turn", time.time()
    g.segments = [Segment(1, a.id, "end_turn", len(g.text), 100)]
    await ledger.finish_generation(g, [])
    rec = await recover(ledger)
    assert rec.planned == [g.id]
    got = await ledger.get_generation(g.id)
    assert got is not None and [(p.kind, p.content) for p in got.posts] == [("speech", "Said in full.")]
    assert await verify(ledger) == []


async def test_recovery_is_idempotent_and_leaves_other_residences_alone(ledger: Ledger) -> None:
    mine = await pending(ledger)
    await streaming(ledger, mine, ["some text"])
    theirs = await pending(ledger, residence="replayed")  # perhaps another process's, live
    await streaming(ledger, theirs, ["still streaming elsewhere"])
    await recover(ledger, {"cairn"})
    first = await ledger.get_generation(mine.id)
    again = await recover(ledger, {"cairn"})
    assert again.interrupted == again.settled == again.stray == again.planned == []
    assert await ledger.get_generation(mine.id) == first
    other = await ledger.get_generation(theirs.id)
    assert other is not None and other.status == "pending" and other.attempts[0].outcome == "streaming"


REASONING = "The harbour charter came first; then the quay, the dredging, the railway. " * 8


def _reasoning_stream(reply: str) -> bytes:
    """A stream of a reasoning block (and, when `reply`, a text block after it) that then stalls."""
    out = sse.event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_stall",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 9, "output_tokens": 1},
            },
        },
    )
    out += sse.event(
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
    )
    out += b"".join(
        sse.event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": p}},
        )
        for p in sse.pieces(REASONING, 40)
    )
    if reply:
        out += sse.event("content_block_stop", {"type": "content_block_stop", "index": 0})
        out += sse.event(
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        )
        out += b"".join(
            sse.event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": p}},
            )
            for p in sse.pieces(reply, 12)
        )
    return out


@pytest.mark.parametrize("reply", ["", "The charter came first, then the quay and the dredging company, then the ra"])
async def test_a_stop_while_the_provider_stalls_keeps_every_block_that_arrived(tmp_path: Path, reply: str) -> None:
    """The provider stalls inside a reasoning block (or the text after it). Within the 250 ms bound every
    block's content is on disk with its type, so a SIGKILL at that instant loses nothing that arrived:
    recovery, run over a copy of the file as the kill would leave it, rebuilds the blocks and settles."""
    db, copy = tmp_path / "ledger.db", tmp_path / "at-the-kill.db"
    res = build_residence(
        {
            "name": "cairn",
            "model": MODEL,
            "max_tokens": 4096,
            "policy": {"retries": {"max_attempts": 1, "backoff_seconds": 0}},
        },
        "<test>",
        None,
        ROOT,
    )
    server = ProviderServer()
    await server.start()
    server.reset([Call(sse=_reasoning_stream(reply), end="stall", stall_seconds=2.5)])
    ledger, reader = await Ledger.open(db), await Ledger.open(db)
    client = make_client(server.url, "test-key", timeout=10)
    loop = asyncio.get_running_loop()
    try:
        room = CollectingRoom("cairn")
        m = room.say("alice", "The whole history, please.")
        resident = Resident(
            res,
            Generator(AttemptRunner(AnthropicProvider(client), ledger)),
            ledger,
            Outbox.of_room(ledger, "cairn", room),
        )
        task = asyncio.create_task(resident.respond(room, "100", list(room.history), trigger=m.id))
        began, blocks = loop.time(), []
        want = [("thinking", REASONING)] + ([("text", reply)] if reply else [])
        while [(b.type, b.content) for b in blocks] != want and loop.time() - began < 1.2:
            await asyncio.sleep(0.05)
            rows = await reader.db.execute_fetchall("SELECT id FROM attempts WHERE outcome='streaming'")
            blocks = await reader.streamed_blocks(rows[0][0]) if rows else []
        assert not task.done()
        assert [(b.type, b.content) for b in blocks] == want, "content that arrived is not on disk yet"
        src = sqlite3.connect(db)  # the file exactly as a kill at this instant would leave it
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        await asyncio.wait_for(task, 10)
    finally:
        await client.close()
        await reader.close()
        await ledger.close()
        await server.stop()

    after = await Ledger.open(copy)
    try:
        rec = await recover(after, {"cairn"})
        (gid,) = rec.interrupted
        g = await after.get_generation(gid)
        assert g is not None and (g.status, g.stop_reason, g.text) == ("incomplete", truth.INTERRUPTED, reply)
        (a,) = g.attempts
        assert [(b.index, b.type, b.content) for b in a.blocks] == [(i, t, c) for i, (t, c) in enumerate(want)]
        if reply:
            assert [(s.scope, s.cause, s.text) for s in g.stumps] == [("output", truth.INTERRUPTED, reply)]
            assert [(p.kind, p.content) for p in g.posts] == [
                ("partial", reply),
                ("receipt", "-# " + truth.INTERRUPTED_SENTENCE),
            ]
        else:  # stopped inside the reasoning: it is the stump, and no reply text exists to post
            assert [(s.scope, s.cause, s.text, s.block_type) for s in g.stumps] == [
                ("block", truth.INTERRUPTED, REASONING, "thinking")
            ]
            assert [(p.kind, p.content) for p in g.posts] == [
                ("notice", "-# Process stopped before this output was finished; no reply text was generated.")
            ]
        assert await verify(after) == []
    finally:
        await after.close()


class FakeRoom:
    """A ResumeRoom over a list: what the channel holds, and what was sent."""

    def __init__(self, held: list[Seen], fail_after: int | None = None) -> None:
        self.held = list(held)
        self.sent: list[Post] = []
        self.fail_after = fail_after

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        ids = [m.id for m in self.held]
        start = ids.index(after_id) + 1 if after_id in ids else 0
        return self.held[start:]

    async def send(self, post: Post) -> str:
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise RoomUnavailable("503 from the room")
        self.sent.append(post)
        mid = f"m{len(self.held) + 1}"
        self.held.append(Seen(mid, post.content))
        return mid


async def planned_generation(
    ledger: Ledger, contents: list[str], delivered: int, channel: str = "100", residence: str = "cairn"
) -> list[Post]:
    g = await pending(ledger, residence=residence, channel=channel)
    await streaming(ledger, g, ["".join(contents)])
    await recover(ledger, {residence})
    got = await ledger.get_generation(g.id)
    assert got is not None
    for i, p in enumerate(got.posts[:delivered]):
        await ledger.mark_delivered(p, f"{g.id}-{i}")
    return got.posts


async def test_resume_adopts_a_post_that_reached_the_room_unrecorded_and_sends_the_rest(ledger: Ledger) -> None:
    posts = await planned_generation(ledger, ["x" * 10], delivered=0)
    assert [p.kind for p in posts] == ["partial", "receipt"]
    # Without nonces in history (Discord's GET omits them), the content identifies the in-flight post.
    room = FakeRoom([Seen("older", "-# " + truth.INTERRUPTED_SENTENCE), Seen("m-flight", posts[0].content)])
    assert await resume_delivery(ledger, "cairn", room) == 2
    assert [p.id for p in room.sent] == [posts[1].id]  # the partial was not sent again
    rows = await ledger.undelivered_posts_of("cairn")
    assert rows == []
    got = await ledger.get_generation(posts[0].generation_id or "")
    assert got is not None and [p.message_id for p in got.posts] == ["m-flight", "m3"]


async def test_resume_never_adopts_a_message_with_another_posts_nonce(ledger: Ledger) -> None:
    posts = await planned_generation(ledger, ["y" * 10], delivered=0)
    room = FakeRoom([Seen("m-other", posts[0].content, nonce="p-somethingelse")])
    await resume_delivery(ledger, "cairn", room)
    assert [p.id for p in room.sent] == [p.id for p in posts]


class StaleLiveRoom(FakeRoom):
    """A FakeRoom that also removes messages, as start-up does to live messages a stop left in progress."""

    def __init__(self, held: list[Seen]) -> None:
        super().__init__(held)
        self.deleted: list[tuple[str, str]] = []

    async def delete(self, channel: str, message_id: str) -> None:
        self.deleted.append((channel, message_id))


async def test_a_live_message_whose_send_was_never_answered_is_found_by_its_nonce_and_withdrawn(
    ledger: Ledger,
) -> None:
    """A stop between a live send and its answer: at the next start the message is found among the bot's
    own by its nonce, removed from the room, and recorded withdrawn under the id the room gave it."""
    from residents.delivery.live import withdraw_left_in_progress
    from residents.ledger import live as live_ledger

    g = await pending(ledger)
    a = await streaming(ledger, g, ["The harbour at dawn"])
    shown = live_ledger.LiveMessage("n-live", None, g.id, a.id, 0, g.channel, g.residence, "The harbour at dawn")
    await live_ledger.add(ledger, shown)
    room = StaleLiveRoom(
        [Seen("m-other", "hello"), Seen("m-live", "The harbour at dawn" + truth.LIVE_MARKER, "n-live")]
    )
    assert await withdraw_left_in_progress(ledger, room, "cairn") == 1
    assert room.deleted == [("100", "m-live")]
    [m] = await live_ledger.of_generation(ledger, g.id)
    assert (m.message_id, m.state) == ("m-live", "withdrawn")


async def test_a_room_error_holds_later_posts_of_that_channel_back_in_order(ledger: Ledger) -> None:
    a = await planned_generation(ledger, ["first"], delivered=0)
    b = await planned_generation(ledger, ["second"], delivered=0)
    c = await planned_generation(ledger, ["elsewhere"], delivered=0, channel="200")
    room = FakeRoom([], fail_after=1)
    await resume_delivery(ledger, "cairn", room)
    assert [p.id for p in room.sent] == [a[0].id]  # a's receipt failed: b waits; channel 200 fails too
    left = [p.id for p in await ledger.undelivered_posts_of("cairn")]
    assert left == [a[1].id] + [p.id for p in b] + [p.id for p in c]
    room.fail_after = None
    await resume_delivery(ledger, "cairn", room)
    assert [p.id for p in room.sent] == [a[0].id, a[1].id] + [p.id for p in b] + [p.id for p in c]
    assert await verify(ledger) == []


# ---------------------------------------------------------------- the real process, killed


class Process:
    """`residents run` as a subprocess, with its output kept for the failure message."""

    def __init__(self, cwd: Path, room_url: str, provider_url: str, db: Path | str, *args: str) -> None:
        self.cwd, self.room_url, self.provider_url, self.db = cwd, room_url, provider_url, db
        self.args = args  # more of `residents run`'s options (`--log-level info`)
        self.proc: asyncio.subprocess.Process | None = None
        self.runs = 0

    @property
    def log(self) -> Path:
        return self.cwd / f"run-{self.runs}.log"

    async def start(self) -> None:
        self.runs += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CAIRN_"))}
        env.update(
            ANTHROPIC_BASE_URL=self.provider_url,
            ANTHROPIC_API_KEY="test-key",
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        out = open(self.log, "wb")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "residents",
                "run",
                "--discord-api",
                self.room_url,
                "--db",
                str(self.db),
                *self.args,
                cwd=self.cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        finally:
            out.close()

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(self.proc.wait(), 10) == -signal.SIGKILL

    async def stop(self) -> int:
        """SIGTERM: the clean way out; returns the exit code."""
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError("residents run did not stop on SIGTERM within 15 s") from None

    def output(self) -> str:
        return "\n".join(
            f"--- run {i} ---\n" + (self.cwd / f"run-{i}.log").read_text(errors="replace")
            for i in range(1, self.runs + 1)
        )

    def tracebacks(self) -> list[str]:
        return [
            line
            for i in range(1, self.runs + 1)
            for line in (self.cwd / f"run-{i}.log").read_text(errors="replace").splitlines()
            if "Traceback" in line or " ERROR " in line or line.startswith("ERROR")
        ]


def write_config(base: Path) -> None:
    (base / "residences").mkdir()
    (base / "policies").mkdir()
    (base / "policies" / "crash.yaml").write_text(
        "retries:\n  max_attempts: 1\n  timeout_seconds: 60\nfloor:\n  cooldown_seconds: 0\n  reply_to: mentions\n"
    )
    (base / "residences" / "cairn.yaml").write_text(
        f"name: cairn\nmodel: {MODEL}\nmax_tokens: 1024\nsystem: You are Cairn.\npolicy: crash\n"
        "discord:\n  token_env: CAIRN_DISCORD_TOKEN\n  channels: [general]\n"
    )


def db_rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def streamed_chars(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        return db_rows(db, "SELECT coalesce(sum(length(text)), 0) FROM attempt_chunks")[0][0]
    except sqlite3.OperationalError:  # not migrated yet
        return 0


@contextlib.asynccontextmanager
async def crash_rig(tmp_path: Path) -> AsyncIterator[tuple[Any, ProviderServer, Process]]:
    write_config(tmp_path)
    provider = ProviderServer()
    await provider.start()
    async with error_guard() as guard, running_room(["general"]) as room:
        # The killed process's sockets vanish mid-request: the room logs that, and it is expected.
        guard.ignore.append(lambda p: "aiohttp" in p and "Error handling request" in p)
        proc = Process(tmp_path, room.url, provider.url, tmp_path / "ledger.db")
        try:
            yield room, provider, proc
            assert await proc.stop() == 0, proc.output()
            assert proc.tracebacks() == [], proc.output()
        finally:
            if proc.proc is not None and proc.proc.returncode is None:
                proc.proc.kill()
                await proc.proc.wait()
            await provider.stop()


async def connected(room: Any, proc: Process, identifies: int, timeout: float = 20.0) -> None:
    """The new process has identified (a killed one's session may still look connected for a moment)."""

    def ready() -> bool:
        if proc.proc is not None and proc.proc.returncode is not None:
            raise AssertionError(f"residents run exited with {proc.proc.returncode}:\n{proc.output()}")
        return room.gateway.identifies > identifies and any(
            b["name"] == "cairn" and b["connected"] for b in room.snapshot()["bots"]
        )

    await until(proc, ready, timeout=timeout)


async def until(proc: Process, check: Any, timeout: float, interval: float = 0.01) -> None:
    try:
        await eventually(check, timeout=timeout, interval=interval)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{proc.output()}") from None


async def restart(room: Any, proc: Process) -> None:
    seen = room.gateway.identifies
    await proc.start()
    await connected(room, proc, seen)


def bot_messages(room: Any) -> list[dict[str, Any]]:
    return [m for m in room.messages("general") if m["author"] == "cairn"]


async def check_ledger(db: Path) -> Ledger:
    led = await Ledger.open(db, read_only=True)  # beside the running process, which holds it for writing
    problems = await verify(led, unsettled_as_violations=True)
    if problems:
        await led.close()
        raise AssertionError("ledger violations:\n" + "\n".join(problems))
    return led


def assert_posts_match_room(gen: Generation, room: Any) -> None:
    """Every post of the generation delivered exactly once, in order, mapped to its room message."""
    by_id = {m["id"]: m for m in room.messages("general")}
    assert all(p.message_id is not None for p in gen.posts)
    ids = [p.message_id for p in gen.posts]
    assert len(set(ids)) == len(ids)
    assert [by_id[i]["content"] for i in ids] == [p.content for p in gen.posts]  # type: ignore[index]
    assert ids == sorted(ids, key=int)  # in order
    contents = [m["content"] for m in bot_messages(room)]
    for p in gen.posts:
        assert contents.count(p.content) == 1, f"posted {contents.count(p.content)} times: {p.content[:60]!r}"


async def test_sigkill_mid_stream_and_mid_delivery_then_restart(tmp_path: Path) -> None:
    async with crash_rig(tmp_path) as (room, provider, proc):
        db = proc.db
        # 1. Mid-stream: 5,000 characters arrive, then the provider goes silent (stall), so the last
        #    piece is never flushed by a later delta: the flush bound is what protects it.
        full = words(5000, "s")
        # (The stall outlasts the kill but ends soon after, so the provider's teardown does not wait.)
        provider.enqueue([Call(sse=sse.stream(full, finish=False, model=MODEL), end="stall", stall_seconds=10)])
        await restart(room, proc)
        room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
        await until(proc, lambda: streamed_chars(db) >= 2 * FLUSH_CHARS, timeout=8, interval=0.02)
        await proc.kill()
        [(gid, status)] = db_rows(db, "SELECT id, status FROM generations")
        assert status == "pending"
        await restart(room, proc)
        await room.wait_for_message(
            lambda m: m["author"] == "cairn" and truth.INTERRUPTED_SENTENCE in m["content"], timeout=10
        )
        led = await check_ledger(db)
        try:
            g = await led.get_generation(gid)
            assert g is not None
            assert (g.status, g.stop_reason) == ("incomplete", truth.INTERRUPTED)
            assert full.startswith(g.text) and len(full) - len(g.text) <= FLUSH_CHARS and len(g.text) >= 2 * FLUSH_CHARS
            [a] = g.attempts
            assert (a.outcome, a.error, a.text) == ("incomplete", truth.INTERRUPTED, g.text)
            assert [(s.scope, s.cause, s.text == g.text, s.published) for s in g.stumps] == [
                ("output", truth.INTERRUPTED, True, True)
            ]
            assert [p.kind for p in g.posts][-1] == "receipt" and {p.kind for p in g.posts[:-1]} == {"partial"}
            assert_posts_match_room(g, room)
            assert len(bot_messages(room)) == len(g.posts)
        finally:
            await led.close()

        # 2. Mid-delivery: a reply of four posts; the second is rate limited for 30 s; kill in the wait.
        text = words(5200, "d")
        provider.enqueue([Call(sse=sse.stream(text, "max_tokens", 1024, model=MODEL))])
        room.fail_message_posts(429, nth=2, retry_after=30)
        before = len(bot_messages(room))
        room.post("general", "alice", "Again, @cairn", mentions=["cairn"])
        await until(proc, lambda: room.faults.hits >= 1, timeout=15)
        await proc.kill()
        assert len(bot_messages(room)) == before + 1  # only the first post got through
        [(gid2,)] = db_rows(db, "SELECT id FROM generations WHERE id != ?", gid)
        undelivered = db_rows(
            db, "SELECT seq FROM posts WHERE generation_id=? AND message_id IS NULL ORDER BY seq", gid2
        )
        assert [s for (s,) in undelivered] == [2, 3, 4]
        await restart(room, proc)
        led = await check_ledger(db)
        try:
            g2 = await led.get_generation(gid2)
            assert g2 is not None and g2.status == "truncated" and g2.text == text
            assert [p.kind for p in g2.posts] == ["partial", "partial", "partial", "receipt"]
            assert_posts_match_room(g2, room)
            assert len(bot_messages(room)) == before + 4
        finally:
            await led.close()


async def test_sigkill_after_the_room_stored_a_post_but_before_the_ledger_did(tmp_path: Path) -> None:
    async with crash_rig(tmp_path) as (room, provider, proc):
        db = proc.db
        text = words(5200, "n")
        provider.enqueue([Call(sse=sse.stream(text, "max_tokens", 1024, model=MODEL))])
        # The second post is stored, then answered 500: discord.py waits 1 s to retry. Kill in that second.
        room.fail_message_posts(500, nth=2, after_create=True)
        await restart(room, proc)
        room.post("general", "alice", "Tell me, @cairn", mentions=["cairn"])
        await until(proc, lambda: room.faults.hits >= 1, timeout=15, interval=0.005)
        await proc.kill()
        assert len(bot_messages(room)) == 2
        [(gid,)] = db_rows(db, "SELECT id FROM generations")
        assert [
            s
            for (s,) in db_rows(
                db, "SELECT seq FROM posts WHERE generation_id=? AND message_id IS NULL ORDER BY seq", gid
            )
        ] == [2, 3, 4]
        # Beyond Discord's few-minute nonce window a resend would be a new message: forget the nonces,
        # so only recovery's own check of the room's history can prevent the duplicate.
        room.state._nonces.clear()
        await restart(room, proc)
        led = await check_ledger(db)
        try:
            g = await led.get_generation(gid)
            assert g is not None
            assert_posts_match_room(g, room)
            assert len(bot_messages(room)) == 4
            assert g.posts[1].message_id == bot_messages(room)[1]["id"]  # adopted, not re-sent
        finally:
            await led.close()
        # And the operator's own check agrees, as a command.
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "residents",
            "ledger",
            "verify",
            "--db",
            str(db),
            "--strict",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(cli.communicate(), 30)
        assert cli.returncode == 0 and out.decode().startswith("ledger ok: 1 generation(s) checked"), out.decode()


# ---------------------------------------------------------------- a stop inside the tool loop (issue 12 A)


async def tool_round(ledger: Ledger, g: Generation, text: str, segment: int = 1) -> Attempt:
    """A round's attempt that ended asking for the `stumps` tool (its text, then a tool_use block)."""
    from residents.records import Block, join_text

    a = await streaming(ledger, g, [], segment)
    a.blocks = [
        Block(0, "text", text),
        Block(1, "tool_use", '{"action": "list"}', start={"id": f"toolu_{segment}", "name": "stumps", "input": {}}),
    ]
    a.text, a.stop_reason, a.outcome, a.output_tokens, a.ended_at = (
        join_text(a.blocks),
        "tool_use",
        "completed",
        30,
        time.time(),
    )
    await ledger.finish_attempt(a)
    return a


async def test_a_stop_while_a_tool_call_runs_is_interrupted_never_a_completed_reply(ledger: Ledger) -> None:
    g = await pending(ledger)
    await tool_round(ledger, g, "Let me look.")
    rec = await recover(ledger)
    assert rec.interrupted == [g.id]
    got = await ledger.get_generation(g.id)
    assert got is not None and (got.status, got.stop_reason, got.text) == (
        "incomplete",
        truth.INTERRUPTED,
        "Let me look.",
    )
    assert [(p.kind, p.content) for p in got.posts] == [
        ("partial", "Let me look."),
        ("receipt", "-# " + truth.INTERRUPTED_SENTENCE),
    ]
    assert sorted((s.scope, s.text) for s in got.stumps) == [
        ("block", '{"action": "list"}'),
        ("output", "Let me look."),
    ]
    assert await verify(ledger) == []


async def test_a_stop_in_a_later_round_keeps_that_rounds_text_as_a_stump(ledger: Ledger) -> None:
    from residents.ledger.access import add_tool_calls
    from residents.records import ToolCall

    g = await pending(ledger)
    first = await tool_round(ledger, g, "Let me look.")
    await add_tool_calls(
        ledger,
        g.id,
        [ToolCall(1, 0, first.id, "toolu_1", "stumps", {"action": "list"}, {"action": "list", "stumps": []}, False)],
    )
    await streaming(ledger, g, ["Nothing set aside here, as it turns ", "out, so the harbour"], segment=2)
    rec = await recover(ledger)
    assert rec.interrupted == [g.id]
    got = await ledger.get_generation(g.id)
    assert got is not None and (got.status, got.text) == ("incomplete", "Let me look.")
    cut = [s for s in got.stumps if s.scope == "attempt"]
    assert [(s.cause, s.text) for s in cut] == [
        (truth.INTERRUPTED, "Nothing set aside here, as it turns out, so the harbour")
    ]
    assert await verify(ledger) == []
