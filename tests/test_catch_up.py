"""Mentions missed across a new gateway session are answered once, oldest first, within `catch_up.window`.

Real parts: `run_bots` (as `residents run` runs them) or the `residents run` command itself, discord.py
against the local room over real sockets, the anthropic SDK against the local provider, a real ledger.
The room ends the bots' sessions (its RESUME answered INVALID_SESSION) and holds them out while people
post; a restart is the real process killed and started again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import discord
import pytest
from conftest import residence
from discordkit import Deployed, deployed
from roomkit import eventually, running_bot, running_room
from test_crash import Process, connected, db_rows

from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer

MODEL = "claude-3-opus-20240229"


def answer_last_ask(body: dict[str, Any]) -> Call:
    """Replies `<Name> answers ask-N`, N from the newest `ask-N` the request holds: which message a turn read up to."""
    who = re.search(r"You are (\w+)", body.get("system", ""))
    asks = re.findall(r"ask-(\d+)", json.dumps(body["messages"]))
    text = f"{who.group(1) if who else '?'} answers {'ask-' + asks[-1] if asks else 'nothing'}"
    return Call(sse=sse.stream(text, "end_turn", 5, model=MODEL))


def res(name: str = "cairn", window: str = "10m") -> Any:
    return residence(
        name=name,
        system=f"You are {name.capitalize()}, a resident of this room.",
        discord={"token_env": f"{name.upper()}_DISCORD_TOKEN", "channels": ["general"]},
        policy={
            "retries": {"max_attempts": 2, "backoff_seconds": 0},
            "floor": {"cooldown_seconds": 0, "reply_to": "mentions"},
            "catch_up": {"window": window},
        },
    )


def replies(d: Deployed, author: str = "cairn") -> list[str]:
    return [m["content"] for m in d.room.messages("general") if m["author"] == author]


async def settle(d: Deployed) -> None:
    await d.quiet(0.5)


async def seen_once(d: Deployed, content: str, bot: str = "cairn") -> dict[str, Any]:
    """A person's message, posted live and seen by `bot` (the resident has been in the channel)."""
    msg = d.room.post("general", "alice", content)
    await d.wait_seen(bot, msg["id"])
    return msg


async def away(d: Deployed) -> int:
    """End every bot's session and hold them out; returns the identifies so far."""
    identifies = d.room.gateway.identifies
    await d.room.invalidate_sessions(hold=True)
    await eventually(lambda: not any(b["connected"] for b in d.room.snapshot()["bots"]), timeout=5)
    return identifies


async def back(d: Deployed, identifies: int) -> None:
    """Let the bots in again: each must IDENTIFY (its RESUME is refused), a new session."""
    resumes = d.room.gateway.resumes
    d.room.release_gateway()
    await eventually(lambda: d.room.gateway.identifies >= identifies + len(d.bots), timeout=15)
    assert d.room.gateway.resumes == resumes  # nothing was resumed: the events in between are gone


async def test_a_mention_made_while_the_session_was_invalidated_is_answered_once_after_the_new_session(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="residents")
    async with deployed(tmp_path, [res("cairn"), res("sill")], responder=answer_last_ask) as d:
        await seen_once(d, "morning all")
        await d.wait_seen("sill", d.room.messages("general")[-1]["id"])
        identifies = await away(d)
        ask = d.room.post("general", "alice", "ask-1 what is the tide doing, @cairn?", mentions=["cairn"])
        other = d.room.post("general", "bob", "ask-2 and the wind, @sill?", mentions=["sill"])
        await asyncio.sleep(0.3)
        assert int(ask["id"]) not in d.seen["cairn"]  # never delivered to the bot: only history has it
        await back(d, identifies)
        await d.wait_bot_messages(2, timeout=15)
        await settle(d)
        # Each answers its own mention, once; a mention of the other resident is not its to answer.
        assert replies(d, "cairn") == ["Cairn answers ask-1"]
        assert replies(d, "sill") == ["Sill answers ask-2"]
        [g] = await d.generations("cairn")
        assert g.trigger == ask["id"] and g.seen_upto == ask["id"]
        [s] = await d.generations("sill")
        assert s.trigger == other["id"]
        # Another new session (asked of the room over HTTP, as a person at its page would) finds nothing left.
        identifies = d.room.gateway.identifies
        async with aiohttp.ClientSession() as http:
            body = {"invalidate_sessions": True, "hold": True}
            async with http.post(f"{d.room.url}/_room/faults", json=body) as resp:
                assert resp.status == 200
        assert not d.room.gateway.sessions  # ended: a RESUME has nothing to resume
        await eventually(lambda: not any(b["connected"] for b in d.room.snapshot()["bots"]), timeout=5)
        await back(d, identifies)
        await settle(d)
        assert replies(d, "cairn") == ["Cairn answers ask-1"] and replies(d, "sill") == ["Sill answers ask-2"]
    lines = [r.getMessage() for r in caplog.records if "caught up in #general" in r.getMessage()]
    assert any(
        line.startswith("cairn caught up in #general") and "answered 1, older than the window 0" in line
        for line in lines
    ), lines
    assert any(
        line.startswith("cairn caught up in #general") and "answered 0, older than the window 0" in line
        for line in lines
    ), lines


