"""The local room's gateway shards as Discord does: a session hears only of the guilds on its shard
(`(guild_id >> 22) % num_shards`), a bad `shard` is closed with 4010 and a session carrying too many
guilds with 4011; `GET /gateway/bot` recommends a shard count. Checked over real sockets, with raw
gateway frames (what exactly each session is sent) and with discord.py's own AutoShardedBot."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import discord
import pytest
from discord.ext import commands

try:
    from roomkit import ErrorGuard, error_guard, eventually, running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import ErrorGuard, error_guard, eventually, running_bot, running_room

from residents.localservers.room import LayoutError, RoomServer
from residents.localservers.room.layout import parse_layout

INTENTS = (1 << 0) | (1 << 9) | (1 << 15)  # guilds, guild messages, message content


def many_guilds(n: int, **sharding: int) -> Any:
    """A layout of `n` guilds g0..g{n-1}, each with one channel `talk`, and the given sharding rules."""
    data: dict[str, Any] = {"guilds": [{"name": f"g{i}", "channels": ["talk"]} for i in range(n)]}
    if sharding:
        data["sharding"] = sharding
    return parse_layout(data)


@pytest.fixture
async def guard() -> AsyncIterator[ErrorGuard]:
    async with error_guard() as g:
        yield g


class RawSession:
    """One gateway websocket spoken to frame by frame: what the room sends this session, exactly."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def identify(self, token: str, shard: Any = None) -> None:
        hello = await self.ws.receive_json(timeout=5)
        assert hello["op"] == 10
        data: dict[str, Any] = {"token": token, "intents": INTENTS, "properties": {}}
        if shard is not None:
            data["shard"] = shard
        await self.ws.send_str(json.dumps({"op": 2, "d": data}))

    async def read_until(self, event: str, count: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Dispatches until `count` of `event` have come; returns those."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while sum(1 for t, _ in self.events if t == event) < count:
            msg = await self.ws.receive(timeout=max(0.01, deadline - loop.time()))
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"socket closed ({self.ws.close_code}) before {count} {event}")
            frame = json.loads(msg.data)
            if frame["op"] == 0:
                self.events.append((frame["t"], frame["d"]))
        return [d for t, d in self.events if t == event]

    async def close_code(self) -> int | None:
        msg = await self.ws.receive(timeout=5)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
        return self.ws.close_code


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class QuickShardedBot(commands.AutoShardedBot):
    """discord.py's AutoShardedBot without its 5 s wait between shards' IDENTIFYs (the rules under test are the
    room's, not the pacing)."""

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        return None


async def raw(http: aiohttp.ClientSession, room: RoomServer) -> RawSession:
    return RawSession(await http.ws_connect(room.gateway_url()))


async def test_a_session_hears_only_of_the_guilds_on_its_shard(guard: ErrorGuard, http: aiohttp.ClientSession) -> None:
    async with running_room(layout=many_guilds(9)) as room:
        guild_ids = [g.id for g in room.state.guilds.values()]
        assert sorted({(gid >> 22) % 3 for gid in guild_ids}) == [0, 1, 2]  # the layout's guilds spread evenly
        assert [sum(1 for gid in guild_ids if (gid >> 22) % 3 == s) for s in range(3)] == [3, 3, 3]
        sessions = []
        for shard_id in range(3):
            s = await raw(http, room)
            await s.identify("local-cairn", [shard_id, 3])
            sessions.append(s)
        whole = await raw(http, room)
        await whole.identify("local-cairn")  # no `shard`: one session carries every guild

        for shard_id, s in enumerate(sessions):
            (ready,) = await s.read_until("READY")
            mine = {gid for gid in guild_ids if (gid >> 22) % 3 == shard_id}
            assert ready["shard"] == [shard_id, 3]
            assert {int(g["id"]) for g in ready["guilds"]} == mine
            created = await s.read_until("GUILD_CREATE", 3)
            assert {int(g["id"]) for g in created} == mine
        (ready,) = await whole.read_until("READY")
        assert "shard" not in ready and len(ready["guilds"]) == 9
        assert len(await whole.read_until("GUILD_CREATE", 9)) == 9

        for i in range(9):
            room.post(f"g{i}/talk", "alice", f"hello g{i}")
        for i in range(3):  # a last word on each shard: a session has been sent all it will be once it has its own
            room.post(f"g{i}/talk", "alice", "last word")
        assert len(await whole.read_until("MESSAGE_CREATE", 12)) == 12
        for shard_id, s in enumerate(sessions):
            got = await s.read_until("MESSAGE_CREATE", 4)
            assert got[-1]["content"] == "last word"
            assert {(int(m["guild_id"]) >> 22) % 3 for m in got} == {shard_id}
            assert len({m["guild_id"] for m in got}) == 3  # its three guilds, each message once
        for s in (*sessions, whole):
            await s.ws.close()


