"""Live replies (policy `delivery.live`), end to end: real discord.py bots started by `run_bots`, the local
room over real sockets, the local provider streaming at a known pace behind the real SDK, a real ledger.

The room's event stream is read as it happens, so what a person watching would have seen — when the first
text appeared, every edit and when — is what these tests judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from discordkit import Deployed, deployed
from test_discord_e2e import res

from residents import truth
from residents.delivery.plan import plan, split_text
from residents.ledger import live as live_ledger
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call

MARK = truth.LIVE_MARKER
WORDS = (
    "harbour granary trellis meadow cloister terrace bellwether lantern quay mooring tide gull rope anchor"
).split()


def prose(chars: int, seed: int = 1) -> str:
    """Deterministic paragraphs of sentences, about `chars` long."""
    out, i, para = [], seed, []
    while sum(map(len, out)) + sum(map(len, para)) < chars:
        sentence = " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(9)).capitalize() + "."
        para.append(sentence)
        i += 1
        if len(para) == 5:
            out.append(" ".join(para))
            para = []
    if para:
        out.append(" ".join(para))
    return "\n\n".join(out)


def paced(body: bytes, seconds: float, chunk: int = 1500) -> Call:
    """`body` written in pieces of `chunk` bytes, spread over about `seconds`."""
    n = max(1, len(body) // chunk)
    return Call(sse=body, chunk_bytes=chunk, chunk_delay=seconds / n)


@dataclass
class Watch:
    """The room's events as a person's page receives them, each with the time it arrived."""

    events: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)

    def of(self, kind: str, author: str | None = None) -> list[tuple[float, dict[str, Any]]]:
        return [(t, m) for t, k, m in self.events if k == kind and (author is None or m["author"] == author)]

    def edits(self, message_id: str) -> list[float]:
        return [t for t, k, m in self.events if k == "message_update" and m["id"] == message_id]


@contextlib.asynccontextmanager
async def watching(d: Deployed) -> AsyncIterator[Watch]:
    w = Watch()
    queue = d.room.subscribe_events()

    async def drain() -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            if item["type"].startswith("message_"):
                w.events.append((time.monotonic(), item["type"], item["message"]))

    task = asyncio.create_task(drain())
    try:
        yield w
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        d.room.unsubscribe_events(queue)


async def settled_room(d: Deployed, author: str = "cairn") -> list[tuple[str, str]]:
    """The resident's messages as the room holds them once everything settled: (kind from the ledger, content)."""
    await d.quiet(0.5)
    msgs = [m for m in d.messages() if m["author"] == author]
    posts = await d.ledger.posts_by_message([m["id"] for m in msgs])
    return [(posts[m["id"]].kind if m["id"] in posts else "unrecorded", m["content"]) for m in msgs]


LONG = prose(2600)
LIVE = {"delivery": {"live": True}}


async def test_live_reply_appears_within_a_second_is_edited_at_most_once_a_second_and_settles_as_without_live(
    tmp_path,
) -> None:
    """A cut reply of ~2,600 characters streamed over ~3.5 s: the first text is in the room within a second,
    each message is edited at most once a second and shows the marker until it is closed or settled, the
    first message is closed at the plan's split point when the second starts, and the settled room (contents,
    kinds, receipt) is exactly the room a resident without live delivery leaves for the same stream."""
    body = sse.stream(LONG, "max_tokens", 1024)
    rooms = {}
    for live in (False, True):
        policy = LIVE if live else {}
        async with deployed(tmp_path / str(live), [res(policy=policy)], calls=[paced(body, 3.5)]) as d:
            async with watching(d) as w:
                asked = time.monotonic()
                d.room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
                await d.wait_receipt(timeout=20)
                rooms[live] = await settled_room(d)
            assert await verify(d.ledger) == []
            creates = w.of("message_create", "cairn")
            first = creates[0][0] - asked
            if not live:
                assert first > 3.0, "without live mode nothing is shown before the stream ends"
                assert not w.of("message_update", "cairn")
                continue
            assert first < 1.0, f"first live text after {first:.2f}s"
            assert MARK in creates[0][1]["content"]
            chunks = split_text(LONG, escape=True)
            assert len(chunks) == 2
            ids = [m["id"] for _, m in creates[:2]]
            for mid in ids:
                times = w.edits(mid)
                assert times, "a live message is edited as text arrives"
                gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
                assert all(g >= 0.9 for g in gaps), f"edits of {mid} closer than a second: {gaps}"
            # The first message was closed at the plan's split point before the second appeared.
            second_at = creates[1][0]
            before = [m for t, k, m in w.events if k == "message_update" and m["id"] == ids[0] and t <= second_at]
            assert before and before[-1]["content"] == chunks[0]
            assert all(MARK not in c for _, c in rooms[live])
            lives = await live_ledger.of_generation(d.ledger, (await d.generations())[0].id)
            assert [m.state for m in lives] == ["adopted", "adopted"]
            assert all(MARK not in m.content for m in lives)
    assert rooms[True] == rooms[False]
    expected = plan(truth.Ending("truncated", "max_tokens", 1024, len(LONG)), LONG)
    assert rooms[True] == [(p.kind, p.content) for p in expected]