async def test_a_burst_of_three_missed_mentions_gets_three_replies_in_order(tmp_path: Path) -> None:
    async with deployed(tmp_path, [res()], responder=answer_last_ask) as d:
        await seen_once(d, "morning all")
        identifies = await away(d)
        asks = [d.room.post("general", "alice", f"ask-{i} question {i}, @cairn", mentions=["cairn"]) for i in (1, 2, 3)]
        await back(d, identifies)
        await d.wait_bot_messages(3, timeout=20)
        await settle(d)
        # Oldest first, each turn reading the channel up to its own mention.
        assert replies(d) == ["Cairn answers ask-1", "Cairn answers ask-2", "Cairn answers ask-3"]
        gens = await d.generations()
        assert [g.trigger for g in gens] == [a["id"] for a in asks]
        assert [g.seen_upto for g in gens] == [a["id"] for a in asks]


async def test_a_mention_older_than_the_window_is_logged_not_answered_and_one_answered_before_is_not_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="residents")
    async with deployed(tmp_path, [res(window="8s")], responder=answer_last_ask) as d:
        first = d.room.post("general", "alice", "ask-0 a first one, @cairn", mentions=["cairn"])
        await d.room.wait_for_message(lambda m: m["content"] == "Cairn answers ask-0", timeout=10)
        await settle(d)
        identifies = await away(d)
        old = d.room.post("general", "alice", "ask-1 asked long ago, @cairn", mentions=["cairn"])
        await asyncio.sleep(8.5)  # discord.py identifies anew 5 s after INVALID_SESSION: the fresh one is ~5 s old
        fresh = d.room.post("general", "bob", "ask-2 asked just now, @cairn", mentions=["cairn"])
        await back(d, identifies)
        await d.room.wait_for_message(lambda m: m["content"] == "Cairn answers ask-2", timeout=10)
        await settle(d)
        assert replies(d) == ["Cairn answers ask-0", "Cairn answers ask-2"]
        assert [g.trigger for g in await d.generations()] == [first["id"], fresh["id"]]
    lines = [r.getMessage() for r in caplog.records]
    skipped = [line for line in lines if "a mention missed in #general" in line]
    assert len(skipped) == 1 and f"(message {old['id']}) is " in skipped[0], skipped
    assert "older than catch_up.window 8s: not answered" in skipped[0]
    age = re.search(r"is (\d+)s old", skipped[0])
    assert age is not None and int(age.group(1)) >= 8, skipped
    assert any(
        "cairn caught up in #general" in line and "answered 1, older than the window 1" in line for line in lines
    )


async def test_a_live_mention_during_the_catch_up_is_answered_once_after_the_missed_ones(tmp_path: Path) -> None:
    async with deployed(tmp_path, [res()], responder=answer_last_ask) as d:
        await seen_once(d, "morning all")
        identifies = await away(d)
        missed = d.room.post("general", "alice", "ask-1 while you were away, @cairn", mentions=["cairn"])
        d.provider.hold()  # the catch-up's turn waits at the provider
        await back(d, identifies)
        await eventually(lambda: d.provider.arrived == 1, timeout=10)
        live = d.room.post("general", "bob", "ask-2 and now, @cairn", mentions=["cairn"])
        await d.wait_seen("cairn", live["id"])
        d.provider.release()
        await d.wait_bot_messages(2, timeout=15)
        await settle(d)
        assert replies(d) == ["Cairn answers ask-1", "Cairn answers ask-2"]
        assert [g.trigger for g in await d.generations()] == [missed["id"], live["id"]]


# ---------------------------------------------------------------- the real process, killed and started again


