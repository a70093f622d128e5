"""A resident in many guilds, its gateway in shards (`discord.shards`), as `residents run` runs it.

Real parts: `run_bots` with discord.py's AutoShardedBot against the local room over sockets, the room
applying Discord's shard rules (a guild on shard `(guild_id >> 22) % count`, 4011 past its limit per
session), the anthropic SDK against the local provider, a real SQLite ledger. Also: `discord.shards`
errors in `residents check`, and the pacing of IDENTIFYs by Discord's `max_concurrency`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import residence
from discordkit import Deployed, deployed
from roomkit import eventually

from residents import cli
from residents.discord.app import IdentifyPacer
from residents.discord.catchup import Sightings
from residents.discord.run import StartupError
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.localservers.room import Layout
from residents.localservers.room.layout import parse_layout

MODEL = "claude-3-opus-20240229"


def nine_guilds(**sharding: int) -> Layout:
    """Guilds g0..g8, a channel `talk` in each; IDENTIFYs unpaced unless the test says otherwise."""
    rules = {"max_concurrency": 16, **sharding}
    return parse_layout({"guilds": [{"name": f"g{i}", "channels": ["talk"]} for i in range(9)], "sharding": rules})


def answer_ask(body: dict[str, Any]) -> Call:
    """`Cairn answers ask-gN`, N from the newest `ask-gN` the turn read: which guild's channel it read."""
    asks = re.findall(r"ask-(g\d+)", json.dumps(body["messages"]))
    return Call(sse=sse.stream(f"Cairn answers ask-{asks[-1] if asks else 'nothing'}", "end_turn", 5, model=MODEL))


def sharded_resident(shards: Any, channels: list[str] | None = None) -> Any:
    discord: dict[str, Any] = {"token_env": "CAIRN_DISCORD_TOKEN", "channels": channels or []}
    if shards is not None:
        discord["shards"] = shards
    return residence(
        discord=discord,
        policy={
            "retries": {"max_attempts": 2, "backoff_seconds": 0},
            "floor": {"cooldown_seconds": 0, "reply_to": "mentions"},
        },
    )


def shard_of_guild(d: Deployed, name: str, count: int) -> int:
    guild = next(g for g in d.room.state.guilds.values() if g.name == name)
    return (guild.id >> 22) % count


def answers(d: Deployed, guild: str) -> list[str]:
    return [m["content"] for m in d.bot_messages(f"{guild}/talk")]


async def ask(d: Deployed, guild: str) -> dict[str, Any]:
    return d.room.post(f"{guild}/talk", "alice", f"ask-{guild} how is it here, @cairn?", mentions=["cairn"])


async def test_one_resident_on_three_shards_answers_in_each_of_nine_guilds(tmp_path: Path) -> None:
    # At most 3 guilds per session: the room would refuse this bot unsharded (4011).
    layout = nine_guilds(max_guilds_per_session=3)
    async with deployed(tmp_path, [sharded_resident({"count": 3})], layout=layout, responder=answer_ask) as d:
        bot = d.bot("cairn")
        assert bot.shard_count == 3 and sorted(bot.shards) == [0, 1, 2]  # type: ignore[attr-defined]
        assert len(bot.guilds) == 9
        sessions = d.room.snapshot()["gateway"]["sessions"]
        assert sorted(tuple(s["shard"]) for s in sessions) == [(0, 3), (1, 3), (2, 3)]
        guilds = [f"g{i}" for i in range(9)]
        assert {shard_of_guild(d, g, 3) for g in guilds} == {0, 1, 2}
        asks = {g: await ask(d, g) for g in guilds}
        await d.room.wait_until(lambda: all(answers(d, g) for g in guilds) or None, timeout=30)
        await d.quiet(0.3)
        for g in guilds:  # one reply per mention, in the channel of the guild it was asked in
            assert answers(d, g) == [f"Cairn answers ask-{g}"], g
        generations = await d.generations()
        assert sorted(x.trigger for x in generations) == sorted(m["id"] for m in asks.values())
        assert {x.channel for x in generations} == {d.room.channel_id(f"{g}/talk") for g in guilds}


