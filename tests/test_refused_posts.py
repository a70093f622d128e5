"""Discord refuses a post (400, 403, 404): set aside after a few tries, and the channel goes on.

`residents run`'s own bots (real discord.py, the local room over sockets, the real SDK and ledger),
the room answering a bot's message POSTs with the status asked for. A refused post is recorded with
the refusal as Discord gave it and shown by `/generation show` and `ledger show`; `ledger verify`
holds; a 429 or a 5xx is retried however often it comes; a /continue while the channel's outbox is
held by the room is answered within seconds, its posts delivered in order once the room takes them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import residence, specimen
from discordkit import Deployed, deployed, opts, sub

from residents.cli import main as cli_main
from residents.delivery.outbox import Backoff
from residents.discord.buttons import CONTINUE_DELIVERY_WAIT
from residents.localservers import sse
from residents.localservers.provider import Call

MODEL = "claude-3-opus-20240229"
FAST = Backoff(base=0.2, cap=0.5)  # production: 1 s doubling to 10 s
SET_ASIDE = "set aside undelivered"
REFUSALS = {
    400: "400 Bad Request (error code: 50035): Invalid Form Body",
    403: "403 Forbidden (error code: 50013): Missing Permissions",
    404: "404 Not Found (error code: 10003): Unknown Channel",
}


@pytest.fixture
def expected_errors() -> list[str]:
    """The one ERROR a set-aside post logs (any other still fails a test)."""
    return [SET_ASIDE]


def words(n_chars: int, tag: str) -> str:
    return " ".join(f"{tag}{i:05d}" for i in range(n_chars // 7))[:n_chars]


def cairn(max_tokens: int = 1024, **policy: Any) -> Any:
    return residence(
        name="cairn",
        model=MODEL,
        max_tokens=max_tokens,
        system="You are Cairn, a resident of this room.",
        discord={"token_env": "CAIRN_TOKEN", "channels": ["general"]},
        policy={
            "floor": {"cooldown_seconds": 0, "reply_to": "mentions", "max_resident_run": 10},
            "retries": {"max_attempts": 2, "backoff_seconds": 0},
            **policy,
        },
    )


async def cut_reply(d: Deployed, tag: str) -> Any:
    """Ask cairn for a reply cut at the ceiling (three partials and a receipt); its generation once settled."""
    before = {g.id for g in await d.generations()}
    d.provider.enqueue([Call(sse=sse.stream(words(5200, tag), "max_tokens", 1024, model=MODEL))])
    d.room.post("general", "alice", f"Describe the harbour ({tag}), @cairn", mentions=["cairn"])
    await d.room.wait_for_message(lambda m: m["author"] == "cairn" and "Output ceiling" in m["content"], timeout=20)
    [g] = [g for g in await d.generations() if g.id not in before]
    return g


async def settled_posts(d: Deployed, gid: str, timeout: float = 15.0) -> list[Any]:
    """The generation's posts once each is delivered or set aside."""
    deadline = time.monotonic() + timeout
    while True:
        g = await d.ledger.get_generation(gid)
        assert g is not None
        if all(p.message_id or p.refused for p in g.posts) or time.monotonic() > deadline:
            return g.posts
        await asyncio.sleep(0.05)


def cli(capsys: Any, *args: str) -> tuple[int, str]:
    code = cli_main(list(args))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("status", [403, 404, 400])
