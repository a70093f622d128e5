"""The local room built from a layout: several guilds, roles, members and channel overwrites, as the real
discord.py client sees them over real sockets; `guild/channel` names in the /_room/ API; `residents room
--layout` and its one-line errors; `guild/channel` in a residence's `discord.channels`."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import discord
import pytest
from discord.ext import commands

try:
    from roomkit import ErrorGuard, error_guard, eventually, running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import ErrorGuard, error_guard, eventually, running_bot, running_room

from residents.cli import main as cli_main
from residents.localservers.room import LayoutError, RoomServer, load_layout
from residents.localservers.room.layout import BUNDLED, parse_layout

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = BUNDLED / "two-guilds.yaml"


@pytest.fixture
async def guard() -> AsyncIterator[ErrorGuard]:
    async with error_guard() as g:
        yield g


@pytest.fixture
async def room(guard: ErrorGuard) -> AsyncIterator[RoomServer]:
    async with running_room(layout=load_layout(EXAMPLE)) as server:
        yield server


async def test_a_bot_sees_both_guilds_with_roles_members_and_overwrites(room: RoomServer) -> None:
    seen: list[discord.Interaction] = []

    def setup(bot: commands.Bot) -> None:
        @bot.tree.command(name="whoami", description="Permissions as the bot is told")
        async def whoami(interaction: discord.Interaction) -> None:
            seen.append(interaction)
            await interaction.response.send_message("ok", ephemeral=True)

    async with running_bot(room.url, "local-cairn", setup=setup) as bot:
        assert sorted(g.name for g in bot.guilds) == ["elsewhere", "harbour"]
        harbour = discord.utils.get(bot.guilds, name="harbour")
        elsewhere = discord.utils.get(bot.guilds, name="elsewhere")
        assert harbour is not None and elsewhere is not None
        assert [c.name for c in harbour.text_channels] == ["yard", "dock"]
        assert [c.name for c in elsewhere.text_channels] == ["yard"]
        mo, alice = harbour.get_member_named("mo"), harbour.get_member_named("alice")
        assert mo is not None and alice is not None and [r.name for r in mo.roles] == ["@everyone", "mods"]
        yard, dock = harbour.text_channels
        # discord.py's own permission arithmetic over the room's roles and overwrites
        assert yard.permissions_for(mo).manage_messages and yard.permissions_for(mo).view_channel
        assert not dock.permissions_for(mo).view_channel and not dock.permissions_for(mo).manage_messages
        assert dock.permissions_for(alice).view_channel and not dock.permissions_for(alice).manage_messages
        eve = elsewhere.get_member_named("eve")
        assert eve is not None and elsewhere.text_channels[0].permissions_for(eve).administrator
        assert harbour.get_member_named("eve") is None  # eve is not in harbour

        for guild in (harbour, elsewhere):  # as on_ready of a resident does: every guild gets the commands
            bot.tree.copy_global_to(guild=guild)
            await bot.tree.sync(guild=guild)
        await room.invoke_command("harbour/yard", "mo", "whoami")
        await room.invoke_command("elsewhere/yard", "eve", "whoami")
        told_mo, told_eve = seen
        assert told_mo.guild is harbour and told_mo.permissions.manage_messages
        assert told_eve.guild is elsewhere and told_eve.permissions.administrator
        with pytest.raises(Exception, match="cannot see harbour/dock"):
            await room.invoke_command("harbour/dock", "mo", "whoami")

        # a message in a channel reaches the bot with its guild
        room.post("elsewhere/yard", "eve", "hello @cairn")
        got = await eventually(lambda: next((m for m in bot.cached_messages if m.author.name == "eve"), None))
        assert got.guild is elsewhere and got.channel.name == "yard"


async def test_room_api_names_channels_by_guild_and_refuses_ambiguous_names(room: RoomServer) -> None:
    async with aiohttp.ClientSession() as http:
        base = f"{room.url}/_room"
        async with http.post(f"{base}/channels/yard/messages", json={"author": "alice", "content": "hi"}) as resp:
            body = await resp.json()
            assert resp.status == 400 and "harbour" in body["message"] and "elsewhere" in body["message"]
        async with http.get(f"{base}/channels/yard/messages") as resp:
            assert resp.status == 400 and "harbour and elsewhere" in (await resp.json())["message"]
        for ref in ("harbour/yard", "harbour%2Fyard"):
            async with http.post(f"{base}/channels/{ref}/messages", json={"author": "alice", "content": ref}) as resp:
                assert resp.status == 201, await resp.text()
                assert (await resp.json())["guild"] == "harbour"
        async with http.post(f"{base}/channels/dock/messages", json={"author": "alice", "content": "bare"}) as resp:
            assert resp.status == 201 and (await resp.json())["channel"] == "dock"  # unambiguous: fine bare
        async with http.get(f"{base}/channels/harbour/yard/messages") as resp:
            assert [m["content"] for m in await resp.json()] == ["harbour/yard", "harbour%2Fyard"]
        async with http.get(f"{base}/channels/elsewhere/yard/messages") as resp:
            assert await resp.json() == []
        # a member by name: their roles decide; mo's role is denied dock by an overwrite
        async with http.get(f"{base}/channels/harbour/dock/messages?member=mo") as resp:
            assert resp.status == 403 and "mo cannot see harbour/dock" in (await resp.json())["message"]
        async with http.get(f"{base}/channels/harbour/dock/messages?member=alice") as resp:
            assert [m["content"] for m in await resp.json()] == ["bare"]
        async with http.post(f"{base}/channels/harbour/dock/messages", json={"author": "mo", "content": "x"}) as resp:
            assert resp.status == 403
        body = {"channel": "yard", "member": "mo", "name": "stumps"}
        async with http.post(f"{base}/commands", json=body) as resp:
            assert resp.status == 400 and "harbour and elsewhere" in (await resp.json())["message"]
        # the default room's moderator shortcut does not override a layout's roles
        async with http.post(
            f"{base}/channels/harbour/yard/messages", json={"author": "alice", "content": "x", "moderator": True}
        ) as resp:
            assert resp.status == 400 and "no 'moderator' role" in (await resp.json())["message"]
        async with http.get(f"{base}/state") as resp:
            state = await resp.json()
        assert [(g["name"], [c["ref"] for c in g["channels"]]) for g in state["guilds"]] == [
            ("harbour", ["harbour/yard", "harbour/dock"]),
            ("elsewhere", ["elsewhere/yard"]),
        ]
        people = {p["name"]: p["guilds"] for p in state["people"]}
        assert people["mo"] == {"harbour": ["mods"]} and people["eve"] == {"elsewhere": ["admins"]}


BAD_LAYOUTS = [
    ("guilds: []\n", "guilds: required"),
    ("guild: []\n", ": guild: unknown key"),
    ("guilds:\n  - name: harbour\n", "guilds[0].channels: required"),
    ("guilds:\n  - name: a/b\n    channels: [x]\n", "guilds[0].name:"),
    ("guilds:\n  - name: h\n    channels: [x, x]\n", "guilds[0].channels[1]: a second channel named 'x'"),
    (
        "guilds:\n  - name: h\n    channels: [x]\n    roles: {mods: [manage_messagez]}\n",
        ":4: guilds[0].roles.mods[0]: unknown permission 'manage_messagez'",
    ),
    (
        "guilds:\n  - name: h\n    channels: [x]\n    members: {mo: [mods]}\n",
        ":4: guilds[0].members.mo[0]: no role 'mods'",
    ),
    (
        "guilds:\n  - name: h\n    channels: [x]\n    overwrites: {dock: {}}\n",
        "guilds[0].overwrites.dock: no channel 'dock'",
    ),
    (
        "guilds:\n  - name: h\n    channels: [x]\n    overwrites: {x: {ghost: {deny: [view_channel]}}}\n",
        "guilds[0].overwrites.x.ghost: no role or member 'ghost'",
    ),
    ("guilds:\n  - name: h\n    channels: [x]\n  - name: h\n    channels: [y]\n", ":4: guilds[1].name: a second guild"),
    ("guilds:\n  - name: h\n    channels: [x]\n    colour: red\n", "guilds[0].colour: unknown key"),
    ("guilds: [\n", "invalid YAML"),
]


@pytest.mark.parametrize("text,expected", BAD_LAYOUTS)
def test_bad_layouts_are_one_line_naming_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "layout.yaml"
    path.write_text(text)
    with pytest.raises(LayoutError) as info:
        load_layout(path)
    line = str(info.value)
    assert "\n" not in line and line.startswith(str(path)) and expected in line, line


def test_the_example_layout_is_the_one_in_the_issue() -> None:
    layout = load_layout(EXAMPLE)
    assert load_layout("two-guilds").guilds == layout.guilds  # bundled layouts by name too
    harbour, elsewhere = layout.guilds
    assert (harbour.name, harbour.channels, harbour.roles, harbour.members) == (
        "harbour",
        ("yard", "dock"),
        {"mods": ("manage_messages",)},
        {"alice": (), "mo": ("mods",)},
    )
    assert [(o.target, o.deny) for o in harbour.overwrites["dock"]] == [("mods", ("view_channel",))]
    assert (
        parse_layout(
            {
                "guilds": [
                    {"name": "g", "channels": ["c"], "overwrites": {"c": {"@everyone": {"deny": ["send_messages"]}}}}
                ]
            }
        )
        .guilds[0]
        .overwrites["c"][0]
        .target
        == "@everyone"
    )


def residents_exe() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "residents"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "residents"]


async def test_residents_room_layout_serves_the_guilds(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *residents_exe(),
        "room",
        "--layout",
        str(EXAMPLE),
        "--port",
        "0",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        assert "harbour: yard, dock; elsewhere: yard" in line, line
        url = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert url is not None
        async with aiohttp.ClientSession() as http, http.get(f"{url.group(0)}/_room/state") as resp:
            state: dict[str, Any] = await resp.json()
        assert [g["name"] for g in state["guilds"]] == ["harbour", "elsewhere"]
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=15)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()[-2000:]


def test_residents_room_rejects_a_bad_layout_with_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("guilds:\n  - name: harbour\n    channels: [yard]\n    members: {mo: [mods]}\n")
    assert cli_main(["room", "--layout", str(bad)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [f"residents: {bad}:4: guilds[0].members.mo[0]: no role 'mods' in guild harbour"]
    assert cli_main(["room", "--layout", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err.strip() == f"residents: {tmp_path / 'missing.yaml'}: file not found"


def test_residence_channels_accept_guild_slash_channel_and_nothing_odder(tmp_path: Path, capsys, monkeypatch) -> None:
    folder = tmp_path / "residences"
    folder.mkdir()
    good = folder / "cairn.yaml"
    good.write_text(
        "name: cairn\nmodel: claude-sonnet-5\nmax_tokens: 1024\n"
        "discord:\n  token_env: T\n  channels: [harbour/yard, dock, '123']\n"
    )
    bad = folder / "sill.yaml"
    bad.write_text(
        "name: sill\nmodel: claude-sonnet-5\nmax_tokens: 1024\n"
        "discord:\n  token_env: T\n  channels: [harbour/yard/deep]\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli_main(["check", str(good)]) == 0
    capsys.readouterr()
    assert cli_main(["check", str(bad)]) == 2
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "sill.yaml" in ln]
    assert (
        line.startswith(f"{bad}:6: discord.channels[0]: ") and "guild/channel" in line and "harbour/yard/deep" in line
    )
