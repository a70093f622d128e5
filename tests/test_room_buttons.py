"""Message components in the local room, driven by the real discord.py client over real sockets: a bot's
message carries buttons (validated as Discord does), a person presses one, the bot gets a MESSAGE_COMPONENT
interaction over the gateway and answers it in each of Discord's ways (4, 5, 6, 7)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest

try:
    from roomkit import ErrorGuard, error_guard, running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import ErrorGuard, error_guard, running_bot, running_room

from residents.localservers.room import RoomServer
from residents.localservers.room.model import ApiError


@pytest.fixture
async def guard() -> AsyncIterator[ErrorGuard]:
    async with error_guard() as g:
        yield g


@pytest.fixture
async def room(guard: ErrorGuard) -> AsyncIterator[RoomServer]:
    async with running_room(["general"], guild_name="testroom") as server:
        yield server


class Answering(discord.ui.View):
    """Four buttons, one per way of answering a press; what each press saw is kept in `seen`."""

    def __init__(self, seen: list[dict[str, Any]]) -> None:
        super().__init__(timeout=None)
        self.seen = seen

    def _saw(self, interaction: discord.Interaction) -> None:
        assert interaction.message is not None
        self.seen.append(
            {
                "type": interaction.type,
                "user": interaction.user.name,
                "custom_id": (interaction.data or {}).get("custom_id"),
                "message": interaction.message.id,
                "manage_messages": interaction.permissions.manage_messages,
            }
        )

    @discord.ui.button(label="Say", custom_id="say", style=discord.ButtonStyle.primary)
    async def say(self, interaction: discord.Interaction, _button: discord.ui.Button) -> None:
        self._saw(interaction)
        await interaction.response.send_message("only you see this", ephemeral=True)

    @discord.ui.button(label="Think", custom_id="think")
    async def think(self, interaction: discord.Interaction, _button: discord.ui.Button) -> None:
        self._saw(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)
        await interaction.followup.send("thought about it", ephemeral=True)

    @discord.ui.button(label="Quiet", custom_id="quiet")
    async def quiet(self, interaction: discord.Interaction, _button: discord.ui.Button) -> None:
        self._saw(interaction)
        await interaction.response.defer()  # type 6: acknowledged, nothing shown
        await interaction.edit_original_response(content="edited after a quiet press", view=None)

    @discord.ui.button(label="Update", custom_id="update")
    async def update(self, interaction: discord.Interaction, _button: discord.ui.Button) -> None:
        self._saw(interaction)
        await interaction.response.edit_message(content="updated", view=None)  # type 7


async def test_a_pressed_button_reaches_its_bot_and_each_answer_type_works(room: RoomServer) -> None:
    seen: list[dict[str, Any]] = []
    async with running_bot(room.url, "local-cairn") as bot:
        channel = bot.get_channel(int(room.channel_id()))
        assert isinstance(channel, discord.TextChannel)
        sent = await channel.send("choose", view=Answering(seen))
        [view] = room.messages()
        assert [b["custom_id"] for row in view["components"] for b in row["components"]] == [
            "say",
            "think",
            "quiet",
            "update",
        ]
        mid = str(sent.id)

        out = await room.press_button("general", "alice", mid, "say")
        assert [(r["kind"], r["type"], r["ephemeral"], r["content"]) for r in out["responses"]] == [
            ("callback", 4, True, "only you see this")
        ]
        out = await room.press_button("general", "alice", mid, "think")
        assert [(r["kind"], r["type"], r["content"]) for r in out["responses"]] == [
            ("callback", 5, ""),
            ("followup", None, "thought about it"),
        ]
        assert all(r["ephemeral"] for r in out["responses"])
        assert [m["content"] for m in room.messages()] == ["choose"]  # ephemeral answers are not channel messages
        assert seen[0] == {
            "type": discord.InteractionType.component,
            "user": "alice",
            "custom_id": "say",
            "message": sent.id,
            "manage_messages": False,
        }

        out = await room.press_button("general", "mo", mid, "quiet", settle=0.1)
        assert [(r["kind"], r["type"], r["content"]) for r in out["responses"]] == [
            ("callback", 6, None),
            ("edit", None, "edited after a quiet press"),
        ]
        [view] = room.messages()
        assert view["content"] == "edited after a quiet press" and view["components"] == []
        with pytest.raises(ApiError, match="no button with custom_id 'update'"):
            await room.press_button("general", "alice", mid, "update")

        second = await channel.send("again", view=Answering(seen))
        out = await room.press_button("general", "alice", str(second.id), "update")
        assert [(r["kind"], r["type"], r["content"]) for r in out["responses"]] == [("callback", 7, "updated")]
        assert [(m["content"], m["components"], m["edited_timestamp"] is not None) for m in room.messages()] == [
            ("edited after a quiet press", [], True),
            ("updated", [], True),
        ]
        assert [s["custom_id"] for s in seen] == ["say", "think", "quiet", "update"]


async def test_taking_a_button_away_alone_does_not_mark_the_message_edited(room: RoomServer) -> None:
    seen: list[dict[str, Any]] = []
    async with running_bot(room.url, "local-cairn") as bot:
        channel = bot.get_channel(int(room.channel_id()))
        assert isinstance(channel, discord.TextChannel)
        sent = await channel.send("-# a receipt", view=Answering(seen))
        await sent.edit(view=None)
        [view] = room.messages()
        assert (view["content"], view["components"], view["edited_timestamp"]) == ("-# a receipt", [], None)


BAD_COMPONENTS = [
    ([{"type": 2, "style": 1, "label": "x", "custom_id": "a"}], "action rows here"),  # a button outside a row
    ([{"type": 1, "components": []}], "between 1 and 5"),
    (
        [{"type": 1, "components": [{"type": 2, "style": 1, "label": "x", "custom_id": str(i)} for i in range(6)]}],
        "1 and 5",
    ),
    ([{"type": 1, "components": [{"type": 3, "custom_id": "s", "options": []}]}], "buttons only"),
    ([{"type": 1, "components": [{"type": 2, "style": 1, "label": "x"}]}], "custom_id"),
    ([{"type": 1, "components": [{"type": 2, "style": 1, "label": "x", "custom_id": "c" * 101}]}], "custom_id"),
    ([{"type": 1, "components": [{"type": 2, "style": 1, "label": "x" * 81, "custom_id": "a"}]}], "label"),
    ([{"type": 1, "components": [{"type": 2, "style": 9, "label": "x", "custom_id": "a"}]}], "style"),
    (
        [{"type": 1, "components": [{"type": 2, "style": 5, "label": "x", "custom_id": "a", "url": "https://x"}]}],
        "cannot have a custom id",
    ),
    (
        [{"type": 1, "components": [{"type": 2, "style": 1, "label": "x", "custom_id": "a", "url": "https://x"}]}],
        "cannot have a url",
    ),
    (
        [{"type": 1, "components": [{"type": 2, "style": 1, "label": "x", "custom_id": "a"}] * 2}],
        "custom id cannot be duplicated",
    ),
    (
        [{"type": 1, "components": [{"type": 2, "style": 1, "label": "x", "custom_id": str(i)}]} for i in range(6)],
        "5 or fewer",
    ),
]


@pytest.mark.parametrize(("components", "named"), BAD_COMPONENTS)
async def test_components_are_validated_as_discord_does(room: RoomServer, components: list, named: str) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        route = discord.http.Route("POST", "/channels/{channel_id}/messages", channel_id=int(room.channel_id()))
        with pytest.raises(discord.HTTPException) as info:
            await bot.http.request(route, json={"content": "x", "components": components})
        assert info.value.status == 400 and info.value.code == 50035
        assert named in info.value.text
        assert room.messages() == []


async def test_a_button_cannot_be_pressed_where_it_cannot_be(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        channel = bot.get_channel(int(room.channel_id()))
        assert isinstance(channel, discord.TextChannel)
        view = discord.ui.View(timeout=None)
        view.add_item(discord.ui.Button(label="off", custom_id="off", disabled=True))
        view.add_item(discord.ui.Button(label="docs", url="https://discord.com"))
        sent = await channel.send("buttons", view=view)
        with pytest.raises(ApiError, match="is disabled"):
            await room.press_button("general", "alice", str(sent.id), "off")
        with pytest.raises(ApiError, match="no button with custom_id 'missing'"):
            await room.press_button("general", "alice", str(sent.id), "missing")
        person = room.post("general", "alice", "no buttons here")
        with pytest.raises(ApiError, match="no button"):
            await room.press_button("general", "bob", person["id"], "off")
