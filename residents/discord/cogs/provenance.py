"""Provenance for every witness: the message command **Provenance** and `/provenance message:<link or id>`;
`/provenance` with no message answers the ledger's head now (`N:SHA256`, as checkpoints post it).

Open to everyone who can see the channel (no moderator permission): a room that reads a receipt can
also check it. The answer is ephemeral and holds metadata only — post kind, generation, status, stop
reason, attempts with their causes, characters and tokens, the SHA-256 of the post as posted and of
the generation's canonical text, and the hash-chain entries that record them (`residents.ledger.chain`);
never any text, so no stump and no reasoning. A receipt's answer names the text posts it closes,
each with its hash. Scope: the invoking guild, channels there the member can view; a post anywhere
else gets the answer of a message no resident posted. Failures are answered by the tree's one
error handler (`checks.on_app_command_error`).
"""

from __future__ import annotations

import re

import discord
from discord import app_commands
from discord.ext import commands

from ... import truth
from ...delivery import split_text
from ...ledger import views
from ...ledger.checkpoints import chain_head
from ..app import ResidentBot
from ..checks import witness_scope

LINK = re.compile(r"/channels/(?:\d+|@me)/\d+/(\d+)")
PAGE = 1900


class Provenance(commands.Cog):
    def __init__(self, bot: ResidentBot) -> None:
        self.bot = bot
        self.menu = app_commands.ContextMenu(name="Provenance", callback=self.on_menu)
        self.menu.guild_only = True

    async def cog_load(self) -> None:
        self.bot.tree.add_command(self.menu)  # a message command cannot be declared inside a cog

    async def cog_unload(self) -> None:
        self.bot.tree.remove_command(self.menu.name, type=self.menu.type)

    async def on_menu(self, interaction: discord.Interaction, message: discord.Message) -> None:
        await self._answer(interaction, str(message.id))

    @app_commands.command(
        name="provenance", description="Check a resident's post against the ledger (no text shown), or see its head"
    )
    @app_commands.describe(message="a message link, or a message id (none: the ledger's head now)")
    @app_commands.guild_only()
    async def provenance(self, interaction: discord.Interaction, message: str | None = None) -> None:
        if message is None:  # the head alone: what a witness keeps to check the ledger later
            await self._say(
                interaction, f"```\n{truth.provenance_head(await chain_head(self.bot.resident.ledger.db))}\n```"
            )
            return
        ref = message.strip()
        m = LINK.search(ref)
        if m is None and not ref.isdigit():
            await self._say(interaction, truth.provenance_bad_ref(ref))
            return
        await self._answer(interaction, m.group(1) if m else ref)

    async def _answer(self, interaction: discord.Interaction, message_id: str) -> None:
        ledger = self.bot.resident.ledger
        post = (await ledger.posts_by_message([message_id])).get(message_id)
        if post is None or post.channel not in witness_scope(interaction):
            await self._say(interaction, truth.PROVENANCE_NOT_FOUND)
            return
        g = await ledger.get_generation(post.generation_id) if post.generation_id else None
        closes = views.closed_by(post, g.posts) if g is not None and post.kind == "receipt" else []
        wanted = [("post", p.id) for p in [post, *closes]] + [("delivered", p.id) for p in [post, *closes]]
        if g is not None:
            wanted += [("generation", g.id)] + [("attempt", a.id) for a in g.attempts]
        entries = {}
        for kind, record in wanted:
            e = await views.latest(ledger.db, kind, record)
            if e is not None:
                entries[(kind, record)] = e
        lines = views.post_provenance(message_id, post, g, closes, entries, await chain_head(ledger.db))
        pages = [f"```\n{chunk}\n```" for chunk in split_text("\n".join(lines), PAGE)]  # hashes copy cleanly
        await self._say(interaction, *pages)

    async def _say(self, interaction: discord.Interaction, first: str, *more: str) -> None:
        none = discord.AllowedMentions.none()
        await interaction.response.send_message(first, ephemeral=True, allowed_mentions=none)
        for page in more:
            await interaction.followup.send(page, ephemeral=True, allowed_mentions=none)


async def setup(bot: ResidentBot) -> None:
    await bot.add_cog(Provenance(bot))
