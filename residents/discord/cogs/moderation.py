"""Moderators' slash commands: inspect stumps and provenance, show a policy, ask for a continuation, see
what the provider counted (/usage).

Registered with `default_member_permissions` (Manage Messages) and checked again at run time by the
cog's one `interaction_check` (`checks.moderator_check`), since a guild can override the default.
Every lookup is scoped to the guild it is asked in and to the channels there where the member
moderates (`checks.moderation_scope`): a record outside that scope gets the same answer as one that
does not exist. Replies are ephemeral; a stump's text is shown only where its residence's policy
lets moderators read stumps and its resident left the stump's access at `moderators`; each showing
is recorded as a read, and the text never reaches the room from here. Failures are answered by the
tree's error handler (`checks.on_app_command_error`).
"""

from __future__ import annotations

import re
from typing import Literal

import discord
import yaml
from discord import app_commands
from discord.ext import commands

from ...delivery import split_text
from ...ledger import usage, views
from ...ledger.access import access_of, reads_of, record_read, tool_calls_of
from ...records import Generation
from ...text import outbound
from ..app import ResidentBot, names_channel
from ..buttons import continue_channel, continue_in, unreachable
from ..checks import Scope, moderation_scope, moderator_check

LINK = re.compile(r"/channels/(?:\d+|@me)/\d+/(\d+)")
PAGE = 1900
STUMPS_PER_PAGE = 20


def fenced_pages(lines: list[str]) -> list[str]:
    return [f"```\n{chunk}\n```" for chunk in split_text("\n".join(lines), PAGE)]


def for_discord(pages: list[str]) -> list[str]:
    """Pages as they may leave the process: valid UTF-8, a lone surrogate (kept exactly in the ledger) as U+FFFD."""
    return [outbound(p)[0] for p in pages]


def stump_pages(head: list[str], text: str | None) -> list[str]:
    """A /stumps show answer: the stump's provenance lines, then its text where it is shown."""
    return for_discord(fenced_pages(head) + (split_text(text, PAGE) if text is not None else []))


