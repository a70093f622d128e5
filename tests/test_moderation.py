"""Moderation scoped to where it is asked, over real sockets: `run_bots` (as `residents run`) on a local room
built from the bundled two-guild layout, the local provider behind the real SDK, a real SQLite ledger.

    harbour:   yard, dock      mods: manage_messages     alice: -, mo: mods      dock denies mods view_channel
    elsewhere: yard            admins: administrator     eve: admins

A record outside the invoking member's scope (another guild, or a channel they cannot see) is answered
exactly like one that does not exist; every command invocation is answered, errors included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3

import pytest
from conftest import residence, specimen
from discordkit import deployed, opts, sub

from residents.discord import checks
from residents.discord.run import Deployment, StartupError, run_bots
from residents.ledger.verify import verify
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import load_layout
from residents.localservers.room.model import ApiError
from residents.records import Generation, Stump

try:
    from roomkit import running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import running_room

LAYOUT = load_layout("two-guilds")
CUT = Call(sse=specimen("ceiling-1024.sse"))


def cairn(*channels: str, **policy):
    return residence(
        name="cairn",
        max_tokens=1024,
        policy={"retries": {"max_attempts": 3, "backoff_seconds": 0}, "floor": {"cooldown_seconds": 0}, **policy},
        discord={"token_env": "CAIRN_DISCORD_TOKEN", "channels": list(channels)},
    )


async def run(d, channel: str, member: str, name: str, options: list) -> dict:
    """/name as `member` in `channel`; the member's roles in the layout decide what they may do."""
    out = await d.room.invoke_command(channel, member, name, bot="cairn", options=options, timeout=10.0, settle=0.1)
    assert not out["timed_out"], out
    return out


def answer(out: dict, *ids: str) -> list[tuple]:
    """What the member saw, with the ids they asked about blanked: comparable between a real and a made-up id."""

    def blank(text: str | None) -> str | None:
        for i in ids:
            text = text.replace(i, "<ID>") if text else text
        return text

    return [(r["kind"], r["type"], r["ephemeral"], blank(r["content"])) for r in out["responses"]]


async def cut_in(d, channel: str) -> Generation:
    n = len(await d.generations())
    d.room.post(channel, "alice", "describe the harbour, @cairn", mentions=["cairn"])
    await d.wait_receipt(channel=channel)
    await d.quiet(0.1)
    gens = await d.generations()
    assert len(gens) == n + 1
    return gens[-1]


async def strict_clean(d) -> None:
    """`residents ledger verify --strict` over the deployment's ledger: no violation, nothing unsettled."""
    await d.quiet(0.1)
    assert await verify(d.ledger, unsettled_as_violations=True) == []


async def test_guild_b_admin_cannot_reach_guild_a_records(tmp_path):
    on_request = {
        "continuation": {
            "standing": "on-request",
            "max_segments": 2,
            "max_output_tokens": 12288,
            "min_progress_chars": 16,
            "similarity_abort": 0.92,
        }
    }
    async with deployed(tmp_path, [cairn("harbour/yard", **on_request)], calls=[CUT], layout=LAYOUT) as d:
        g = await cut_in(d, "harbour/yard")
        [stump] = g.stumps
        receipt = next(p for p in g.posts if p.kind == "receipt")
        link = f"https://discord.com/channels/{d.room.guild_id}/{g.channel}/{receipt.message_id}"

        # In harbour, mo (mods) sees the records of yard: the scope is real, not everything refused.
        out = await run(d, "harbour/yard", "mo", "stumps", sub("list"))
        assert stump.id in out["responses"][0]["content"]
        out = await run(d, "harbour/yard", "mo", "generation", sub("show", ref=g.id))
        assert g.id in out["responses"][0]["content"]
        out = await run(d, "harbour/yard", "mo", "policy", sub("show"))
        assert "standing: on-request" in out["responses"][0]["content"]

        room_before, asked_before = d.room.messages("harbour/yard"), len(d.provider.requests)
        # eve administers elsewhere: every lookup of harbour's records answers as for a record that does not exist.
        out = await run(d, "elsewhere/yard", "eve", "stumps", sub("list"))
        assert answer(out) == [("callback", 4, True, "No stumps for any resident.")]
        for real, made_up in [(stump.id, "s-000000000000")]:
            assert (
                answer(await run(d, "elsewhere/yard", "eve", "stumps", sub("show", id=real)), real)
                == answer(await run(d, "elsewhere/yard", "eve", "stumps", sub("show", id=made_up)), made_up)
                == [("callback", 4, True, "No stump <ID>.")]
            )
        for real, made_up in [
            (g.id, "g-000000000000"),
            (link, link.replace(receipt.message_id, "1" * 19)),
            (receipt.message_id, "1" * 19),
        ]:
            assert (
                answer(await run(d, "elsewhere/yard", "eve", "generation", sub("show", ref=real)), real)
                == answer(await run(d, "elsewhere/yard", "eve", "generation", sub("show", ref=made_up)), made_up)
                == [("callback", 4, True, "No generation found for <ID>.")]
            )
        assert (
            answer(await run(d, "elsewhere/yard", "eve", "continue", opts(generation=g.id)), g.id)
            == answer(
                await run(d, "elsewhere/yard", "eve", "continue", opts(generation="g-000000000000")), "g-000000000000"
            )
            == [("callback", 4, True, "No generation <ID> of a resident here.")]
        )
        assert (
            answer(await run(d, "elsewhere/yard", "eve", "policy", sub("show")), "cairn")
            == answer(await run(d, "elsewhere/yard", "eve", "policy", sub("show", resident="nobody")), "nobody")
            == [("callback", 4, True, "No resident <ID> here.")]
        )
        await d.quiet(0.1)
        assert d.room.messages("harbour/yard") == room_before and len(d.provider.requests) == asked_before
        assert d.room.messages("elsewhere/yard") == []
        [g_after] = await d.generations()
        assert (len(g_after.segments), len(g_after.posts)) == (len(g.segments), len(g.posts))  # nothing continued
        await strict_clean(d)


