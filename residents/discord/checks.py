"""One moderator check, one moderation scope and one error handler for every slash command.

RoboDanny's `checks` style: the moderation cog's `interaction_check` is `moderator_check`, and the
command tree's error handler is `on_app_command_error`, so no command repeats the rule or forgets
to answer. A moderator is a member with View Channel and Manage Messages (administrators have
both); what they may look up is the channels of the guild they ask in where they are a moderator,
channel overwrites counted (`moderation_scope`), and a record outside it answers exactly like one
that does not exist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import discord
from discord import app_commands

log = logging.getLogger(__name__)

REFUSAL = "This command needs the Manage Messages permission."
FAILED = "This command failed on the bot's side; the error is in its log."


class NotModerator(app_commands.CheckFailure):
    """The invoking member lacks View Channel or Manage Messages where the command was typed."""

    def __init__(self) -> None:
        super().__init__(REFUSAL)


def moderates(perms: discord.Permissions) -> bool:
    return perms.administrator or (perms.view_channel and perms.manage_messages)


async def moderator_check(interaction: discord.Interaction) -> bool:
    """Checked at run time, since a guild may override a command's default permissions."""
    if not moderates(interaction.permissions):
        raise NotModerator()
    return True


@dataclass(frozen=True)
class Scope:
    """The channels (by id, as the ledger records them) whose records the invoking moderator may see."""

    channels: tuple[discord.TextChannel, ...] = ()

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(str(c.id) for c in self.channels)

    def __contains__(self, channel_id: object) -> bool:
        return str(channel_id) in self.ids

    def channel(self, channel_id: str) -> discord.TextChannel | None:
        return next((c for c in self.channels if str(c.id) == channel_id), None)


def moderation_scope(interaction: discord.Interaction) -> Scope:
    """The invoking guild's text channels where the member has View Channel and Manage Messages."""
    guild, member = interaction.guild, interaction.user
    if guild is None or not isinstance(member, discord.Member):
        return Scope()
    return Scope(tuple(c for c in guild.text_channels if moderates(c.permissions_for(member))))


def witness_scope(interaction: discord.Interaction) -> Scope:
    """The invoking guild's text channels the member can see: the posts whose provenance they may check."""
    guild, member = interaction.guild, interaction.user
    if guild is None or not isinstance(member, discord.Member):
        return Scope()
    return Scope(tuple(c for c in guild.text_channels if c.permissions_for(member).view_channel))


async def on_app_command_error(interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
    """The command tree's one error handler: every failed invocation is answered (ephemerally), and a
    failure inside a command is logged once, with its traceback."""
    name = interaction.command.qualified_name if interaction.command else "?"
    if isinstance(error, app_commands.CheckFailure):
        text = str(error) or REFUSAL
        log.info("/%s refused for %s: %s", name, interaction.user, text)
    else:
        text = FAILED
        cause = error.original if isinstance(error, app_commands.CommandInvokeError) else error
        log.error("/%s failed for %s in channel %s", name, interaction.user, interaction.channel_id, exc_info=cause)
    try:
        if interaction.response.is_done():
            await interaction.followup.send(text, ephemeral=True)
        else:
            await interaction.response.send_message(text, ephemeral=True)
    except Exception as e:  # the interaction expired or Discord is unreachable: nothing more to do
        log.warning("/%s: the error answer could not be sent: %r", name, e)
