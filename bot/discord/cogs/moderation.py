"""Moderators' slash commands: inspect stumps and provenance, show a policy, ask for a continuation.

Registered with `default_member_permissions` (Manage Messages) and checked again at run time, since
a guild can override the default. Replies are ephemeral; a stump's text is shown only where its
residence's policy lets moderators read stumps, and never reaches the room from here.
"""
from __future__ import annotations

import logging
import re

import discord
import yaml
from discord import app_commands
from discord.ext import commands

from ...delivery import split_text
from ...ledger import views
from ..app import ResidentBot
from ..room import DiscordRoom

log = logging.getLogger(__name__)

LINK = re.compile(r"/channels/(?:\d+|@me)/\d+/(\d+)")
PAGE = 1900


def can_moderate(interaction: discord.Interaction) -> bool:
    perms = interaction.permissions
    return bool(perms.manage_messages or perms.administrator)


async def refuse(interaction: discord.Interaction) -> None:
    await interaction.response.send_message("This command needs the Manage Messages permission.", ephemeral=True)


def fenced_pages(lines: list[str]) -> list[str]:
    return [f"```\n{chunk}\n```" for chunk in split_text("\n".join(lines), PAGE)]


class Moderation(commands.Cog):
    stumps = app_commands.Group(name="stumps", description="Texts that exist but were not published as speech",
                                default_permissions=discord.Permissions(manage_messages=True), guild_only=True)
    generation = app_commands.Group(name="generation", description="Provenance of a resident's output",
                                    default_permissions=discord.Permissions(manage_messages=True), guild_only=True)
    policy = app_commands.Group(name="policy", description="A resident's policy",
                                default_permissions=discord.Permissions(manage_messages=True), guild_only=True)

    def __init__(self, bot: ResidentBot) -> None:
        self.bot = bot

    @property
    def ledger(self):
        return self.bot.resident.ledger

    async def _send_pages(self, interaction: discord.Interaction, pages: list[str]) -> None:
        first, rest = pages[0], pages[1:]
        await interaction.response.send_message(first, ephemeral=True, allowed_mentions=discord.AllowedMentions.none())
        for page in rest:
            await interaction.followup.send(page, ephemeral=True, allowed_mentions=discord.AllowedMentions.none())

    @stumps.command(name="list", description="Stumps of a resident (metadata only)")
    @app_commands.describe(resident="resident name (default: this bot's)", cause="e.g. max_tokens, retry-abandoned")
    async def stumps_list(self, interaction: discord.Interaction, resident: str | None = None,
                          cause: str | None = None) -> None:
        if not can_moderate(interaction):
            return await refuse(interaction)
        name = resident or self.bot.residence.name
        found = await self.ledger.list_stumps(name, cause, limit=50)
        if not found:
            await interaction.response.send_message(f"No stumps for {name}" + (f" with cause {cause}" if cause else "")
                                                    + ".", ephemeral=True)
            return
        await self._send_pages(interaction, fenced_pages([views.stump_line(s) for s in found]))

    @stumps.command(name="show", description="One stump: its provenance, and its text where policy allows")
    async def stumps_show(self, interaction: discord.Interaction, id: str) -> None:
        if not can_moderate(interaction):
            return await refuse(interaction)
        s = await self.ledger.get_stump(id.strip())
        if s is None:
            await interaction.response.send_message(f"No stump {id}.", ephemeral=True)
            return
        head = [views.stump_line(s), f"generation {s.generation_id}, attempt {s.attempt_id}"]
        owner = self.bot.registry.get(s.residence)
        readable = owner is not None and owner.residence.policy.stumps.moderators_read_text
        if not readable:
            head.append("Text withheld: the residence's policy does not let moderators read stumps.")
            await self._send_pages(interaction, fenced_pages(head))
            return
        pages = fenced_pages(head) + [c for c in split_text(s.text, PAGE)]
        await self._send_pages(interaction, pages)

    @generation.command(name="show", description="Provenance: attempts, segments, stop and discard reasons, counts")
    @app_commands.describe(ref="a generation id, or a link to one of its messages")
    async def generation_show(self, interaction: discord.Interaction, ref: str) -> None:
        if not can_moderate(interaction):
            return await refuse(interaction)
        gid = ref.strip()
        m = LINK.search(gid)
        if m or gid.isdigit():
            posts = await self.ledger.posts_by_message([m.group(1) if m else gid])
            post = next(iter(posts.values()), None)
            gid = post.generation_id if post and post.generation_id else ""
        g = await self.ledger.get_generation(gid) if gid else None
        if g is None:
            await interaction.response.send_message(f"No generation found for {ref}.", ephemeral=True)
            return
        await self._send_pages(interaction, fenced_pages(views.provenance(g)))

    @policy.command(name="show", description="A resident's policy as it is in force")
    async def policy_show(self, interaction: discord.Interaction, resident: str | None = None) -> None:
        if not can_moderate(interaction):
            return await refuse(interaction)
        name = resident or self.bot.residence.name
        r = self.bot.registry.get(name)
        if r is None:
            await interaction.response.send_message(f"No resident {name} here.", ephemeral=True)
            return
        dump = yaml.safe_dump(r.residence.policy.model_dump(), sort_keys=False)
        await self._send_pages(interaction, fenced_pages([f"# {name} ({r.residence.model})", dump]))

    @app_commands.command(name="continue", description="Ask a resident to continue a cut output (one segment)")
    @app_commands.default_permissions(manage_messages=True)
    @app_commands.guild_only()
    async def continue_(self, interaction: discord.Interaction, generation: str) -> None:
        if not can_moderate(interaction):
            return await refuse(interaction)
        g = await self.ledger.get_generation(generation.strip())
        if g is None or g.residence != self.bot.residence.name:
            await interaction.response.send_message(
                f"No generation {generation} of {self.bot.residence.name}.", ephemeral=True)
            return
        standing = self.bot.residence.policy.continuation.standing
        if standing != "on-request":
            await interaction.response.send_message(
                f"Not continued: the continuation standing of {g.residence} is {standing}, not on-request.",
                ephemeral=True)
            return
        channel = self.bot.get_channel(int(g.channel)) if g.channel.isdigit() else None
        if channel is None:
            await interaction.response.send_message(f"The channel of {g.id} is not reachable.", ephemeral=True)
            return
        await interaction.response.defer(ephemeral=True, thinking=True)
        reply = await self.bot.resident.continue_generation(DiscordRoom(channel), g.channel, g.id)  # type: ignore[arg-type]
        if reply.declined:
            await interaction.followup.send(f"Not continued: {reply.declined}.", ephemeral=True)
            return
        assert reply.generation is not None
        await interaction.followup.send(
            f"Continued {g.id}: now {reply.generation.status}, {len(reply.generation.segments)} segment(s), "
            f"continuation {reply.generation.continuation_ended}.", ephemeral=True)


async def setup(bot: ResidentBot) -> None:
    await bot.add_cog(Moderation(bot))
