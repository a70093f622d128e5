"""The Continue button on a cut output's receipt, pressed through the local room: real discord.py bots started
by `run_bots` (as `residents run` does), the local room over real sockets, the local provider behind the
real SDK, a real SQLite ledger. Swallowed errors in discord.py's background tasks fail the test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from conftest import residence, specimen
from discordkit import Deployed, deployed, opts
from roomkit import running_room
from test_crash import Process, connected

from residents import truth
from residents.generation.run import continuations_left
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.records import Generation, Segment, Status

BOUNDS = {"max_segments": 2, "max_output_tokens": 12288, "min_progress_chars": 16, "similarity_abort": 0.92}
SECOND = (
    "Beyond the breakwater the channel bends twice, and pilots count the buoys aloud: "
    "red to port, green to starboard, the bell buoy last of all before the open sea."
)
THIRD = " And at dusk the harbour master lights the lamp on the mole, and the day's work ends here."


def cairn(button: str | None = None, standing: str = "on-request"):
    continuation: dict[str, Any] = {"standing": standing, **BOUNDS}
    if button is not None:
        continuation["button"] = button
    return residence(
        name="cairn",
        max_tokens=600,
        policy={
            "retries": {"max_attempts": 3, "backoff_seconds": 0},
            "floor": {"cooldown_seconds": 0},
            "continuation": continuation,
        },
        discord={"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general"]},
    )


def buttons_of(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, custom_id) of every button on a room message."""
    return [(b["label"], b["custom_id"]) for row in message["components"] for b in row["components"]]


def receipts(d: Deployed) -> list[dict[str, Any]]:
    return [m for m in d.bot_messages() if m["content"].startswith("-# ")]


async def cut_reply(d: Deployed, author: str = "alice") -> dict[str, Any]:
    """`author` asks; the reply is cut at the ceiling; its receipt, once the room is quiet."""
    d.room.post("general", author, "write it all, @cairn", mentions=["cairn"])
    await d.wait_receipt()
    await d.quiet(0.1)
    return receipts(d)[-1]


async def press(d: Deployed, member: str, message: dict[str, Any]) -> dict[str, Any]:
    [(_label, custom_id)] = buttons_of(message)
    out = await d.room.press_button("general", member, message["id"], custom_id, timeout=10.0, settle=0.1)
    assert not out["timed_out"], out
    return out


def answers(out: dict[str, Any]) -> list[tuple[bool, str]]:
    """What the presser saw: (ephemeral, text) of the last answer."""
    last = out["responses"][-1]
    return [(last["ephemeral"], last["content"])]


async def test_a_member_who_may_not_press_is_told_who_may_and_nothing_else_happens(tmp_path):
    calls = [Call(sse=specimen("cont-first.sse")), Call(sse=sse.stream(SECOND, "end_turn", 40))]
    async with deployed(tmp_path, [cairn()], calls=calls) as d:
        receipt = await cut_reply(d)
        [g] = await d.generations()
        assert buttons_of(receipt) == [("Continue (2 left)", f"residents:continue:{g.id}:1")]
        room_before = d.room.messages()

        out = await press(d, "bob", receipt)  # bob has no moderator role; the policy's button is for moderators
        assert answers(out) == [(True, truth.press_refused("moderators", "cairn"))]
        assert [r["type"] for r in out["responses"]] == [4]
        await d.quiet(0.1)
        assert d.room.messages() == room_before and len(d.provider.requests) == 1
        [g] = await d.generations()
        assert len(g.segments) == 1


async def test_a_moderator_presses_until_nothing_is_left_and_the_button_goes(tmp_path):
    calls = [
        Call(sse=specimen("cont-first.sse")),
        Call(sse=sse.stream(SECOND, "max_tokens", 600)),
        Call(sse=sse.stream(THIRD, "max_tokens", 600)),
    ]
    async with deployed(tmp_path, [cairn()], calls=calls) as d:
        first = await cut_reply(d)
        [g] = await d.generations()
        d.room.state.person("moddy", moderator=True)

        out = await press(d, "moddy", first)
        assert out["responses"][0]["type"] == 5 and all(r["ephemeral"] for r in out["responses"])
        assert answers(out) == [(True, f"Continued {g.id}: now truncated, 2 segment(s), continuation disabled.")]
        await d.quiet(0.1)
        second = receipts(d)[-1]
        assert second["id"] != first["id"]
        by_id = {m["id"]: m for m in d.bot_messages()}
        assert by_id[first["id"]]["components"] == []  # the pressed receipt's button is gone...
        assert by_id[first["id"]]["edited_timestamp"] is None  # ...and its words untouched
        assert buttons_of(second) == [("Continue (1 left)", f"residents:continue:{g.id}:2")]

        out = await press(d, "moddy", second)
        assert answers(out) == [(True, f"Continued {g.id}: now truncated, 3 segment(s), continuation segment-limit.")]
        await d.quiet(0.1)
        third = receipts(d)[-1]
        assert third["id"] != second["id"]
        assert [m["components"] for m in receipts(d)] == [[], [], []]  # nothing is left: no button anywhere
        [g] = await d.generations()
        assert (len(g.segments), len(d.provider.requests)) == (3, 3)
        spoken = "".join(m["content"] for m in d.bot_messages() if not m["content"].startswith("-# "))
        assert SECOND[:40] in spoken and THIRD.strip()[:40] in spoken
        assert await verify(d.ledger, unsettled_as_violations=True) == []


