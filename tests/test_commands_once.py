"""Slash commands once per guild: one bot of the process registers the moderators' commands and answers them
for every resident (issue 13.6). Real discord.py bots started by `run_bots`, over real sockets to the local room."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from conftest import specimen
from discordkit import Deployed, deployed, opts, sub
from test_discord_e2e import BOUNDS, res

from residents import truth
from residents.config import ConfigError
from residents.discord.app import commands_bot_of
from residents.localservers import sse
from residents.localservers.provider import Call

COMMANDS = [
    "continue",
    "generation",
    "policy",
    "stumps",
    "usage",
    "provenance",
    "Provenance",
]  # all on the one commands bot


def registered(d: Deployed) -> Counter[tuple[str, str]]:
    """(command name, owning bot) for every command registered in the room's guild."""
    state = d.room.state
    return Counter((c.name, state.users[c.application_id].name) for c in state.commands.values())


async def invoke(d: Deployed, name: str, options: list[dict[str, Any]]) -> dict[str, Any]:
    """As a moderator would: by name only; the room finds the one bot that has the command."""
    out = await d.room.invoke_command(
        "general", "moddy", name, options=options, moderator=True, timeout=10.0, settle=0.1
    )
    assert not out["timed_out"], out
    return out


async def test_three_residents_register_one_copy_and_the_first_answers_for_sill(tmp_path) -> None:
    fragment = "Sill began to say something about the tide, and"
    cut = sse.head("claude-3-opus-20240229") + b"".join(sse.delta(p) for p in sse.pieces(fragment)) + sse.error()
    residents = [res("cairn"), res("sill"), res("wren")]
    async with deployed(tmp_path, residents, calls=[Call(sse=cut), Call(sse=sse.stream("Sill, again."))]) as d:
        assert registered(d) == Counter({(n, "cairn"): 1 for n in COMMANDS})
        d.room.post("general", "alice", "and the tide, @sill?", mentions=["sill"])
        await d.room.wait_for_message(lambda m: m["author"] == "sill", timeout=10)
        await d.quiet(0.2)
        [stump] = [s for g in await d.generations("sill") for s in g.stumps]
        assert stump.cause == truth.RETRY_ABANDONED
        out = await invoke(d, "stumps", sub("list", resident="sill"))
        assert out["bot"] == "cairn"
        assert stump.id in out["responses"][0]["content"]
        out = await invoke(d, "policy", sub("show", resident="wren"))
        assert out["responses"][0]["content"].startswith("```\n# wren ")


async def test_discord_commands_true_picks_the_bot_that_answers_for_every_resident(tmp_path) -> None:
    """Wren is marked `discord.commands: true`: only its bot registers, and its /continue of Cairn's cut
    output is posted by Cairn."""
    policy = {"continuation": {"standing": "on-request", **BOUNDS}}
    calls = [Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))]
    wren = res("wren", discord={"token_env": "WREN_DISCORD_TOKEN", "channels": ["general"], "commands": True})
    async with deployed(tmp_path, [res(max_tokens=600, policy=policy), res("sill"), wren], calls=calls) as d:
        assert registered(d) == Counter({(n, "wren"): 1 for n in COMMANDS})
        d.room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        before = len(d.bot_messages())
        [g] = await d.generations()
        out = await invoke(d, "continue", opts(generation=g.id))
        assert out["bot"] == "wren"
        assert out["responses"][-1]["content"].startswith(f"Continued {g.id}: now completed")
        await d.quiet(0.1)
        added = d.bot_messages()[before:]
        assert added and {m["author"] for m in added} == {"cairn"}


def test_two_residences_marked_for_commands_is_one_clear_error() -> None:
    both = [res(n, discord={"token_env": f"{n.upper()}_T", "commands": True}) for n in ("cairn", "sill")]
    with pytest.raises(ConfigError, match=r"residences/sill.yaml: discord.commands: only one residence"):
        commands_bot_of(both)
    assert commands_bot_of([res("cairn"), res("sill")]) == "cairn"