async def test_an_attempt_failing_after_its_text_was_shown_is_a_published_stump_with_one_notice(tmp_path) -> None:
    """The first attempt streams ~1 s of text (shown live), then the provider fails it; the retry answers.
    The shown text stays as it was shown (marker gone), its stump is marked published, the room gets one
    notice saying an attempt was set aside after N characters, and the replacement is new messages."""
    fragment = prose(300, seed=3)
    first = sse.head("claude-3-opus-20240229") + b"".join(sse.delta(p) for p in sse.pieces(fragment)) + sse.error()
    reply = "The harbour is quiet this morning."
    async with deployed(
        # The retry streams over ~0.5 s too: shown live before it ends, however the ledger orders its commits.
        tmp_path,
        [res(policy=LIVE)],
        calls=[paced(first, 1.5, chunk=400), paced(sse.stream(reply), 0.5, chunk=150)],
    ) as d:
        async with watching(d) as w:
            d.room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
            await d.room.wait_for_message(lambda m: m["author"] == "cairn" and m["content"] == reply, timeout=20)
            room = await settled_room(d)
        notice = "-# " + truth.live_set_aside_notice(len(fragment))
        assert [c for _, c in room] == [fragment, notice, reply]
        assert [k for k, _ in room][1:] == ["notice", "speech"]
        assert w.of("message_update", "cairn"), "the first attempt's text was shown live"
        assert all(MARK not in c for _, c in room)
        [g] = await d.generations()
        [stump] = [s for s in g.stumps if s.cause == truth.RETRY_ABANDONED]
        assert stump.text == fragment and stump.published
        lives = await live_ledger.of_generation(d.ledger, g.id)
        assert [(m.state, m.content) for m in lives] == [("set-aside", fragment), ("adopted", reply)]
        assert await verify(d.ledger) == []


async def test_another_resident_reacts_only_to_the_settled_live_reply(tmp_path) -> None:
    """Sill answers every message (`reply_to: all`); Cairn's live reply is in the room for seconds before it
    settles. Sill makes no provider call while it is in progress, and answers it once it has settled."""
    slow = sse.stream(prose(600, seed=5), "end_turn", 150)

    def responder(body: dict) -> Call:
        if "You are Cairn" in body.get("system", ""):
            return paced(slow, 3.0, chunk=500)
        return Call(sse=sse.stream("Sill says a short thing.", "end_turn", 7))

    sill = res("sill", policy={"floor": {"reply_to": "all", "cooldown_seconds": 0, "max_resident_run": 10}})
    async with deployed(tmp_path, [res(policy=LIVE), sill], responder=responder) as d:
        async with watching(d) as w:
            d.room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
            # Sill answers the person at once; Cairn's reply is shown live meanwhile.
            await d.room.wait_for_message(lambda m: m["author"] == "sill", timeout=10)
            await d.room.wait_for_message(lambda m: m["author"] == "cairn", timeout=10)
            asked = d.provider.arrived
            await asyncio.sleep(1.5)
            assert any(MARK in m["content"] for m in d.messages() if m["author"] == "cairn"), "still in progress"
            assert d.provider.arrived == asked == 2, "sill called the provider for cairn's reply in progress"
            await d.wait_bot_messages(3, timeout=15)
            await d.quiet(0.5)
        cairn = [m for m in d.messages() if m["author"] == "cairn"]
        assert len(cairn) == 1 and MARK not in cairn[0]["content"]
        settled_at = max(t for t, k, m in w.events if m["id"] == cairn[0]["id"])
        answers = [(t, m) for t, m in w.of("message_create", "sill")]
        assert len(answers) == 2 and answers[1][0] > settled_at, "sill answered cairn's reply once it settled"
        assert d.provider.arrived == 3
        assert await verify(d.ledger) == []


