"""The local room server, driven by the real discord.py client over real sockets."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import discord
import pytest
from discord import app_commands
from discord.ext import commands

try:
    from roomkit import ErrorGuard, error_guard, eventually, running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import ErrorGuard, error_guard, eventually, running_bot, running_room

from residents.localservers.room import RoomServer, bot_name_for_token


@pytest.fixture
async def guard() -> AsyncIterator[ErrorGuard]:
    async with error_guard() as g:
        yield g


@pytest.fixture
async def room(guard: ErrorGuard) -> AsyncIterator[RoomServer]:
    async with running_room(["general", "random"], guild_name="testroom") as server:
        yield server


def recorder(seen: list[discord.Message]):
    def setup(bot: commands.Bot) -> None:
        async def on_message(message: discord.Message) -> None:
            seen.append(message)

        bot.add_listener(on_message)

    return setup


def channel_of(bot: commands.Bot, room: RoomServer, name: str = "general") -> discord.TextChannel:
    channel = bot.get_channel(int(room.channel_id(name)))
    assert isinstance(channel, discord.TextChannel)
    return channel


def test_token_names() -> None:
    assert bot_name_for_token("local-cairn") == "cairn"
    assert bot_name_for_token("local-Sill") == "sill"
    odd = bot_name_for_token("MTA.xyz/+==")
    assert odd.startswith("bot-") and odd == bot_name_for_token("MTA.xyz/+==")


async def test_bot_logs_in_and_sees_guild(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        assert bot.user is not None and bot.user.name == "cairn" and bot.user.bot
        assert bot.application_id == bot.user.id
        [guild] = bot.guilds
        assert guild.name == "testroom" and str(guild.id) == room.guild_id
        assert [c.name for c in guild.text_channels] == ["general", "random"]
        assert guild.chunked and guild.me is not None
        assert guild.me.guild_permissions.send_messages
        fetched = await bot.fetch_channel(int(room.channel_id("random")))
        assert fetched.name == "random"
        state = room.snapshot()
        assert [b["name"] for b in state["bots"]] == ["cairn"] and state["bots"][0]["connected"]


async def test_person_message_reaches_on_message(room: RoomServer) -> None:
    seen: list[discord.Message] = []
    async with running_bot(room.url, "local-cairn", setup=recorder(seen)) as bot:
        room.post("general", "alice", "hello @cairn, how are you?")
        msg = await eventually(lambda: next((m for m in seen if m.author.name == "alice"), None))
        assert msg.content == f"hello <@{bot.user.id}>, how are you?"
        assert not msg.author.bot and isinstance(msg.author, discord.Member)
        assert bot.user in msg.mentions
        assert msg.channel.name == "general" and msg.guild is not None

        first = room.messages()[0]
        room.post("general", "bob", "agreed", reply_to=first["id"])
        reply = await eventually(lambda: next((m for m in seen if m.author.name == "bob"), None))
        assert reply.reference is not None and reply.reference.message_id == int(first["id"])
        assert isinstance(reply.reference.resolved, discord.Message)
        assert reply.reference.resolved.content == msg.content
        assert reply.type is discord.MessageType.reply
        assert [u.name for u in reply.mentions] == ["alice"]  # replies ping the replied-to author


async def test_bot_send_shows_in_room_in_order(room: RoomServer) -> None:
    seen: list[discord.Message] = []
    async with running_bot(room.url, "local-cairn", setup=recorder(seen)) as bot:
        channel = channel_of(bot, room)
        room.post("general", "alice", "first")
        sent = [await channel.send(f"reply {i}") for i in range(3)]
        await eventually(lambda: len(seen) == 4)  # Discord echoes the bot's own messages
        views = room.messages("general")
        assert [(v["author"], v["content"]) for v in views] == [
            ("alice", "first"),
            ("cairn", "reply 0"),
            ("cairn", "reply 1"),
            ("cairn", "reply 2"),
        ]
        assert all(v["bot"] for v in views[1:]) and [v["id"] for v in views[1:]] == [str(m.id) for m in sent]

        history = [m async for m in channel.history(limit=2)]
        assert [m.content for m in history] == ["reply 2", "reply 1"]
        oldest = [m async for m in channel.history(limit=10, oldest_first=True)]
        assert [m.content for m in oldest] == ["first", "reply 0", "reply 1", "reply 2"]
        fetched = await channel.fetch_message(sent[0].id)
        assert fetched.content == "reply 0" and fetched.author == bot.user

        edited = await sent[1].edit(content="reply 1 (edited)")
        assert edited.edited_at is not None
        await sent[2].delete()
        views = room.messages("general")
        assert [v["content"] for v in views][-2:] == ["reply 0", "reply 1 (edited)"]

        with pytest.raises(discord.NotFound) as info:
            await channel.fetch_message(sent[2].id)
        assert info.value.code == 10008


async def test_file_upload(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        sent = await channel_of(bot, room).send("see file", file=discord.File(io.BytesIO(b"abc"), "notes.txt"))
        [att] = sent.attachments
        assert att.filename == "notes.txt" and att.size == 3
        assert await att.read() == b"abc"
        assert room.messages()[0]["attachments"][0]["filename"] == "notes.txt"


async def test_discord_limits(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        channel = channel_of(bot, room)
        with pytest.raises(discord.HTTPException) as info:
            await channel.send("x" * 2001)
        assert info.value.status == 400 and info.value.code == 50035
        assert "2000" in info.value.text
        with pytest.raises(discord.HTTPException) as info:
            await channel.send(embed=discord.Embed())
        assert info.value.code == 50006
        with pytest.raises(discord.HTTPException) as info:
            await channel.send(embed=discord.Embed(description="d" * 4097))
        assert info.value.code == 50035
        await channel.send("x" * 2000)
        with pytest.raises(discord.NotFound) as nf:
            await bot.http.send_message(123, params=discord.http.handle_message_parameters(content="hi"))
        assert nf.value.code == 10003
        assert [len(v["content"]) for v in room.messages()] == [2000]


async def test_allowed_mentions(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        channel = channel_of(bot, room)
        room.post("general", "alice", "hi")
        alice = room.state.person("alice")
        await channel.send(f"@everyone look <@{alice.id}>", allowed_mentions=discord.AllowedMentions.none())
        await channel.send(f"@everyone look <@{alice.id}>")
        await channel.send(f"just <@{alice.id}>", allowed_mentions=discord.AllowedMentions(everyone=False, users=False))
        quiet, loud, none = room.messages()[1:]
        assert quiet["allowed_mentions"] == {"parse": []}
        assert quiet["pings"] == {"users": [], "user_ids": [], "roles": [], "everyone": False}
        assert loud["allowed_mentions"] is None
        assert loud["pings"]["everyone"] is True and loud["pings"]["users"] == ["alice"]
        assert none["pings"]["users"] == []
        # a person without MENTION_EVERYONE can't ping everyone; a moderator can
        assert room.post("general", "bob", "@everyone hey")["pings"]["everyone"] is False
        assert room.post("general", "mod", "@everyone hey", moderator=True)["pings"]["everyone"] is True


async def test_two_bots_are_distinct_and_see_each_other(room: RoomServer) -> None:
    seen_c: list[discord.Message] = []
    seen_s: list[discord.Message] = []
    async with (
        running_bot(room.url, "local-cairn", setup=recorder(seen_c)) as cairn,
        running_bot(room.url, "local-sill", setup=recorder(seen_s)) as sill,
    ):
        assert cairn.user.id != sill.user.id and cairn.application_id != sill.application_id
        assert (cairn.user.name, sill.user.name) == ("cairn", "sill")
        sent = await channel_of(cairn, room).send("hello sill")
        got = await eventually(lambda: next((m for m in seen_s if m.id == sent.id), None))
        assert got.author.id == cairn.user.id and got.author.bot
        await channel_of(sill, room).send(f"hi <@{cairn.user.id}>", reference=got)
        back = await eventually(lambda: next((m for m in seen_c if m.author.id == sill.user.id), None))
        assert back.reference is not None and back.reference.message_id == sent.id
        assert cairn.user in back.mentions
        assert sorted(b["name"] for b in room.snapshot()["bots"]) == ["cairn", "sill"]


async def test_message_content_intent(room: RoomServer) -> None:
    seen: list[discord.Message] = []
    intents = discord.Intents.default()  # no message_content
    async with running_bot(room.url, "local-sill", setup=recorder(seen), intents=intents) as bot:
        room.post("general", "alice", "secret")
        room.post("general", "alice", "@sill hello")
        await eventually(lambda: len(seen) == 2)
        assert [m.content for m in seen] == ["", f"<@{bot.user.id}> hello"]


def slash_setup(calls: list[dict[str, Any]]):
    def setup(bot: commands.Bot) -> None:
        @bot.tree.command(name="stumps", description="List open stumps")
        async def stumps(interaction: discord.Interaction) -> None:
            perms = interaction.user.guild_permissions
            calls.append(
                {
                    "user": interaction.user.name,
                    "manage_messages": perms.manage_messages,
                    "interaction_perms": interaction.permissions.manage_messages,
                }
            )
            if perms.manage_messages:
                await interaction.response.send_message(
                    "3 open stumps", ephemeral=True, embed=discord.Embed(title="stumps")
                )
            else:
                await interaction.response.send_message("moderators only", ephemeral=True)

        @bot.tree.command(name="slow", description="Answer after deferring")
        async def slow(interaction: discord.Interaction) -> None:
            await interaction.response.defer(thinking=True)
            await asyncio.sleep(0.05)
            await interaction.followup.send("first part")
            await interaction.followup.send("second part")

        ledger = app_commands.Group(name="ledger", description="Ledger commands")

        @ledger.command(name="show", description="Show a ledger entry")
        async def show(interaction: discord.Interaction, entry: int, who: discord.Member | None = None) -> None:
            calls.append({"entry": entry, "who": who.name if who else None})
            await interaction.response.send_message(f"entry {entry}")
            await interaction.edit_original_response(content=f"entry {entry} (edited)")

        bot.tree.add_command(ledger)

    return setup


async def test_slash_command_moderator_and_not(room: RoomServer) -> None:
    calls: list[dict[str, Any]] = []
    async with running_bot(room.url, "local-cairn", setup=slash_setup(calls), sync_commands=True):
        general = room.channel_id()
        mod = await room.invoke_command(general, "bob", "stumps", bot="cairn", moderator=True)
        assert not mod["timed_out"]
        [resp] = mod["responses"]
        assert resp["kind"] == "callback" and resp["type"] == 4 and resp["ephemeral"] is True
        assert resp["content"] == "3 open stumps" and resp["embeds"][0]["title"] == "stumps"
        plain = await room.invoke_command(general, "carol", "stumps", moderator=False)
        assert [r["content"] for r in plain["responses"]] == ["moderators only"]
        assert calls == [
            {"user": "bob", "manage_messages": True, "interaction_perms": True},
            {"user": "carol", "manage_messages": False, "interaction_perms": False},
        ]
        assert room.messages() == []  # ephemeral answers are not channel messages

        calls.clear()
        nested = [
            {"name": "show", "type": 1, "options": [{"name": "entry", "value": 7}, {"name": "who", "value": "bob"}]}
        ]
        out = await room.invoke_command("general", "bob", "ledger", options=nested)
        assert calls == [{"entry": 7, "who": "bob"}]
        assert [(r["kind"], r["content"], r["ephemeral"]) for r in out["responses"]] == [
            ("callback", "entry 7", False),
            ("edit", "entry 7 (edited)", False),
        ]
        [view] = room.messages()
        assert view["content"] == "entry 7 (edited)" and view["interaction"]["user"] == "bob"


async def test_deferred_then_followups(room: RoomServer) -> None:
    seen: list[discord.Message] = []
    calls: list[dict[str, Any]] = []

    def setup(bot: commands.Bot) -> None:
        slash_setup(calls)(bot)
        recorder(seen)(bot)

    async with running_bot(room.url, "local-cairn", setup=setup, sync_commands=True):
        out = await room.invoke_command("general", "alice", "slow")
        kinds = [(r["kind"], r["type"], r["content"]) for r in out["responses"]]
        assert kinds == [("callback", 5, ""), ("followup", None, "first part"), ("followup", None, "second part")]
        # the first follow-up replaces the "thinking" message, as on Discord
        assert out["responses"][0]["message_id"] == out["responses"][1]["message_id"]
        assert [v["content"] for v in room.messages()] == ["first part", "second part"]
        await eventually(lambda: len(seen) == 2)  # the thinking message and the second follow-up


async def test_429_is_retried_and_message_arrives_once(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        room.fail_message_posts(429, retry_after=0.05)
        sent = await asyncio.wait_for(channel_of(bot, room).send("once"), timeout=5)
        assert room.faults.hits == 1
        assert [v["id"] for v in room.messages()] == [str(sent.id)]


async def test_lost_500_response_is_deduplicated_by_nonce(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        room.fail_message_posts(500, after_create=True)  # discord.py retries after 1 s
        sent = await asyncio.wait_for(channel_of(bot, room).send("exactly once"), timeout=5)
        assert room.faults.hits == 1
        assert [v["id"] for v in room.messages()] == [str(sent.id)]


async def test_gateway_drop_resumes_and_delivers_missed_events(room: RoomServer) -> None:
    seen: list[discord.Message] = []
    readies: list[str] = []
    resumed = asyncio.Event()

    def setup(bot: commands.Bot) -> None:
        recorder(seen)(bot)

        async def on_ready() -> None:
            readies.append("ready")

        async def on_resumed() -> None:
            resumed.set()

        bot.add_listener(on_ready)
        bot.add_listener(on_resumed)

    async with running_bot(room.url, "local-cairn", setup=setup) as bot:
        room.post("general", "alice", "before")
        await eventually(lambda: len(seen) == 1)
        assert await room.drop_gateway(hold=True) == 1
        room.post("general", "alice", "missed 1")
        room.post("general", "alice", "missed 2")
        room.release_gateway()
        await asyncio.wait_for(resumed.wait(), timeout=5)
        await eventually(lambda: len(seen) == 3)
        assert [m.content for m in seen] == ["before", "missed 1", "missed 2"]
        assert room.resumes == 1 and readies == ["ready"]
        await channel_of(bot, room).send("still here")
        await eventually(lambda: len(seen) == 4)


async def test_room_json_api(room: RoomServer) -> None:
    calls: list[dict[str, Any]] = []
    async with (
        running_bot(room.url, "local-cairn", setup=slash_setup(calls), sync_commands=True) as bot,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(f"{room.url}/_room/state") as resp:
            state = await resp.json()
        assert state["guild"]["name"] == "testroom"
        assert [c["name"] for c in state["channels"]] == ["general", "random"]
        assert state["bots"][0]["commands"] == ["ledger", "slow", "stumps"]
        general = state["channels"][0]["id"]

        async with http.get(f"{room.url}/_room/events") as events:
            async with http.post(
                f"{room.url}/_room/channels/{general}/messages",
                json={"author": "alice", "content": "hi", "mentions": ["cairn"]},
            ) as resp:
                assert resp.status == 201
                posted = await resp.json()
            kinds = []
            while "message_create" not in kinds:
                line = (await asyncio.wait_for(events.content.readline(), timeout=5)).decode()
                if line.startswith("data:"):
                    event = json.loads(line[len("data:") :])
                    kinds.append(event["type"])
            assert kinds == ["member_add", "message_create"]  # alice joined, then posted
            assert event["message"]["id"] == posted["id"] and event["message"]["author"] == "alice"
        assert posted["content"] == f"<@{bot.user.id}> hi" and posted["pings"]["users"] == ["cairn"]

        async with http.get(f"{room.url}/_room/channels/general/messages") as resp:
            assert [m["content"] for m in await resp.json()] == [posted["content"]]
        async with http.post(
            f"{room.url}/_room/channels/general/messages", json={"author": "alice", "content": "y" * 2001}
        ) as resp:
            assert resp.status == 400 and (await resp.json())["code"] == 50035
        async with http.get(f"{room.url}/_room/channels/nowhere/messages") as resp:
            assert resp.status == 404 and (await resp.json())["code"] == 10003

        body = {"channel_id": general, "member": "bob", "moderator": True, "bot": "cairn", "name": "stumps"}
        async with http.post(f"{room.url}/_room/commands", json=body) as resp:
            out = await resp.json()
        assert out["responses"][0]["ephemeral"] is True and out["responses"][0]["content"] == "3 open stumps"

        async with http.post(f"{room.url}/_room/faults", json={"message_post": {"status": 429}}) as resp:
            assert (await resp.json())["message_post"][0]["status"] == 429
        await channel_of(bot, room).send("after a 429")
        assert room.faults.hits == 1

        async with http.get(f"{room.url}/api/v10/gateway") as resp:
            assert resp.headers["Content-Type"] == "application/json"
            assert (await resp.json())["url"] == f"{room.url.replace('http', 'ws')}/gateway/"
        async with http.get(f"{room.url}/api/v10/users/@me") as resp:
            assert resp.status == 401


async def test_typing_reaches_other_bots(room: RoomServer) -> None:
    typing: list[str] = []

    def setup(bot: commands.Bot) -> None:
        async def on_typing(channel: Any, user: Any, when: Any) -> None:
            typing.append(user.name)

        bot.add_listener(on_typing)

    async with running_bot(room.url, "local-sill", setup=setup), running_bot(room.url, "local-cairn") as cairn:
        await channel_of(cairn, room).typing()
        await eventually(lambda: typing == ["cairn"])


async def test_guard_fails_on_swallowed_errors() -> None:
    # A private logger, so the project-wide autouse guard in conftest doesn't see the staged error.
    selftest = logging.getLogger("roomkit.selftest")
    with pytest.raises(AssertionError, match="handler bug"):
        async with error_guard(loggers=("roomkit.selftest",)):

            async def handler() -> None:
                try:
                    raise RuntimeError("handler bug")
                except RuntimeError:
                    selftest.exception("Ignoring exception in on_message")  # what discord.client does

            await asyncio.create_task(handler())

    with pytest.raises(AssertionError, match="never retrieved"):
        async with error_guard(loggers=()):

            async def boom() -> None:
                raise ValueError("lost")

            task = asyncio.get_running_loop().create_task(boom())
            await asyncio.sleep(0.01)
            del task