class Moderation(commands.Cog):
    stumps = app_commands.Group(
        name="stumps",
        description="Texts that exist but were not published as speech",
        default_permissions=discord.Permissions(manage_messages=True),
        guild_only=True,
    )
    generation = app_commands.Group(
        name="generation",
        description="Provenance of a resident's output",
        default_permissions=discord.Permissions(manage_messages=True),
        guild_only=True,
    )
    policy = app_commands.Group(
        name="policy",
        description="A resident's policy",
        default_permissions=discord.Permissions(manage_messages=True),
        guild_only=True,
    )

    def __init__(self, bot: ResidentBot) -> None:
        self.bot = bot

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return await moderator_check(interaction)

    @property
    def ledger(self):
        return self.bot.resident.ledger

    async def _send_pages(self, interaction: discord.Interaction, pages: list[str]) -> None:
        first, *rest = for_discord(pages)
        await interaction.response.send_message(first, ephemeral=True, allowed_mentions=discord.AllowedMentions.none())
        for page in rest:
            await interaction.followup.send(page, ephemeral=True, allowed_mentions=discord.AllowedMentions.none())

    async def _say(self, interaction: discord.Interaction, text: str) -> None:
        await interaction.response.send_message(
            outbound(text)[0], ephemeral=True, allowed_mentions=discord.AllowedMentions.none()
        )

    async def _generation(self, gid: str, scope: Scope) -> Generation | None:
        """The generation, if it was made in a channel of the scope; None as for one that does not exist."""
        g = await self.ledger.get_generation(gid) if gid else None
        return g if g is not None and g.channel in scope else None

    @stumps.command(name="list", description="Stumps of a resident, newest first (metadata only)")
    @app_commands.describe(
        resident="resident name (default: every resident)",
        cause="e.g. max_tokens, retry-abandoned",
        page=f"page of {STUMPS_PER_PAGE}, newest first (default 1)",
    )
    async def stumps_list(
        self,
        interaction: discord.Interaction,
        resident: str | None = None,
        cause: str | None = None,
        page: app_commands.Range[int, 1, 1000] = 1,
    ) -> None:
        name = resident.strip() if resident else None
        found = await self.ledger.list_stump_meta(
            name, cause, limit=page * STUMPS_PER_PAGE + 1, channels=moderation_scope(interaction).ids
        )
        shown = found[(page - 1) * STUMPS_PER_PAGE : page * STUMPS_PER_PAGE]
        if not shown:
            await self._say(
                interaction,
                f"No stumps for {name or 'any resident'}"
                + (f" with cause {cause}" if cause else "")
                + (f" on page {page}" if page > 1 else "")
                + ".",
            )
            return
        more = len(found) > page * STUMPS_PER_PAGE
        head = f"page {page}, newest first" + (f"; older: page:{page + 1}" if more else "")
        await self._send_pages(interaction, fenced_pages([head] + [views.stump_line(s) for s in shown]))

    @stumps.command(name="show", description="One stump: its provenance, and its text where policy allows")
    async def stumps_show(self, interaction: discord.Interaction, id: str) -> None:
        s = await self.ledger.get_stump(id.strip())
        if s is None or await self._generation(s.generation_id, moderation_scope(interaction)) is None:
            await self._say(interaction, f"No stump {id}.")
            return
        head = [views.stump_line(s), f"generation {s.generation_id}, attempt {s.attempt_id}"]
        owner = self.bot.registry.get(s.residence)
        readable = owner is not None and owner.residence.policy.stumps.moderators_read_text
        access = await access_of(self.ledger, s.id) or "moderators"
        head.append(
            f"access: {access} (the resident's choice: "
            + ("moderators may read its text)" if access == "moderators" else "moderators may not read its text)")
        )
        shown = readable and access == "moderators"
        if shown:  # recorded before the text is sent
            user = interaction.user
            await record_read(self.ledger, s.id, f"{user.name} ({user.id})", "moderator")
        reads = (await reads_of(self.ledger, [s.id]))[s.id]
        head.append(
            "text read by: "
            + (
                "; ".join(f"{r['reader']}, {r['kind']}, {views.when(r['at'])} UTC" for r in reads)
                if reads
                else "no one"
            )
        )
        if not readable:
            head.append("Text withheld: the residence's policy does not let moderators read stumps.")
        elif not shown:
            head.append(f"Text withheld: {s.residence} set this stump private.")
        await self._send_pages(interaction, stump_pages(head, s.text if shown else None))

    @generation.command(name="show", description="Provenance: attempts, segments, stop and discard reasons, counts")
    @app_commands.describe(ref="a generation id, or a link to one of its messages")
    async def generation_show(self, interaction: discord.Interaction, ref: str) -> None:
        gid = ref.strip()
        m = LINK.search(gid)
        if m or gid.isdigit():
            posts = await self.ledger.posts_by_message([m.group(1) if m else gid])
            post = next(iter(posts.values()), None)
            gid = post.generation_id if post and post.generation_id else ""
        g = await self._generation(gid, moderation_scope(interaction))
        if g is None:
            await self._say(interaction, f"No generation found for {ref}.")
            return
        await self._send_pages(interaction, fenced_pages(views.provenance(g, await tool_calls_of(self.ledger, g.id))))

    @policy.command(name="show", description="A resident's policy as it is in force")
    async def policy_show(self, interaction: discord.Interaction, resident: str | None = None) -> None:
        name = resident or self.bot.residence.name
        r = self.bot.registry.get(name)
        scope = moderation_scope(interaction)
        # A resident is here when it listens in a channel of the scope (this bot listens wherever it is
        # unless its residence names channels; another resident must name one of them).
        if r is not None:
            entries = r.residence.discord.channels if r.residence.discord else []
            here = (
                any(names_channel(e, c) for e in entries for c in scope.channels)
                if entries
                else (
                    bool(scope.channels)
                    and name in self.bot.peers
                    and self.bot.peers[name].get_guild(interaction.guild_id or 0) is not None
                )
            )
            r = r if here else None
        if r is None:
            await self._say(interaction, f"No resident {name} here.")
            return
        dump = yaml.safe_dump(r.residence.policy.model_dump(), sort_keys=False)
        await self._send_pages(interaction, fenced_pages([f"# {name} ({r.residence.model})", dump]))

    @app_commands.command(name="continue", description="Ask a resident to continue a cut output (one segment)")
    @app_commands.default_permissions(manage_messages=True)
    @app_commands.guild_only()
    async def continue_(self, interaction: discord.Interaction, generation: str) -> None:
        scope = moderation_scope(interaction)
        g = await self._generation(generation.strip(), scope)
        # The generation names its resident; this bot answers for every resident of the process.
        owner = self.bot.registry.get(g.residence) if g is not None else None
        if g is None or owner is None:
            await self._say(interaction, f"No generation {generation} of a resident here.")
            return
        owner_bot = self.bot.peers.get(g.residence)
        forwarder = self.bot.forwarder
        if owner_bot is None and forwarder is not None:
            # Several processes share the ledger (leases): its bot is driven by another, which runs it there.
            if scope.channel(g.channel) is None:
                await self._say(interaction, unreachable(g))
                return
            await interaction.response.defer(ephemeral=True, thinking=True)
            answer = await forwarder.ask(g)
            await interaction.followup.send(outbound(answer)[0], ephemeral=True)
            return
        if owner_bot is None:
            await self._say(interaction, f"No generation {generation} of a resident here.")
            return
        # In scope, so in this guild; the resident's own bot posts, so it must see the channel too.
        found = continue_channel(owner, owner_bot, g, reachable=scope.channel(g.channel) is not None)
        if isinstance(found, str):
            await self._say(interaction, found)
            return
        await interaction.response.defer(ephemeral=True, thinking=True)
        await interaction.followup.send(await continue_in(owner, found, g, offered=len(g.segments)), ephemeral=True)

    @app_commands.command(name="usage", description="Tokens the provider counted here, and their cost (an estimate)")
    @app_commands.describe(by="sum by residence, channel or UTC day", since="a UTC day, YYYY-MM-DD (default: all)")
    @app_commands.default_permissions(manage_messages=True)
    @app_commands.guild_only()
    async def usage_(
        self,
        interaction: discord.Interaction,
        by: Literal["residence", "channel", "day"] = "residence",
        since: str | None = None,
    ) -> None:
        """The provider's counts of the calls made for this guild's channels the member moderates."""
        try:
            start = usage.since_of(since) if since else None
        except ValueError as e:
            await self._say(interaction, f"since: {e}.")
            return
        scope = moderation_scope(interaction)
        rep = await usage.usage(self.ledger, by, start, channels=scope.ids)
        if by == "channel":  # named as the member sees them
            for line in rep.lines:
                known = scope.channel(line.key)
                line.key = f"#{known.name}" if known is not None else line.key
        await self._send_pages(interaction, fenced_pages([usage.table(rep)]))


async def setup(bot: ResidentBot) -> None:
    await bot.add_cog(Moderation(bot))