async def test_under_asker_the_person_the_reply_answered_may_press_and_another_may_not(tmp_path):
    calls = [Call(sse=specimen("cont-first.sse")), Call(sse=sse.stream(SECOND, "end_turn", 40))]
    async with deployed(tmp_path, [cairn(button="asker")], calls=calls) as d:
        receipt = await cut_reply(d, author="alice")
        [g] = await d.generations()
        out = await press(d, "bob", receipt)
        assert answers(out) == [(True, truth.press_refused("asker", "cairn"))]
        assert "person this reply answered" in answers(out)[0][1] and "you" not in answers(out)[0][1].lower()
        await d.quiet(0.1)
        assert len(d.provider.requests) == 1

        out = await press(d, "alice", receipt)
        assert answers(out) == [(True, f"Continued {g.id}: now completed, 2 segment(s), continuation completed.")]
        await d.quiet(0.1)
        assert receipts(d)[-1]["content"].startswith("-# Output assembled from 2 segments")
        assert [m["components"] for m in receipts(d)] == [[], []]


async def test_under_anyone_a_member_without_roles_may_press(tmp_path):
    calls = [Call(sse=specimen("cont-first.sse")), Call(sse=sse.stream(SECOND, "end_turn", 40))]
    async with deployed(tmp_path, [cairn(button="anyone")], calls=calls) as d:
        receipt = await cut_reply(d, author="alice")
        [g] = await d.generations()
        out = await press(d, "bob", receipt)
        assert answers(out) == [(True, f"Continued {g.id}: now completed, 2 segment(s), continuation completed.")]
        assert len(d.provider.requests) == 2


async def test_two_presses_at_once_make_one_continuation(tmp_path):
    """A double-click (or two moderators at once): the second press finds the output already continued
    from that receipt, is told so alone, and nothing reaches the room or the provider for it."""
    calls = [
        Call(sse=specimen("cont-first.sse")),
        Call(sse=sse.stream(SECOND, "max_tokens", 600)),
        Call(sse=sse.stream(THIRD, "end_turn", 20)),
    ]
    async with deployed(tmp_path, [cairn()], calls=calls) as d:
        receipt = await cut_reply(d)
        [g] = await d.generations()
        for name in ("moddy", "mona"):
            d.room.state.person(name, moderator=True)
        n = len(d.bot_messages())
        one, two = await asyncio.gather(press(d, "moddy", receipt), press(d, "mona", receipt))
        said = sorted([answers(one)[0][1], answers(two)[0][1]])
        assert said == [
            f"Continued {g.id}: now truncated, 2 segment(s), continuation disabled.",
            truth.not_continued(truth.Declined("already-continued", "cairn", g.id, "2")),
        ], said
        await d.quiet(0.2)
        [g] = await d.generations()
        assert (len(g.segments), len(d.provider.requests)) == (2, 2)
        added = d.bot_messages()[n:]
        assert not any(m["content"].startswith("-# Continuation not available") for m in added)  # no room notice
        assert [m["id"] for m in d.bot_messages()] == [p.message_id for p in sorted(g.posts, key=lambda p: p.seq)]
        assert buttons_of(receipts(d)[-1]) == [("Continue (1 left)", f"residents:continue:{g.id}:2")]
        assert receipts(d)[0]["components"] == []


async def test_a_slash_continue_takes_the_button_off_the_receipt_it_continued(tmp_path):
    calls = [Call(sse=specimen("cont-first.sse")), Call(sse=sse.stream(SECOND, "max_tokens", 600))]
    async with deployed(tmp_path, [cairn()], calls=calls) as d:
        first = await cut_reply(d)
        [g] = await d.generations()
        out = await d.command("moddy", "continue", opts(generation=g.id))
        assert out["responses"][-1]["content"].startswith(f"Continued {g.id}")
        await d.quiet(0.1)
        first_now, second = receipts(d)
        assert first_now["id"] == first["id"] and first_now["components"] == []
        assert buttons_of(second) == [("Continue (1 left)", f"residents:continue:{g.id}:2")]