async def test_shards_auto_runs_the_count_the_room_recommends(tmp_path: Path) -> None:
    layout = nine_guilds(guilds_per_shard=4, max_guilds_per_session=4)  # 9 guilds: 3 shards recommended
    async with deployed(tmp_path, [sharded_resident("auto")], layout=layout, responder=answer_ask) as d:
        bot = d.bot("cairn")
        assert bot.shard_count == 3 and sorted(bot.shards) == [0, 1, 2]  # type: ignore[attr-defined]
        await ask(d, "g8")
        await d.room.wait_until(lambda: answers(d, "g8") or None, timeout=15)
        assert answers(d, "g8") == ["Cairn answers ask-g8"]


async def test_an_unsharded_resident_past_the_session_limit_stops_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(StartupError) as refused:
        async with deployed(tmp_path, [sharded_resident(None)], layout=nine_guilds(max_guilds_per_session=4)):
            pass
    assert str(refused.value) == (
        "residences/cairn.yaml: discord.shards: the gateway requires sharding (close code 4011): the bot is in "
        "more guilds than one session may carry; set discord.shards: auto"
    )
    with pytest.raises(StartupError) as too_few:
        async with deployed(tmp_path, [sharded_resident({"count": 2})], layout=nine_guilds(max_guilds_per_session=4)):
            pass
    assert re.fullmatch(
        r"residences/cairn\.yaml: discord\.shards: shard [01] of 2 would carry more guilds than one session may "
        r"\(close code 4011\); set a larger count, or auto",
        str(too_few.value),
    ), too_few.value


async def test_one_shard_out_leaves_the_others_answering_and_it_catches_up_on_its_own_guilds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="residents")
    async with deployed(tmp_path, [sharded_resident({"count": 3})], layout=nine_guilds(), responder=answer_ask) as d:
        by_shard = {s: [f"g{i}" for i in range(9) if shard_of_guild(d, f"g{i}", 3) == s] for s in range(3)}
        out, up = by_shard[1], by_shard[0] + by_shard[2]
        for g in [f"g{i}" for i in range(9)]:  # the resident has been in every channel: a gap is a gap
            d.room.post(f"{g}/talk", "alice", f"morning {g}")
        await d.quiet(0.3)
        identifies = d.room.gateway.identifies
        assert await d.room.invalidate_sessions(hold=True, shard=1) == 1
        await eventually(lambda: len([s for s in d.room.snapshot()["gateway"]["sessions"] if s["connected"]]) == 2)
        missed = await ask(d, out[0])
        for g in up:  # the other shards answer while shard 1 is out
            await ask(d, g)
        await d.room.wait_until(lambda: all(answers(d, g) for g in up) or None, timeout=30)
        assert answers(d, out[0]) == []
        assert int(missed["id"]) not in d.seen["cairn"]  # never delivered: shard 1 had no session
        caplog.clear()
        d.room.release_gateway()
        await eventually(lambda: d.room.gateway.identifies == identifies + 1, timeout=15)  # shard 1 alone
        await d.room.wait_until(lambda: answers(d, out[0]) or None, timeout=20)
        await d.quiet(0.5)
        assert answers(d, out[0]) == [f"Cairn answers ask-{out[0]}"]  # caught up, once
        for g in up:
            assert answers(d, g) == [f"Cairn answers ask-{g}"]
        for g in out[1:]:
            assert answers(d, g) == []
        caught = [r.getMessage() for r in caplog.records if "caught up in #talk" in r.getMessage()]
        channels = {d.room.channel_id(f"{g}/talk") for g in out}
        assert len(caught) == len(out) and all(any(c in line for c in channels) for line in caught), caught


async def test_a_process_running_some_shards_answers_only_in_their_guilds(tmp_path: Path) -> None:
    # It lists every guild's channel: those on shard 1 are not missing, only in another process's guilds.
    cairn = sharded_resident({"count": 3, "ids": [0, 2]}, [f"g{i}/talk" for i in range(9)])
    async with deployed(tmp_path, [cairn], layout=nine_guilds(), responder=answer_ask) as d:
        bot = d.bot("cairn")
        assert sorted(bot.shards) == [0, 2]  # type: ignore[attr-defined]
        sessions = d.room.snapshot()["gateway"]["sessions"]
        assert sorted(tuple(s["shard"]) for s in sessions) == [(0, 3), (2, 3)]
        mine = [f"g{i}" for i in range(9) if shard_of_guild(d, f"g{i}", 3) != 1]
        elsewhere = [f"g{i}" for i in range(9) if shard_of_guild(d, f"g{i}", 3) == 1]
        assert sorted(g.name for g in bot.guilds) == sorted(mine)  # shard 1's guilds are another process's
        for g in [f"g{i}" for i in range(9)]:
            await ask(d, g)
        await d.room.wait_until(lambda: all(answers(d, g) for g in mine) or None, timeout=30)
        await d.quiet(0.3)
        assert all(answers(d, g) == [f"Cairn answers ask-{g}"] for g in mine)
        assert all(answers(d, g) == [] for g in elsewhere)