async def test_an_overwrite_denying_view_hides_that_channels_records(tmp_path):
    async with deployed(tmp_path, [cairn("harbour/yard", "harbour/dock")], calls=[CUT, CUT], layout=LAYOUT) as d:
        in_yard = await cut_in(d, "harbour/yard")
        in_dock = await cut_in(d, "harbour/dock")  # alice may post there: only mods are denied the channel
        [yard_stump], [dock_stump] = in_yard.stumps, in_dock.stumps

        listed = (await run(d, "harbour/yard", "mo", "stumps", sub("list")))["responses"][0]["content"]
        assert yard_stump.id in listed and dock_stump.id not in listed
        assert answer(await run(d, "harbour/yard", "mo", "stumps", sub("show", id=dock_stump.id)), dock_stump.id) == [
            ("callback", 4, True, "No stump <ID>.")
        ]
        assert answer(await run(d, "harbour/yard", "mo", "generation", sub("show", ref=in_dock.id)), in_dock.id) == [
            ("callback", 4, True, "No generation found for <ID>.")
        ]
        shown = (await run(d, "harbour/yard", "mo", "stumps", sub("show", id=yard_stump.id)))["responses"]
        assert yard_stump.id in shown[0]["content"] and len(shown) > 1  # its text, where the overwrite does not bite
        with pytest.raises(ApiError) as refused:  # and mo cannot even run a command in dock
            await d.room.invoke_command("harbour/dock", "mo", "stumps", bot="cairn", options=sub("list"))
        assert refused.value.status == 403
        await strict_clean(d)


async def test_stumps_list_is_newest_first_and_paged(tmp_path):
    async with deployed(tmp_path, [cairn("harbour/yard")], layout=LAYOUT) as d:
        yard = d.room.channel_id("harbour/yard")
        made = []
        for i in range(25):
            g = Generation(
                id=f"g-{i:012}",
                residence="cairn",
                channel=yard,
                model="claude-3-opus-20240229",
                status="truncated",
                created_at=1000.0 + i,
            )
            await d.ledger.create_generation(g)
            made.append(
                Stump(
                    id=f"s-{i:012}",
                    generation_id=g.id,
                    attempt_id=None,
                    cause="max_tokens",
                    text="t" * (100 + i),
                    output_tokens=i,
                    residence="cairn",
                    created_at=1000.0 + i,
                )
            )
        await d.ledger.add_stumps(made)
        newest = [s.id for s in reversed(made)]

        def listed(out: dict) -> list[str]:
            return re.findall(r"s-\d{12}", "\n".join(r["content"] for r in out["responses"]))

        first = await run(d, "harbour/yard", "mo", "stumps", sub("list"))
        assert listed(first) == newest[:20]
        assert first["responses"][0]["content"].startswith("```\npage 1, newest first; older: page:2\n")
        assert "124 chars" in first["responses"][0]["content"]  # the stored count, without reading the text
        second = await run(d, "harbour/yard", "mo", "stumps", sub("list", page=2))
        assert listed(second) == newest[20:] and "older:" not in second["responses"][0]["content"]
        third = await run(d, "harbour/yard", "mo", "stumps", sub("list", page=3))
        assert answer(third) == [("callback", 4, True, "No stumps for any resident on page 3.")]


async def test_a_command_that_fails_inside_is_answered_and_logged_once(tmp_path, monkeypatch):
    captured: list[logging.LogRecord] = []
    quiet = logging.getLogger("tests.moderation.checks")  # outside the loggers the error guards fail on
    quiet.propagate = False
    handler = logging.Handler()
    handler.emit = captured.append  # type: ignore[method-assign]
    quiet.addHandler(handler)
    monkeypatch.setattr(checks, "log", quiet)
    try:
        async with deployed(tmp_path, [cairn("harbour/yard")], layout=LAYOUT) as d:
            with contextlib.closing(sqlite3.connect(d.db)) as db:  # a real fault under the bot: its table is gone
                db.execute("ALTER TABLE stumps RENAME TO stumps_elsewhere")
            out = await run(d, "harbour/yard", "mo", "stumps", sub("list"))
            assert answer(out) == [("callback", 4, True, checks.FAILED)]
            out = await run(d, "harbour/yard", "alice", "stumps", sub("list"))  # refusals use the same handler
            assert answer(out) == [("callback", 4, True, checks.REFUSAL)]
    finally:
        quiet.removeHandler(handler)
    errors = [r for r in captured if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "/stumps list" in errors[0].getMessage()
    assert errors[0].exc_info and isinstance(errors[0].exc_info[1], sqlite3.OperationalError)


async def test_an_ambiguous_bare_channel_stops_start_up_naming_both_guilds(tmp_path):
    provider = ProviderServer()
    await provider.start()
    try:
        async with running_room(layout=LAYOUT) as room:
            with pytest.raises(StartupError) as info:
                await asyncio.wait_for(
                    run_bots(
                        Deployment([cairn("yard")], {"cairn": "local-cairn"}),
                        str(tmp_path / "l.db"),
                        {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "k"},
                        guild_ready_timeout=0.05,
                    ),
                    timeout=10,
                )
            line = str(info.value)
            assert "\n" not in line and line.startswith("residences/cairn.yaml: discord.channels: 'yard'")
            assert "harbour" in line and "elsewhere" in line and "'harbour/yard'" in line
            assert not any(b["connected"] for b in room.snapshot()["bots"])
    finally:
        await provider.stop()