async def test_a_post_refused_three_times_is_set_aside_and_the_channel_goes_on(
    tmp_path: Path, status: int, caplog: Any, capsys: Any
) -> None:
    async with deployed(tmp_path, [cairn()], expected_errors=[SET_ASIDE], backoff=FAST) as d:
        d.room.fail_message_posts(status, nth=2, times=3)
        g = await cut_reply(d, "r")
        posts = await settled_posts(d, g.id)
        assert d.room.faults.hits == 3
        refused = posts[1]
        assert (refused.kind, refused.message_id, refused.refused) == ("partial", None, REFUSALS[status])
        # the rest of that reply went out, in order, once each; the refused part is not in the room
        in_room = d.bot_messages()
        assert [m["content"] for m in in_room] == [p.content for p in posts if p is not refused]
        assert [m["id"] for m in in_room] == [p.message_id for p in posts if p is not refused]
        # the next post in the channel is delivered
        d.provider.enqueue([Call(sse=sse.stream("Calm water.", "end_turn", 4, model=MODEL))])
        d.room.post("general", "bob", "And now, @cairn?", mentions=["cairn"])
        await d.room.wait_for_message(lambda m: m["content"] == "Calm water.", timeout=10)
        # one ERROR line names it
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and refused.id in errors[0] and REFUSALS[status] in errors[0]
        # /generation show says which part was refused, and why
        out = await d.command("moddy", "generation", sub("show", ref=g.id))
        shown = "\n".join(r["content"] for r in out["responses"])
        assert "2. partial" in shown and "refused by the room" in shown and REFUSALS[status] in shown
        assert await d.ledger.undelivered_posts_of("cairn") == []
    # `ledger show` and `ledger verify`, as an operator runs them afterwards
    db = str(tmp_path / "ledger.db")
    code, shown = await asyncio.to_thread(cli, capsys, "ledger", "show", g.id, "--db", db)
    assert code == 0 and "refused by the room" in shown and REFUSALS[status] in shown
    code, verified = await asyncio.to_thread(cli, capsys, "ledger", "verify", "--db", db)
    assert code == 0, verified


@pytest.mark.parametrize("status", [503, 429])
async def test_a_room_that_fails_more_than_three_times_is_not_a_refusal(tmp_path: Path, status: int) -> None:
    """A 5xx or a 429, however often it comes, holds the post for the room: it is never set aside."""
    async with deployed(tmp_path, [cairn()], backoff=FAST) as d:
        d.room.fail_message_posts(status, nth=2, times=5, retry_after=0.05)
        g = await cut_reply(d, "f")
        posts = await settled_posts(d, g.id)
        assert d.room.faults.hits == 5
        assert all(p.message_id and p.refused is None for p in posts)
        assert [m["id"] for m in d.bot_messages()] == [p.message_id for p in posts]


async def test_a_continue_behind_a_held_outbox_is_answered_within_seconds(tmp_path: Path) -> None:
    """The room fails every post in the channel (503s); a /continue asked meanwhile is answered at once and
    within `CONTINUE_DELIVERY_WAIT` after its continuation is made, saying its posts wait; they go out in
    order once the room takes posts again."""
    policy = {
        "continuation": {
            "standing": "on-request",
            "max_segments": 2,
            "max_output_tokens": 12288,
            "min_progress_chars": 16,
            "similarity_abort": 0.92,
        }
    }
    calls = [Call(sse=specimen("cont-first.sse"))]
    async with deployed(tmp_path, [cairn(600, **policy)], calls=calls, backoff=FAST) as d:
        d.room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        [first] = await d.generations()
        await settled_posts(d, first.id)
        # the room stops taking posts; a turn's reply is held in the outbox
        d.room.fail_message_posts(503, times=10_000)
        d.provider.enqueue([Call(sse=sse.stream("Held reply.", "end_turn", 3, model=MODEL))])
        d.room.post("general", "bob", "Still there, @cairn?", mentions=["cairn"])
        await asyncio.wait_for(_until(lambda: d.room.faults.hits >= 2), 10)
        d.provider.enqueue([Call(sse=specimen("cont-rest-with-overlap.sse"))])  # what the /continue is given
        started = time.monotonic()
        out = await d.command("moddy", "continue", opts(generation=first.id))
        took = time.monotonic() - started
        assert out["responses"][0]["type"] == 5  # deferred at once
        answer = out["responses"][-1]["content"]
        assert answer.startswith(f"Continued {first.id}: now completed") and "wait for the room" in answer, answer
        assert took < CONTINUE_DELIVERY_WAIT + 5, took
        assert not any(m["content"] == "Held reply." for m in d.bot_messages())
        # the room takes posts again: the held reply, then the continuation, in order
        d.room.faults.clear()
        await d.room.wait_for_message(lambda m: m["content"].startswith("-# Output assembled"), timeout=15)
        [_, held] = sorted(await d.generations(), key=lambda g: g.created_at)
        [cont] = [g for g in await d.generations() if g.id == first.id]
        later = [p for p in cont.posts if p.seq > len(first.posts)]
        order = [m["id"] for m in d.bot_messages()][-(len(held.posts) + len(later)) :]
        assert order == [p.message_id for p in held.posts] + [p.message_id for p in later]


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.02)