@pytest.mark.parametrize(
    ("shard", "why"),
    [([3, 3], "id not below the count"), ([0, 0], "no shards"), ([-1, 2], "a negative id"), ("0,2", "not a pair")],
)
async def test_an_invalid_shard_is_closed_with_4010(
    guard: ErrorGuard, http: aiohttp.ClientSession, shard: Any, why: str
) -> None:
    async with running_room(layout=many_guilds(2)) as room:
        s = await raw(http, room)
        await s.identify("local-cairn", shard)
        assert await s.close_code() == 4010, why
        assert room.gateway.live_sessions() == []


async def test_too_many_guilds_for_one_session_is_closed_with_4011(
    guard: ErrorGuard, http: aiohttp.ClientSession
) -> None:
    async with running_room(layout=many_guilds(9, max_guilds_per_session=4)) as room:
        whole = await raw(http, room)
        await whole.identify("local-cairn")
        assert await whole.close_code() == 4011  # 9 guilds, at most 4 per session
        counts = [sum(1 for gid in room.state.guilds if (gid >> 22) % 2 == s) for s in range(2)]
        assert sorted(counts) == [4, 5]
        two = await raw(http, room)
        await two.identify("local-cairn", [counts.index(5), 2])
        assert await two.close_code() == 4011  # that shard of 2 carries 5 of the 9
        other = await raw(http, room)
        await other.identify("local-cairn", [counts.index(4), 2])
        assert len((await other.read_until("READY"))[0]["guilds"]) == 4  # the other one may
        await other.ws.close()
        three = await raw(http, room)
        await three.identify("local-cairn", [0, 3])
        (ready,) = await three.read_until("READY")
        assert len(ready["guilds"]) == 3
        await three.ws.close()


async def test_gateway_bot_recommends_a_shard_per_guilds_per_shard(
    guard: ErrorGuard, http: aiohttp.ClientSession
) -> None:
    for guilds, per_shard, expected, concurrency in ((9, 3, 3, 1), (10, 3, 4, 16), (2, 1000, 1, 1)):
        layout = many_guilds(guilds, guilds_per_shard=per_shard, max_concurrency=concurrency)
        async with running_room(layout=layout) as room:
            async with http.get(f"{room.url}/api/v10/gateway/bot", headers={"Authorization": "Bot local-x"}) as r:
                body = await r.json()
            assert r.status == 200
            assert body["shards"] == expected and body["url"] == room.gateway_url()
            assert body["session_start_limit"]["max_concurrency"] == concurrency
            async with http.get(f"{room.url}/api/v10/gateway/bot") as r:
                assert r.status == 401  # a bot's own call, as on Discord


async def test_discord_py_auto_sharded_bot_takes_the_recommended_count(guard: ErrorGuard) -> None:
    async with running_room(layout=many_guilds(9, guilds_per_shard=3)) as room:
        async with running_bot(room.url, "local-cairn", bot_class=QuickShardedBot) as bot:
            assert bot.shard_count == 3 and sorted(bot.shards) == [0, 1, 2]
            assert len(bot.guilds) == 9 and all(not g.unavailable for g in bot.guilds)
            sessions = room.snapshot()["gateway"]["sessions"]
            assert sorted(tuple(s["shard"]) for s in sessions) == [(0, 3), (1, 3), (2, 3)]
            heard: list[tuple[int, int]] = []

            @bot.listen()
            async def on_message(message: discord.Message) -> None:
                assert message.guild is not None
                heard.append((message.guild.shard_id, message.guild.id))

            for i in range(9):
                room.post(f"g{i}/talk", "alice", f"hello g{i}")
            await eventually(lambda: len(heard) == 9)
            assert sorted(gid for _, gid in heard) == sorted(g.id for g in room.state.guilds.values())
            assert all(shard == (gid >> 22) % 3 for shard, gid in heard)