def write_config(base: Path) -> None:
    (base / "residences").mkdir()
    (base / "policies").mkdir()
    (base / "policies" / "catch.yaml").write_text(
        "retries:\n  max_attempts: 1\nfloor:\n  cooldown_seconds: 0\n  reply_to: mentions\ncatch_up:\n  window: 10m\n"
    )
    (base / "residences" / "cairn.yaml").write_text(
        f"name: cairn\nmodel: {MODEL}\nmax_tokens: 1024\nsystem: You are Cairn.\npolicy: catch\n"
        "discord:\n  token_env: CAIRN_DISCORD_TOKEN\n  channels: [general]\n"
    )


async def test_a_mention_made_while_the_process_was_down_is_answered_once_after_a_restart(tmp_path: Path) -> None:
    write_config(tmp_path)
    provider = ProviderServer(answer_last_ask)
    await provider.start()
    try:
        async with running_room(["general"]) as room:
            proc = Process(tmp_path, room.url, provider.url, tmp_path / "ledger.db", "--log-level", "info")
            try:
                await proc.start()
                await connected(room, proc, 0)

                def cairn() -> list[str]:
                    return [m["content"] for m in room.messages("general") if m["author"] == "cairn"]

                room.post("general", "alice", "ask-0 before the stop, @cairn", mentions=["cairn"])
                await room.wait_until(lambda: cairn() or None, timeout=20)
                await proc.kill()
                ask = room.post("general", "alice", "ask-1 while it was down, @cairn", mentions=["cairn"])
                identifies = room.gateway.identifies
                await proc.start()
                await connected(room, proc, identifies)
                await room.wait_until(lambda: cairn() if len(cairn()) >= 2 else None, timeout=20)
                await asyncio.sleep(1.0)  # anything more would come now
                assert cairn() == ["Cairn answers ask-0", "Cairn answers ask-1"], proc.output()
                [gen] = [
                    g for g in db_rows(tmp_path / "ledger.db", "SELECT trigger FROM generations") if g[0] == ask["id"]
                ]
                assert await proc.stop() == 0, proc.output()
                assert proc.tracebacks() == [], proc.output()
                log = (tmp_path / "run-2.log").read_text()
                assert "cairn caught up in #general" in log and "answered 1, older than the window 0" in log, log
            finally:
                if proc.proc is not None and proc.proc.returncode is None:
                    proc.proc.kill()
                    await proc.proc.wait()
    finally:
        await provider.stop()


# ---------------------------------------------------------------- what the catch-up reads: Discord's `after`


async def test_history_after_a_message_reads_forward_page_by_page_as_on_discord() -> None:
    """`channel.history(after=…)` asks for pages of the oldest messages after an id (each page newest first,
    as Discord sends it; discord.py turns each round); 250 messages take three pages, none lost or repeated."""
    async with running_room(["general"]) as room:
        ids = [int(room.post("general", "alice", f"m{i}")["id"]) for i in range(250)]
        async with running_bot(room.url, "local-cairn") as bot:
            channel = bot.get_channel(int(room.state.channel_by_ref("general").id))
            assert isinstance(channel, discord.TextChannel)
            forward = [m.id async for m in channel.history(after=discord.Object(ids[9]), limit=None)]
            assert forward == ids[10:]
            page = await bot.http.logs_from(channel.id, 5, after=ids[9])
            assert [int(m["id"]) for m in page] == list(reversed(ids[10:15]))  # the 5 just after, newest first
            bounded = [
                m.id async for m in channel.history(after=discord.Object(ids[9]), before=discord.Object(ids[20]))
            ]
            assert bounded == ids[10:20]
            newest = [m.id async for m in channel.history(limit=3)]
            assert newest == list(reversed(ids[-3:]))


async def test_a_missed_mention_from_another_bot_is_answered_as_the_live_path_would(tmp_path: Path) -> None:
    """The live path answers a bot that mentions the resident (the floor keeps bots from looping); so does
    the catch-up. The other bot is a plain discord.py client whose message pings by default."""
    async with deployed(tmp_path, [res()], responder=answer_last_ask) as d:
        await seen_once(d, "morning all")
        async with running_bot(d.room.url, "local-helper") as helper:
            channel = helper.get_channel(int(d.room.state.channel_by_ref("general").id))
            assert isinstance(channel, discord.TextChannel)
            cairn = d.bot("cairn").user
            assert cairn is not None
            identifies = await away(d)
            sent = await channel.send(f"ask-1 a bot asks, {cairn.mention}")
            await back(d, identifies)
            await d.room.wait_for_message(lambda m: m["content"] == "Cairn answers ask-1", timeout=15)
            await settle(d)
        assert replies(d) == ["Cairn answers ask-1"]
        assert [g.trigger for g in await d.generations()] == [str(sent.id)]
