"""The Discord side: one `commands.Bot` per residence, its cogs loaded in `setup_hook`.

A bot knows its own resident and the registry of every resident in the process (moderators may
ask one bot about another's stumps); the pipeline itself knows nothing of Discord.
"""
from __future__ import annotations

import logging

import discord
from discord.ext import commands

from ..resident import Resident

log = logging.getLogger(__name__)

COGS = ("bot.discord.cogs.resident", "bot.discord.cogs.moderation")

# Residents never join voice; the warnings about voice libraries would only alarm operators.
discord.VoiceClient.warn_nacl = False
discord.VoiceClient.warn_dave = False


def intents() -> discord.Intents:
    i = discord.Intents.default()
    i.message_content = True  # residents read what people write; enable it in the developer portal
    return i


class ResidentBot(commands.Bot):
    def __init__(self, resident: Resident, registry: dict[str, Resident], *, guild_ready_timeout: float = 2.0) -> None:
        super().__init__(command_prefix=commands.when_mentioned, intents=intents(), help_command=None,
                         allowed_mentions=discord.AllowedMentions.none(), guild_ready_timeout=guild_ready_timeout)
        self.resident = resident
        self.registry = registry
        self.synced: set[int] = set()
        self.startup_problem: str | None = None

    @property
    def residence(self):
        return self.resident.residence

    async def on_message(self, message: discord.Message) -> None:
        """Residents have no prefix commands: a mention is conversation, handled by the resident cog."""

    async def setup_hook(self) -> None:
        for ext in COGS:
            await self.load_extension(ext)

    async def on_ready(self) -> None:
        """Commands are synced per guild (immediate, unlike global ones); configured channels are checked."""
        for guild in self.guilds:
            if guild.id in self.synced:
                continue
            self.tree.copy_global_to(guild=guild)
            await self.tree.sync(guild=guild)
            self.synced.add(guild.id)
        settings = self.residence.discord
        if settings and settings.channels:
            known = {c.name for g in self.guilds for c in g.text_channels} | \
                    {str(c.id) for g in self.guilds for c in g.text_channels}
            missing = [c for c in settings.channels if c not in known]
            if missing:
                self.startup_problem = (f"residences/{self.residence.name}.yaml: discord.channels: no channel named "
                                        f"{', '.join(map(repr, missing))} in the bot's guilds")
                log.info(self.startup_problem)  # run_bots raises it as the one line start-up stops with
                await self.close()
                return
        log.info("%s ready as %s in %d guild(s)", self.residence.name, self.user, len(self.guilds))

    def listens_in(self, channel: discord.abc.Messageable) -> bool:
        settings = self.residence.discord
        names = settings.channels if settings else []
        if not names:
            return True
        return getattr(channel, "name", None) in names or str(getattr(channel, "id", "")) in names