async def test_a_live_reply_cut_by_sigkill_is_withdrawn_and_posted_as_recovered(tmp_path) -> None:
    """`residents run` killed while a live reply is in progress: at the next start the live message is removed
    (the ledger keeps what it showed, `withdrawn`) and the recovered partial and receipt are posted as they
    would be without live mode; nothing with the in-progress marker is left in the room."""
    from test_crash import MODEL, assert_posts_match_room, bot_messages, check_ledger, crash_rig, restart, until, words

    async with crash_rig(tmp_path) as (room, provider, proc):
        (tmp_path / "policies" / "crash.yaml").write_text(
            "retries:\n  max_attempts: 1\n  timeout_seconds: 60\n"
            "floor:\n  cooldown_seconds: 0\n  reply_to: mentions\ndelivery:\n  live: true\n"
        )
        full = words(3000, "k")
        provider.enqueue([Call(sse=sse.stream(full, finish=False, model=MODEL), end="stall", stall_seconds=10)])
        await restart(room, proc)
        room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
        await until(
            proc,
            lambda: len(bot_messages(room)) >= 2 and any(MARK in m["content"] for m in bot_messages(room)),
            timeout=10,
        )
        await proc.kill()
        shown = [m["id"] for m in bot_messages(room)]
        await restart(room, proc)
        await room.wait_for_message(
            lambda m: m["author"] == "cairn" and truth.INTERRUPTED_SENTENCE in m["content"], timeout=10
        )
        assert not any(MARK in m["content"] for m in bot_messages(room))
        assert not set(shown) & {m["id"] for m in bot_messages(room)}
        led = await check_ledger(proc.db)
        try:
            [row] = await led.list_generations("cairn")
            g = await led.get_generation(row["id"])
            assert g is not None and g.status == "incomplete"
            assert_posts_match_room(g, room)
            assert len(bot_messages(room)) == len(g.posts)
            lives = await live_ledger.of_generation(led, g.id)
            assert [m.message_id for m in lives] == shown and {m.state for m in lives} == {"withdrawn"}
            assert all(g.text.startswith(m.content) or m.content in g.text for m in lives)
        finally:
            await led.close()


async def test_a_live_message_whose_id_the_full_ledger_refused_is_still_settled(tmp_path, monkeypatch) -> None:
    """The room took a live message, then the ledger refused to record its id (the disk filled): the id is
    written once the disk takes it, so the settled reply adopts that message like any other and nothing is
    left in the room in progress (before, the message was never adopted nor withdrawn)."""
    from residents.ledger import LedgerWriteError

    real, refused = live_ledger.sent, []

    async def sent_once_refused(ledger: Any, nonce: str, message_id: str) -> None:
        if not refused:
            refused.append(message_id)
            raise LedgerWriteError("database or disk is full")
        await real(ledger, nonce, message_id)

    monkeypatch.setattr(live_ledger, "sent", sent_once_refused)
    body = sse.stream(LONG, "max_tokens", 1024)
    async with deployed(tmp_path, [res(policy=LIVE)], calls=[paced(body, 3.5)]) as d:
        d.room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
        await d.wait_receipt(timeout=20)
        room = await settled_room(d)
        assert refused and await verify(d.ledger) == []
    expected = plan(truth.Ending("truncated", "max_tokens", 1024, len(LONG)), LONG)
    assert room == [(p.kind, p.content) for p in expected]
    assert refused[0] in [m["id"] for m in d.messages()]  # the refused id's message is one of the reply's
