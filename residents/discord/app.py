"""The Discord side: one `commands.Bot` per residence, its cogs loaded in `setup_hook`.

A bot knows its own resident and the registry of every resident in the process (moderators may
ask one bot about another's stumps); the pipeline itself knows nothing of Discord.
"""

from __future__ import annotations

import asyncio
import logging

import discord
from discord.ext import commands

from ..config import Checkpoints, ConfigError, Residence
from ..resident import Resident
from . import checks

log = logging.getLogger(__name__)

COGS = ("residents.discord.cogs.resident",)
# Application commands, loaded by the process's one commands bot, which answers for every resident.
COMMANDS_COGS = ("residents.discord.cogs.moderation", "residents.discord.cogs.provenance")
# The chain's head posted in a channel (`ledger.checkpoints`), by the commands bot when it is configured.
CHECKPOINTS_COG = "residents.discord.cogs.checkpoints"

# Residents never join voice; the warnings about voice libraries would only alarm operators.
discord.VoiceClient.warn_nacl = False
discord.VoiceClient.warn_dave = False


def intents() -> discord.Intents:
    i = discord.Intents.default()
    i.message_content = True  # residents read what people write; enable it in the developer portal
    return i


class ResidentBot(commands.Bot):
    def __init__(
        self,
        resident: Resident,
        registry: dict[str, Resident],
        *,
        guild_ready_timeout: float = 2.0,
        commands_bot: bool = True,
        peers: dict[str, ResidentBot] | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        super().__init__(
            command_prefix=commands.when_mentioned,
            intents=intents(),
            help_command=None,
            allowed_mentions=discord.AllowedMentions.none(),
            guild_ready_timeout=guild_ready_timeout,
            # No message cache: a resident reads history through the API and keeps nothing of a message
            # after handling it; discord.py's default of 1,000 per bot held every long reply (each
            # bot of the process caching every other's) and kept ~60 MB after 100 replies of 16 KB.
            max_messages=None,
        )
        self.resident = resident
        self.registry = registry
        # One bot of the process registers the moderators' slash commands and answers them for every
        # resident (`commands_bot`); the others put an empty list, so a guild shows one copy of each.
        self.commands_bot = commands_bot
        self.peers: dict[str, ResidentBot] = peers if peers is not None else {resident.residence.name: self}
        self.synced: set[int] = set()
        self.startup_problem: str | None = None
        # `ledger.checkpoints`, for the process's commands bot (run.py passes it to that one only), and the
        # channel on_ready found for it: the checkpoints cog posts there once the bot has settled.
        self.checkpoints = checkpoints
        self.checkpoint_channel: discord.TextChannel | None = None
        self.settled = asyncio.Event()  # set once ready: commands synced, channels found
        # A gateway session: READY or RESUMED since the last disconnect (`/readyz`, the sessions gauge).
        self.gateway_session = False

    @property
    def residence(self):
        return self.resident.residence

    async def on_message(self, message: discord.Message) -> None:
        """Residents have no prefix commands: a mention is conversation, handled by the resident cog."""

    async def setup_hook(self) -> None:
        for ext in (
            COGS + (COMMANDS_COGS if self.commands_bot else ()) + ((CHECKPOINTS_COG,) if self.checkpoints else ())
        ):
            await self.load_extension(ext)
        self.tree.error(checks.on_app_command_error)  # every slash command is answered, errors included

    async def on_resumed(self) -> None:
        self.gateway_session = True

    async def on_disconnect(self) -> None:
        self.gateway_session = False

    async def on_ready(self) -> None:
        """Commands are synced per guild (immediate, unlike global ones; a bot that is not the commands bot
        puts an empty list, removing any copies an earlier version registered); configured channels are checked."""
        self.gateway_session = True
        for guild in self.guilds:
            if guild.id in self.synced:
                continue
            self.tree.copy_global_to(guild=guild)
            await self.tree.sync(guild=guild)
            self.synced.add(guild.id)
        settings = self.residence.discord
        if settings and settings.channels:
            found = {
                e: [c for g in self.guilds for c in g.text_channels if names_channel(e, c)] for e in settings.channels
            }
            missing = [e for e, cs in found.items() if not cs]
            where = f"residences/{self.residence.name}.yaml: discord.channels"
            ambiguous = [(e, cs) for e, cs in found.items() if len(cs) > 1]
            if missing:
                self.startup_problem = f"{where}: no channel named {', '.join(map(repr, missing))} in the bot's guilds"
            elif ambiguous:
                e, cs = ambiguous[0]
                guilds = list(dict.fromkeys(c.guild.name for c in cs))
                self.startup_problem = (
                    f"{where}: {e!r} is in guilds {' and '.join(guilds)}; write "
                    f"{' or '.join(repr(f'{g}/{e}') for g in guilds)}"
                    if len(guilds) > 1
                    else f"{where}: {e!r} names {len(cs)} channels in guild {guilds[0]}; write one's id"
                )
        if self.checkpoints is not None and not self.startup_problem:
            entry = self.checkpoints.channel
            named = [c for g in self.guilds for c in g.text_channels if names_channel(entry, c)]
            listening = {n: r.residence.discord.channels for n, r in self.registry.items() if r.residence.discord}
            self.checkpoint_channel, self.startup_problem = checkpoint_channel(
                entry, named, self.residence.name, listening
            )
        if self.startup_problem:
            log.info(self.startup_problem)  # run_bots raises it as the one line start-up stops with
            await self.close()
            return
        log.info("%s ready as %s in %d guild(s)", self.residence.name, self.user, len(self.guilds))
        self.settled.set()
        # discord.py calls on_ready for every new gateway session (the first, and each IDENTIFY after a
        # RESUME was refused), never after a successful RESUME: the resident cog catches up on what it missed.
        self.dispatch("new_session")

    def listens_in(self, channel: discord.abc.Messageable) -> bool:
        settings = self.residence.discord
        names = settings.channels if settings else []
        return not names or any(names_channel(e, channel) for e in names)


def commands_bot_of(residences: list[Residence]) -> str:
    """The residence whose bot registers the slash commands: the one marked `discord.commands: true`, or the first.

    Two marked is a configuration error (`ConfigError` naming the second).
    """
    marked = [r for r in residences if r.discord is not None and r.discord.commands]
    if len(marked) > 1:
        raise ConfigError(
            f"residences/{marked[1].name}.yaml",
            "discord.commands",
            f"only one residence may register the slash commands; {marked[0].name} already does",
        )
    return marked[0].name if marked else residences[0].name


def names_channel(entry: str, channel: object) -> bool:
    """A `discord.channels` entry names this channel: its id, `guild/channel`, or its bare name (which
    start-up has checked is unambiguous)."""
    if entry == str(getattr(channel, "id", "")):
        return True
    guild_name, slash, name = entry.rpartition("/")
    if name != getattr(channel, "name", None):
        return False
    return not slash or getattr(getattr(channel, "guild", None), "name", None) == guild_name


CHECKPOINTS_KEY = "residents.yaml: ledger.checkpoints.channel"


def checkpoint_channel(
    entry: str, named: list[discord.TextChannel], bot_name: str, listening: dict[str, list[str]]
) -> tuple[discord.TextChannel | None, str | None]:
    """Of the channels `entry` names in the posting bot's guilds (`named`), the one checkpoints go to, or
    the one line saying why there is none: no such channel, several, one the bot may not post in, or one
    a resident listens in (`listening`: each residence's `discord.channels`; none listed is every channel).

    Why a channel of their own: a checkpoint is not in the ledger, so a resident reading that channel
    would take the line as room words (its own words, if its bot posted it)."""
    if not named:
        return None, (
            f"{CHECKPOINTS_KEY}: no channel named {entry!r} in the guilds of {bot_name}'s bot, which posts checkpoints"
        )
    if len(named) > 1:
        where = ", ".join(f"{c.guild.name}/{c.name} ({c.id})" for c in named)
        return None, f"{CHECKPOINTS_KEY}: {entry!r} names {len(named)} channels ({where}); write guild/channel or an id"
    channel = named[0]
    perms = channel.permissions_for(channel.guild.me)
    if not (perms.view_channel and perms.send_messages):
        return None, (
            f"{CHECKPOINTS_KEY}: {bot_name}'s bot, which posts checkpoints, may not post in "
            f"{channel.guild.name}/{channel.name} (it needs View Channel and Send Messages there)"
        )
    for name, entries in listening.items():
        if not entries or any(names_channel(e, channel) for e in entries):
            how = "listens in every channel (it lists no discord.channels)" if not entries else "listens there"
            return None, (
                f"{CHECKPOINTS_KEY}: {channel.guild.name}/{channel.name} is no channel of their own: {name} {how}; "
                "a resident would read each checkpoint as the room's words"
            )
    return channel, None