def test_run_names_a_bad_shards_option_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(RES)
    monkeypatch.chdir(tmp_path)
    for spec, expected in (
        ("4:0,4", "--shards 4:0,4: 4 is not a shard of 4 (ids run from 0 to 3)"),
        ("four", "--shards four: write auto, N, or N:ID,ID,... (e.g. 4:0,2)"),
        ("auto:1", "--shards auto:1: ids need a fixed count (`auto` cannot be split)"),
    ):
        assert cli.main(["run", "--discord-api", "http://127.0.0.1:9", "--shards", spec]) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_shards_option_takes_the_place_of_each_residence_s_own(tmp_path: Path) -> None:
    from residents.discord.run import plan_deployment, process_shards

    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(RES + "  shards: auto\n")
    env = {"ANTHROPIC_API_KEY": "k"}
    [own] = plan_deployment(tmp_path, local_api=True, env=env).residences
    assert own.discord is not None and own.discord.shards is not None and own.discord.shards.auto
    [given] = plan_deployment(tmp_path, local_api=True, env=env, shards=process_shards("4:1,3")).residences
    assert given.discord is not None and given.discord.shards is not None
    assert (given.discord.shards.count, given.discord.shards.ids) == (4, [1, 3])


def test_a_shard_s_drop_marks_the_gap_of_its_own_channels_only() -> None:
    sightings = Sightings()
    for channel, message in ((1, 10), (2, 20), (3, 30)):
        sightings.saw(channel, message)
    sightings.dropped([1, 2])  # the shard carrying channels 1 and 2 lost its connection
    assert sightings.at_drop == {1: 10, 2: 20}
    assert sightings.live_from == {3: 30}  # channel 3's shard still delivers live: its catch-up bound stays
    sightings.saw(3, 31)
    sightings.dropped([3])
    assert sightings.at_drop == {1: 10, 2: 20, 3: 31} and sightings.live_from == {}


async def test_identify_pacer_keeps_one_identify_per_window_in_each_bucket() -> None:
    pacer = IdentifyPacer(window=0.3)
    pacer.max_concurrency = 2
    loop = asyncio.get_running_loop()
    start = loop.time()
    for shard_id in (0, 1):  # two buckets: both at once
        await pacer.wait(shard_id)
    assert loop.time() - start < 0.1
    await pacer.wait(2)  # bucket 0 again: waits out the window
    assert loop.time() - start >= 0.29


RES = """name: cairn
model: claude-haiku-4-5
max_tokens: 4096
system: hi
policy: default
discord:
  token_env: CAIRN_DISCORD_TOKEN
"""


@pytest.mark.parametrize(
    ("shards", "expected"),
    [
        ("{count: 0}", "discord.shards.count: Input should be greater than or equal to 1 (got 0)"),
        ("{count: 3, ids: [0, 3]}", "discord.shards.ids: 3 is not a shard of 3 (ids run from 0 to 2)"),
        ("{count: 3, ids: [1, 2, 1]}", "discord.shards.ids: shard 1 is listed twice"),
        ("{ids: [0, 1]}", "discord.shards.count: required: how many shards the bot runs in (ids are some of"),
        ("{count: 2, ids: []}", "discord.shards.ids: an empty list runs no shard"),
        ("3", "discord.shards: must be `auto`, or {count: N} with optional ids: [...]"),
        ("sometimes", "discord.shards: must be `auto`, or {count: N}"),
    ],
)
def test_check_names_the_shards_key_that_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shards: str, expected: str
) -> None:
    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(RES + f"  shards: {shards}\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "residences/cairn.yaml"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"residences/cairn.yaml:8: {expected}"), err
    assert "Traceback" not in err


@pytest.mark.parametrize("shards", ["auto", "{count: 4}", "{count: 4, ids: [1, 3]}"])
def test_check_takes_good_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shards: str
) -> None:
    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(RES + f"  shards: {shards}\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "residences/cairn.yaml"]) == 0, capsys.readouterr().err
