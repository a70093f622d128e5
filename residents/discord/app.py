"""The Discord side: one `commands.Bot` per residence, its cogs loaded in `setup_hook`.

A bot knows its own resident and the registry of every resident in the process (moderators may
ask one bot about another's stumps); the pipeline itself knows nothing of Discord. A residence with
`discord.shards` runs on discord.py's AutoShardedBot (`sharded`): one bot, several gateway sessions,
each carrying the guilds on its shard; a shard that loses its session catches up on its own guilds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, cast

import aiohttp
import discord
from discord.ext import commands

from ..config import Checkpoints, ConfigError, Residence, ShardSettings
from ..records import Generation
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


IDENTIFY_WINDOW_S = 5.0  # Discord starts `max_concurrency` sessions of a bot per 5 seconds


class IdentifyPacer:
    """Discord's session start rate: one IDENTIFY per 5 s in each bucket `shard_id % max_concurrency`.

    discord.py's own hook waits 5 s before every shard but the first, whatever the bot's
    `max_concurrency`; this waits only as long as the shard's bucket needs."""

    def __init__(self, window: float = IDENTIFY_WINDOW_S) -> None:
        self.window = window
        self.max_concurrency: int | None = None  # learnt from GET /gateway/bot on the first IDENTIFY
        self.last: dict[int, float] = {}

    async def wait(self, shard_id: int) -> None:
        loop = asyncio.get_running_loop()
        bucket = shard_id % (self.max_concurrency or 1)
        last = self.last.get(bucket)
        if last is not None and loop.time() - last < self.window:
            await asyncio.sleep(last + self.window - loop.time())
        self.last[bucket] = loop.time()


def shard_options(settings: ShardSettings) -> dict[str, Any]:
    """discord.py's AutoShardedBot arguments for `discord.shards`: no count asks Discord for one (`auto`)."""
    return {"shard_count": settings.count, "shard_ids": list(settings.ids) if settings.ids is not None else None}


class Carrier(Protocol):
    """How /continue reaches a resident whose bot another process drives (`forward.Forwarder`)."""

    async def ask(self, g: Generation) -> str: ...


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
        settings = resident.residence.discord
        self.shard_settings = settings.shards if settings is not None else None
        if self.shard_settings is not None and not self.sharded:
            raise TypeError(f"{resident.residence.name} has discord.shards: build its bot with sharded(ResidentBot)")
        self.identify_pacer = IdentifyPacer()
        super().__init__(
            **(shard_options(self.shard_settings) if self.shard_settings is not None else {}),
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
        # Taken over from another process on a shared ledger (`run._Driven`): since when that one drove the bot
        # (seconds since the epoch). A channel where the resident never answered is caught up from there.
        self.driven_elsewhere_since: float | None = None
        # On a shared ledger, how /continue reaches a resident whose bot another process drives (`run._Driven`).
        self.forwarder: Carrier | None = None

    @property
    def residence(self):
        return self.resident.residence

    @property
    def sharded(self) -> bool:
        """Several gateway sessions (discord.py's AutoShardedClient), as `discord.shards` asks."""
        return isinstance(self, discord.AutoShardedClient)

    @property
    def all_shards(self) -> bool:
        """Whether this process runs every shard of the bot, so every guild of the bot is in `guilds`."""
        settings = self.shard_settings
        return settings is None or settings.ids is None or len(settings.ids) == settings.count

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        """A sharded bot's sessions start as fast as Discord's `max_concurrency` lets them (see IdentifyPacer)."""
        if not isinstance(self, discord.AutoShardedClient) or shard_id is None:
            await super().before_identify_hook(shard_id, initial=initial)
            return
        pacer = self.identify_pacer
        if pacer.max_concurrency is None:
            try:
                pacer.max_concurrency = max(1, (await self.fetch_session_start_limits()).max_concurrency)
            except (discord.HTTPException, discord.GatewayNotFound, aiohttp.ClientError, OSError) as e:
                log.info("%s: session start limits not known (%s): one IDENTIFY per 5 s", self.residence.name, e)
                pacer.max_concurrency = 1
        await pacer.wait(shard_id)

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

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        """An event handler cut short because the bot was stopped under it (its lease went to another
        process, or the process stops) is expected, and said so once at info; any other error is discord.py's
        to report."""
        if self.is_closed():
            log.info("%s: %s ended as the bot stopped", self.residence.name, event_method)
            return
        await super().on_error(event_method, *args, **kwargs)

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
            # A process that runs some of the bot's shards sees only their guilds: the rest may be elsewhere.
            missing = [e for e, cs in found.items() if not cs] if self.all_shards else []
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
        shards = (
            f", shards {sorted(self.shards)} of {self.shard_count}"
            if isinstance(self, discord.AutoShardedClient)
            else ""
        )
        log.info("%s ready as %s in %d guild(s)%s", self.residence.name, self.user, len(self.guilds), shards)
        self.settled.set()
        # discord.py calls on_ready for every new gateway session (the first, and each IDENTIFY after a
        # RESUME was refused), never after a successful RESUME: the resident cog catches up on what it missed.
        # A sharded bot hears on_ready once all its shards are up, and again only if it runs one shard.
        self.dispatch("new_session", None)

    async def on_shard_ready(self, shard_id: int) -> None:
        """A shard's new session, once the bot has settled (its first ones are on_ready's): the resident
        catches up in the guilds of that shard only; the other shards never stopped."""
        if self.settled.is_set() and isinstance(self, discord.AutoShardedClient) and len(self.shards) > 1:
            log.info("%s: shard %s has a new gateway session", self.residence.name, shard_id)
            self.dispatch("new_session", shard_id)

    def listens_in(self, channel: discord.abc.Messageable) -> bool:
        settings = self.residence.discord
        names = settings.channels if settings else []
        return not names or any(names_channel(e, channel) for e in names)


_SHARDED: dict[type[ResidentBot], type[ResidentBot]] = {}


def sharded(cls: type[ResidentBot]) -> type[ResidentBot]:
    """`cls` on discord.py's AutoShardedBot instead of Bot: the same resident, its gateway in shards.

    Built from `cls` (not a second class written out) so a subclass of ResidentBot, a test's included,
    shards the same way; one class per `cls`."""
    if cls not in _SHARDED:
        _SHARDED[cls] = cast(type[ResidentBot], type(f"Sharded{cls.__name__}", (cls, commands.AutoShardedBot), {}))
    return _SHARDED[cls]


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