async def test_no_button_where_the_policy_does_not_continue_on_request(tmp_path):
    async with deployed(tmp_path, [cairn(standing="none")], calls=[Call(sse=specimen("cont-first.sse"))]) as d:
        receipt = await cut_reply(d)
        assert receipt["components"] == []


def test_continuations_left_counts_what_the_bounds_leave_as_continue_on_request_stops():
    """The button's "n left": segments under `max_segments`, none once `max_output_tokens` is spent, none
    unless the standing is on-request and the output is cut at the ceiling."""
    res = cairn()  # max_segments 2, max_output_tokens 12288

    def cut(*tokens: int | None) -> Generation:
        g = Generation("g-1", "cairn", "1", "m", Status.TRUNCATED, "max_tokens", request={"max_tokens": 600})
        g.segments = [Segment(i + 1, f"a{i}", "max_tokens", 10, t) for i, t in enumerate(tokens)]
        return g

    assert [continuations_left(cut(*[600] * n), res) for n in (1, 2, 3)] == [2, 1, 0]
    assert continuations_left(cut(12000, 288), res) == 0  # the token bound is spent
    assert continuations_left(cut(None), res) == 2  # a count the provider did not give counts as max_tokens
    assert continuations_left(cut(600), cairn(standing="none")) == 0
    assert continuations_left(cut(600), cairn(standing="bounded")) == 0
    done = cut(600)
    done.status, done.stop_reason = Status.COMPLETED, "end_turn"
    assert continuations_left(done, res) == 0
    window = cut(600)
    window.stop_reason = "model_context_window_exceeded"
    assert continuations_left(window, res) == 0


async def test_the_button_works_after_the_process_is_killed_and_started_again(tmp_path: Path) -> None:
    """`residents run` as a real process: a receipt's button, sent by the first process, pressed after a
    SIGKILL and a new start (nothing of the first process's memory is left; the custom_id is all)."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "residences").mkdir()
    (tmp_path / "policies" / "ask.yaml").write_text(
        "retries:\n  max_attempts: 1\nfloor:\n  cooldown_seconds: 0\ncontinuation:\n  standing: on-request\n"
        "  max_segments: 2\n  max_output_tokens: 12288\n  min_progress_chars: 16\n  similarity_abort: 0.92\n"
    )
    (tmp_path / "residences" / "cairn.yaml").write_text(
        "name: cairn\nmodel: claude-3-opus-20240229\nmax_tokens: 600\nsystem: You are Cairn.\npolicy: ask\n"
        "discord:\n  token_env: CAIRN_DISCORD_TOKEN\n  channels: [general]\n"
    )
    provider = ProviderServer()
    await provider.start()
    provider.enqueue([Call(sse=specimen("cont-first.sse")), Call(sse=sse.stream(SECOND, "end_turn", 40))])
    try:
        async with running_room(["general"]) as room:
            proc = Process(tmp_path, room.url, provider.url, tmp_path / "ledger.db")
            try:
                await proc.start()
                await connected(room, proc, 0)
                room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])

                def offered() -> dict[str, Any] | None:
                    return next((m for m in room.messages() if m["bot"] and m["components"]), None)

                receipt = await room.wait_until(offered, timeout=20)
                [(label, custom_id)] = buttons_of(receipt)
                assert label == "Continue (2 left)"
                await proc.kill()
                identifies = room.gateway.identifies
                await proc.start()
                await connected(room, proc, identifies)
                room.state.person("moddy", moderator=True)
                out = await room.press_button("general", "moddy", receipt["id"], custom_id, timeout=20.0, settle=0.1)
                assert not out["timed_out"], proc.output()
                assert out["responses"][-1]["content"].startswith("Continued g-"), out
                assert out["responses"][-1]["content"].endswith("now completed, 2 segment(s), continuation completed.")
                await room.wait_for_message(
                    lambda m: m["content"].startswith("-# Output assembled from 2 segments"), timeout=20
                )
                assert all(m["components"] == [] for m in room.messages() if m["bot"])
                assert len(provider.requests) == 2
                assert await proc.stop() == 0, proc.output()
                assert proc.tracebacks() == [], proc.output()
            finally:
                if proc.proc is not None and proc.proc.returncode is None:
                    proc.proc.kill()
                    await proc.proc.wait()
    finally:
        await provider.stop()