async def test_one_shard_of_a_bot_dropped_leaves_the_others_hearing(guard: ErrorGuard) -> None:
    async with running_room(layout=many_guilds(6)) as room:
        async with running_bot(room.url, "local-cairn", bot_class=QuickShardedBot, shard_count=2) as bot:
            heard: list[str] = []

            @bot.listen()
            async def on_message(message: discord.Message) -> None:
                heard.append(message.content)

            on_1 = [g.name for g in room.state.guilds.values() if (g.id >> 22) % 2 == 1]
            on_0 = [g.name for g in room.state.guilds.values() if (g.id >> 22) % 2 == 0]
            assert await room.invalidate_sessions(hold=True, shard=1) == 1
            room.post(f"{on_0[0]}/talk", "alice", "shard 0 still hears")
            room.post(f"{on_1[0]}/talk", "alice", "shard 1 is out")
            await eventually(lambda: "shard 0 still hears" in heard)
            await asyncio.sleep(0.2)
            assert "shard 1 is out" not in heard
            assert not bot.get_shard(0).is_closed()  # type: ignore[union-attr]
            room.release_gateway()
            await eventually(lambda: len(room.snapshot()["gateway"]["sessions"]) == 2)
            room.post(f"{on_1[1]}/talk", "alice", "shard 1 is back")
            await eventually(lambda: "shard 1 is back" in heard)


async def test_the_faults_api_ends_one_shard_s_sessions(guard: ErrorGuard, http: aiohttp.ClientSession) -> None:
    async with running_room(layout=many_guilds(4)) as room:
        sessions = []
        for shard_id in range(2):
            s = await raw(http, room)
            await s.identify("local-cairn", [shard_id, 2])
            await s.read_until("GUILD_CREATE", 2)  # 4 guilds, 2 on each shard
            sessions.append(s)
        async with http.post(f"{room.url}/_room/faults", json={"invalidate_sessions": True, "shard": "1"}) as r:
            assert r.status == 400 and "shard" in (await r.json())["message"]
        async with http.post(f"{room.url}/_room/faults", json={"invalidate_sessions": True, "shard": 1}) as r:
            assert r.status == 200
        await sessions[1].close_code()  # shard 1's socket is closed, its session gone
        assert sessions[1].ws.closed and not sessions[0].ws.closed
        left = room.snapshot()["gateway"]["sessions"]
        assert [s["shard"] for s in left] == [[0, 2]] and left[0]["connected"]
        await sessions[0].ws.close()


async def test_discord_py_sees_4010_and_4011_as_a_closed_connection(guard: ErrorGuard) -> None:
    async with running_room(layout=many_guilds(3, max_guilds_per_session=2)) as room:
        with pytest.raises(discord.ConnectionClosed) as refused:
            async with running_bot(room.url, "local-cairn"):
                pass
        assert refused.value.code == 4011
        with pytest.raises(discord.ConnectionClosed) as invalid:
            async with running_bot(room.url, "local-cairn", bot_class=QuickShardedBot, shard_count=2, shard_ids=[2]):
                pass
        assert invalid.value.code == 4010


@pytest.mark.parametrize(
    ("sharding", "message"),
    [
        ({"guilds_per_shard": 0}, "sharding.guilds_per_shard: must be a whole number, at least 1 (got 0)"),
        ({"max_guilds_per_session": "lots"}, "sharding.max_guilds_per_session: must be a whole number"),
        (
            {"per_shard": 3},
            "sharding.per_shard: unknown key (guilds_per_shard, max_guilds_per_session, max_concurrency)",
        ),
    ],
)
def test_layout_sharding_errors_name_the_key(sharding: dict[str, Any], message: str) -> None:
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_layout({"guilds": [{"name": "g", "channels": ["talk"]}], "sharding": sharding}, "room.yaml")
