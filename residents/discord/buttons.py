"""The Continue button on a cut output's receipt: pressing it is `/continue` for that generation.

Where the residence's standing is `on-request`, the receipt that says how a cut output now stands carries
one button, `Continue (n left)` (`truth.continue_label`; n by `generation.run.continuations_left`). Its
custom_id carries the generation and the number of segments the receipt shows
(`residents:continue:g-…:1`), so it works after a restart (a `DynamicItem`, registered by every bot in
`setup_hook`) and a press asks for one continuation *from there*: the second press of a double-click, or a
press on a receipt the output has since moved past, is declined to the presser alone.

Who may press is the policy's `continuation.button`: `moderators` (as for /continue), `asker` (moderators
and the person the reply answered) or `anyone` who sees the channel. A press that may not is answered
ephemerally with who may (`truth.press_refused`), and nothing else happens. An allowed press runs as
/continue does (same standing, guards and delivery), then the button is taken off its receipt: a new
receipt carries the next one while any continuation is left, and none is shown once nothing is.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Protocol

import discord

from .. import truth
from ..config import Residence
from ..generation.run import continuations_left
from ..ledger.access import tool_calls_of
from ..records import Generation, Post, PostKind, PostReason
from ..resident import Reply, Resident
from ..text import outbound
from .checks import FAILED, moderates
from .room import ROOM_ERRORS, SEND_TIMEOUT, DiscordRoom


class ResidentClient(Protocol):
    """What a press needs of the bot it reaches (`app.ResidentBot`, which imports this module)."""

    resident: Resident

    @property
    def residence(self) -> Residence: ...


log = logging.getLogger(__name__)

PREFIX = "residents:continue"
TEMPLATE = re.compile(rf"{PREFIX}:(?P<generation>[A-Za-z0-9_-]{{1,64}}):(?P<segments>[0-9]{{1,3}})")
# How long a /continue's or a press's answer waits for the continuation's posts to reach the room: an
# outbox held by earlier posts the room does not take yet must not keep the presser waiting (Discord lets
# a deferred interaction be answered for 15 minutes only); the posts still go out, in order, when it can.
CONTINUE_DELIVERY_WAIT = 5.0
# A receipt that carries the button: a cut output's boundary line, with or without text before it.
OFFERING_REASONS = frozenset({PostReason.RECEIPT, PostReason.NO_TEXT})


def custom_id(generation_id: str, segments: int) -> str:
    return f"{PREFIX}:{generation_id}:{segments}"


class ContinueButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=TEMPLATE):
    """`Continue (n left)` on generation `generation`'s receipt showing `segments` segments."""

    def __init__(self, generation: str, segments: int, left: int = 0) -> None:
        super().__init__(
            discord.ui.Button(
                label=truth.continue_label(left),
                style=discord.ButtonStyle.secondary,
                custom_id=custom_id(generation, segments),
            )
        )
        self.generation = generation
        self.segments = segments

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ContinueButton:
        return cls(match["generation"], int(match["segments"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        await press(interaction, self.generation, self.segments)


def continue_view(generation_id: str, segments: int, left: int) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    view.add_item(ContinueButton(generation_id, segments, left))
    return view


async def receipt_view(bot: ResidentClient, post: Post) -> discord.ui.View | None:
    """The Continue button for `post`, if it is the latest receipt of a generation its policy would still
    continue on request; else None. A failure to tell is logged, and the receipt goes without one."""
    if post.kind != PostKind.RECEIPT or post.reason not in OFFERING_REASONS or post.generation_id is None:
        return None
    try:
        ledger = bot.resident.ledger
        g = await ledger.get_generation(post.generation_id)
        if g is None or g.residence != bot.residence.name:
            return None
        if max(p.seq for p in g.posts if p.kind == PostKind.RECEIPT) != post.seq:
            return None  # an earlier receipt of an output continued since
        left = continuations_left(g, bot.residence)
        if not left or await tool_calls_of(ledger, g.id):
            return None
        return continue_view(g.id, len(g.segments), left)
    except Exception:  # the receipt itself must go out; only its button is lost
        log.error("%s: the Continue button of post %s could not be made", bot.residence.name, post.id, exc_info=True)
        return None


def continued(generation_id: str, reply: Reply) -> str:
    """The presser's or moderator's own answer once a continuation ran (or was declined)."""
    if reply.decline:
        return truth.not_continued(reply.decline)
    g = reply.generation
    assert g is not None
    return (
        f"Continued {generation_id}: now {g.status}, {len(g.segments)} segment(s), "
        f"continuation {g.continuation_ended}."
        + (
            f" {reply.waiting} post(s) of it wait for the room, behind earlier posts it has not taken yet;"
            " they go out in order."
            if reply.waiting
            else ""
        )
    )


def continue_channel(owner: Resident, bot: discord.Client, g: Generation, reachable: bool = True) -> str | DiscordRoom:
    """Where a moderator's /continue of `g` would post, as `owner`'s own bot; or the moderator's answer why it
    cannot run (a standing that does not continue on request, a channel out of reach)."""
    refused = truth.standing_refusal(owner.residence.policy.continuation.standing, g.residence, g.id)
    if refused:
        return truth.not_continued(refused)
    channel = bot.get_channel(int(g.channel)) if reachable and g.channel.isdigit() else None
    if channel is None:
        return unreachable(g)
    return DiscordRoom(channel)  # type: ignore[arg-type]


def unreachable(g: Generation) -> str:
    """The moderator's answer when the channel of `g` is out of this command's or its bot's reach."""
    return f"The channel of {g.id} is not reachable."


async def continue_in(owner: Resident, room: DiscordRoom, g: Generation, offered: int) -> str:
    """A moderator's /continue of `g`, run where its resident's bot runs: one segment under the standing, the
    Continue button taken off the receipt it continued from; the moderator's answer (`continued`). `offered`:
    the segments the moderator's command found, so a second /continue meanwhile (two moderators, a repeat) is
    declined as a second press of a button is: one ask, one continuation, in this process or carried."""
    shown = [p for p in g.posts if p.kind == PostKind.RECEIPT and p.message_id]  # the receipts before it
    reply = await owner.continue_generation(room, g.channel, g.id, within=CONTINUE_DELIVERY_WAIT, offered=offered)
    if not reply.decline and shown:  # the receipt it continued from keeps no Continue button
        latest = max(shown, key=lambda p: p.seq)
        assert latest.message_id is not None
        await take_button_away(room.channel, latest.message_id)
    return continued(g.id, reply)


async def take_button_away(channel: discord.abc.Messageable, message_id: str, *, known: bool = False) -> None:
    """Remove the Continue button from one of the bot's receipts (`known`: it is known to have one; else
    the message is read first, so a receipt without one is not edited). A failure is logged: a button
    left behind only gets a press declined, which takes it away again."""
    try:
        if not known:
            message = await asyncio.wait_for(channel.fetch_message(int(message_id)), timeout=SEND_TIMEOUT)
            if not message.components:
                return
        partial = discord.PartialMessage(channel=channel, id=int(message_id))  # type: ignore[arg-type]
        await asyncio.wait_for(partial.edit(view=None), timeout=SEND_TIMEOUT)
    except discord.NotFound:
        return
    except ROOM_ERRORS as e:
        log.warning(
            "the Continue button of message %s could not be taken away: %s: %s", message_id, type(e).__name__, e
        )


async def may_press(interaction: discord.Interaction, trigger: str | None, button: str) -> bool:
    """Whether the policy's `continuation.button` lets this member press: moderators always (as for
    /continue); under `asker` also the author of the message the reply answered; under `anyone`, anyone."""
    if button == "anyone" or moderates(interaction.permissions):
        return True
    if button != "asker" or trigger is None or not trigger.isdigit() or interaction.channel is None:
        return False
    channel = interaction.channel
    assert isinstance(channel, discord.abc.Messageable)
    try:
        asked = await asyncio.wait_for(channel.fetch_message(int(trigger)), timeout=SEND_TIMEOUT)
    except ROOM_ERRORS as e:  # deleted, or unreadable now: who asked cannot be shown
        log.info("the message %s a reply answered could not be read: %s: %s", trigger, type(e).__name__, e)
        return False
    return asked.author.id == interaction.user.id


async def say(interaction: discord.Interaction, text: str) -> None:
    await interaction.response.send_message(
        outbound(text)[0], ephemeral=True, allowed_mentions=discord.AllowedMentions.none()
    )


async def press(interaction: discord.Interaction, generation_id: str, offered: int) -> None:
    """A Continue press: /continue for `generation_id` from the receipt showing `offered` segments."""
    bot: ResidentClient = interaction.client  # type: ignore[assignment]
    resident = bot.resident
    g = await resident.ledger.get_generation(generation_id)
    channel = interaction.channel
    if g is None or g.residence != resident.name or channel is None or str(channel.id) != g.channel:
        await say(interaction, f"No generation {generation_id} of a resident here.")
        return
    assert isinstance(channel, discord.abc.Messageable)
    policy = resident.residence.policy.continuation
    if not await may_press(interaction, g.trigger, policy.button):
        log.info("Continue on %s refused for %s: the policy's button is for %s", g.id, interaction.user, policy.button)
        await say(interaction, truth.press_refused(policy.button, g.residence))
        return
    source = interaction.message
    refused = truth.standing_refusal(policy.standing, g.residence, g.id)
    if refused:  # the policy no longer continues on request: its button goes too
        await say(interaction, truth.not_continued(refused))
        if source is not None:
            await take_button_away(channel, str(source.id), known=True)
        return
    await interaction.response.defer(ephemeral=True, thinking=True)
    try:
        reply = await resident.continue_generation(
            DiscordRoom(channel), g.channel, g.id, within=CONTINUE_DELIVERY_WAIT, offered=offered
        )
    except Exception:  # answered, as a failed slash command is; the traceback goes to the log once
        log.error("Continue on %s failed for %s", g.id, interaction.user, exc_info=True)
        await interaction.followup.send(FAILED, ephemeral=True)
        return
    if source is not None:  # a new receipt carries the next button, if any continuation is left
        await take_button_away(channel, str(source.id), known=True)
    log.info("Continue on %s pressed by %s: %s", g.id, interaction.user, reply.declined or "continued")
    await interaction.followup.send(outbound(continued(g.id, reply))[0], ephemeral=True)
