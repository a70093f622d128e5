"""`residents run`: every residence with Discord settings, each as its own bot, in one process.

Start-up problems (a missing token, an unknown channel, a bad configuration, a provider with no
key, or one that refuses the key) stop everything with one line before or as the bots connect;
SIGINT/SIGTERM close cleanly. Every provider call takes its residence's `retries.timeout_seconds`
(`stream_once`), so one client and one connection pool serve every residence.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anthropic
import discord

from ..config import Residence, load_all_residences
from ..delivery.keys import KeyRejections
from ..delivery.live import LiveBoard, withdraw_left_in_progress
from ..delivery.outbox import Backoff, Outbox
from ..delivery.resume import recover
from ..generation.attempts import AttemptRunner
from ..generation.run import Generator
from ..ledger import Ledger
from ..provider import make_client
from ..resident import Resident
from . import startup
from .app import ResidentBot, commands_bot_of, names_channel
from .localapi import point_at_local
from .room import DiscordResumeRoom

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

KEY_ENV = "ANTHROPIC_API_KEY"  # where `residents run` reads the provider key
KEY_CHECK_SECONDS = 10.0  # the start-up key check waits no longer than this for the provider


class StartupError(Exception):
    """One line that says what stopped start-up and where."""


class ProviderKeyRejected(StartupError):
    """The provider refused the key at start-up (HTTP 401/403): no reply could be generated, so none start."""


@dataclass
class Deployment:
    residences: list[Residence]
    tokens: dict[str, str]


def plan_deployment(base: Path, local_api: bool, env: dict[str, str] | None = None) -> Deployment:
    """Residences with Discord settings and their tokens; against a local room any token will do.

    Every variable start-up needs and does not find (tokens, the provider key) is named in one line.
    """
    env = dict(os.environ if env is None else env)
    folder = base / "residences"
    if not any(folder.glob("*.yaml")):
        where = f"no {folder} folder" if not folder.is_dir() else f"no residences in {folder}"
        raise StartupError(f"{where}: `residents init` writes a starter set (or pass --config DIR)")
    residences = [r for r in load_all_residences(base) if r.discord is not None]
    if not residences:
        raise StartupError(f"{base / 'residences'}: no residence has `discord` settings (token_env, channels)")
    missing = startup.missing_variables(residences, env, local_api)
    if missing:
        raise StartupError(missing)
    tokens = {}
    for r in residences:
        assert r.discord is not None
        tokens[r.name] = env.get(r.discord.token_env, "").strip() or f"local-{r.name}"
    commands_bot_of(residences)  # two residences marked `discord.commands: true` stop start-up here
    return Deployment(residences, tokens)


def provider_settings(env: dict[str, str] | None = None, required: bool = True) -> tuple[str | None, str]:
    """The provider's base URL (None: Anthropic's API) and key ("" when unset, allowed with a base URL).

    `required=False`: no residence uses the anthropic provider, so a missing key stops nothing."""
    env = dict(os.environ if env is None else env)
    base_url = env.get("ANTHROPIC_BASE_URL") or None
    key = env.get(KEY_ENV, "")
    if not key and base_url is None and required:
        raise StartupError(f"{KEY_ENV} is not set (or set ANTHROPIC_BASE_URL to an Anthropic-compatible server)")
    return base_url, key


async def check_provider_key(client: anthropic.AsyncAnthropic, key_set: bool = True) -> None:
    """One cheap authenticated call (`GET /v1/models?limit=1`) before any bot connects.

    A 401/403 stops start-up with one line naming the variable. A server without that endpoint (404,
    405), or one that cannot answer now, is not a start-up error: each call meets the key anyway.
    """
    try:
        await client.models.list(limit=1, timeout=KEY_CHECK_SECONDS)
    except anthropic.APIStatusError as e:
        if e.status_code in (401, 403):
            body = e.body if isinstance(e.body, dict) else {}
            inner = body.get("error")
            err = inner if isinstance(inner, dict) else {}
            kind = err.get("type") or f"http-{e.status_code}"
            host, why = client.base_url.host, f"HTTP {e.status_code} {kind}"
            raise ProviderKeyRejected(
                f"{KEY_ENV}: the provider at {host} refused this key ({why}); set a valid key and start again"
                if key_set
                else f"{KEY_ENV}: not set, and the provider at {host} requires a key ({why})"
            ) from None
        if e.status_code in (404, 405):
            log.info(
                "the provider at %s has no models endpoint (HTTP %d); the key is not checked at start-up",
                client.base_url.host,
                e.status_code,
            )
        else:
            log.warning("the provider key could not be checked at start-up (HTTP %d); starting anyway", e.status_code)
    except anthropic.APIError as e:
        log.warning("the provider key could not be checked at start-up (%s); starting anyway", type(e).__name__)


def openai_clients(residences: list[Residence], env: dict[str, str]) -> dict[str, openai.AsyncOpenAI]:
    """A chat-completions client for each openai-compatible residence, by name; residences with the
    same server and key share one (and its connection pool). Every call takes its residence's timeout.
    The openai SDK is imported here, only when some residence speaks chat completions (`provider.dispatch`)."""
    shared: dict[tuple[str, str], openai.AsyncOpenAI] = {}
    out = {}
    for r in residences:
        if r.provider == "anthropic":
            continue
        assert r.base_url is not None and r.api_key_env is not None
        key = env.get(r.api_key_env, "").strip()
        if (r.base_url, key) not in shared:
            from ..provider.openai_stream import make_openai_client

            shared[r.base_url, key] = make_openai_client(r.base_url, key)
        out[r.name] = shared[r.base_url, key]
    return out


async def check_openai_key(client: openai.AsyncOpenAI, key_env: str) -> None:
    """As `check_provider_key`, for an openai-compatible server: one `GET /models` before any bot connects."""
    import openai  # only reached with an openai-compatible residence (see `openai_clients`)

    try:
        await client.models.list(timeout=KEY_CHECK_SECONDS)
    except openai.APIStatusError as e:
        host = client.base_url.host
        if e.status_code in (401, 403):
            raise ProviderKeyRejected(
                f"{key_env}: the provider at {host} refused this key (HTTP {e.status_code}); set a valid key and start again"
            ) from None
        if e.status_code in (404, 405):
            log.info(
                "the provider at %s has no models endpoint (HTTP %d); the key is not checked at start-up",
                host,
                e.status_code,
            )
        else:
            log.warning(
                "the provider key in %s could not be checked at start-up (HTTP %d); starting anyway",
                key_env,
                e.status_code,
            )
    except openai.OpenAIError as e:
        log.warning(
            "the provider key in %s could not be checked at start-up (%s); starting anyway", key_env, type(e).__name__
        )


async def start_bot(bot: ResidentBot, token: str, outbox: Outbox) -> None:
    """`Bot.start`, with the residence's undelivered posts tried once between login and connect.

    What cannot be delivered yet stays first in its channel's queue and is retried with backoff;
    nothing planned later overtakes it.
    """
    await bot.login(token)
    room = DiscordResumeRoom(bot)
    await withdraw_left_in_progress(outbox.ledger, room, bot.residence.name)  # a live reply cut by a stop
    outbox.register(bot.residence.name, room)
    await outbox.resume(bot.residence.name)
    await bot.connect()


async def run_bots(
    dep: Deployment,
    db: str,
    base_url: str | None,
    api_key: str,
    guild_ready_timeout: float = 2.0,
    stop: asyncio.Event | None = None,
    key_rejections: KeyRejections | None = None,
    backoff: Backoff | None = None,
    announce: Callable[[list[ResidentBot]], None] | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """The bots of `dep` until `stop` is set (or a signal); a start-up problem raises StartupError.

    `key_rejections` is shared by every resident (one notice per channel, whoever failed); a test
    passes its own to control the clock. `backoff` paces redelivery after a room failure.
    `announce` is told once, when every bot is ready. `env`: where an openai-compatible residence's
    `api_key_env` is read (the process's environment by default).
    """
    client = make_client(base_url, api_key)
    chats = openai_clients(dep.residences, dict(os.environ if env is None else env))
    try:
        if any(r.provider == "anthropic" for r in dep.residences):
            await check_provider_key(client, key_set=bool(api_key))
        checked: set[int] = set()
        for r in dep.residences:
            chat = chats.get(r.name)
            if chat is not None and id(chat) not in checked:
                checked.add(id(chat))
                assert r.api_key_env is not None
                await check_openai_key(chat, r.api_key_env)
        if key_rejections is None:
            key_rejections = KeyRejections(
                KEY_ENV, key_env_of={r.name: r.api_key_env for r in dep.residences if r.api_key_env}
            )
        async with Ledger.open(db) as ledger:
            # Before any bot connects: what a stopped process left open is settled and planned.
            await recover(ledger, {r.name for r in dep.residences})
            await _serve(dep, ledger, client, guild_ready_timeout, stop, key_rejections, backoff, announce, chats)
    finally:
        await client.close()
        for chat in {id(c): c for c in chats.values()}.values():
            await chat.close()


async def _serve(
    dep: Deployment,
    ledger: Ledger,
    client: anthropic.AsyncAnthropic,
    guild_ready_timeout: float,
    stop: asyncio.Event | None,
    key_rejections: KeyRejections | None,
    backoff: Backoff | None,
    announce: Callable[[list[ResidentBot]], None] | None,
    chats: dict[str, openai.AsyncOpenAI] | None = None,
) -> None:
    """The bots, on an open ledger and provider clients (their owner closes them), until `stop` or a problem.

    `chats`: the client of each openai-compatible residence, by name."""
    key_rejections = key_rejections or KeyRejections(KEY_ENV)
    registry: dict[str, Resident] = {}
    bots: list[ResidentBot] = []
    outbox = Outbox(ledger, backoff)
    try:
        generator = Generator(AttemptRunner(client, ledger, clients=dict(chats or {})))
        board = LiveBoard()  # the process's live messages in progress, as its outbox is the process's
        for r in dep.residences:
            registry[r.name] = Resident(r, generator, ledger, outbox, key_rejections)
            registry[r.name].board = board
        commander = commands_bot_of(dep.residences)
        peers: dict[str, ResidentBot] = {}
        for r in dep.residences:
            bots.append(
                ResidentBot(
                    registry[r.name],
                    registry,
                    guild_ready_timeout=guild_ready_timeout,
                    commands_bot=r.name == commander,
                    peers=peers,
                )
            )
            peers[r.name] = bots[-1]
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread, or not supported here
                pass
        tasks = [
            asyncio.create_task(start_bot(b, dep.tokens[b.residence.name], outbox), name=f"bot:{b.residence.name}")
            for b in bots
        ]
        stopper = asyncio.create_task(stop.wait())
        announcer = asyncio.create_task(_announce_when_ready(bots, announce))
        done, _ = await asyncio.wait(tasks + [stopper], return_when=asyncio.FIRST_COMPLETED)
        announcer.cancel()
        problem = None
        for t in done:
            if t is stopper:
                continue
            b = next(b for b, task in zip(bots, tasks, strict=True) if task is t)
            exc = t.exception()
            if isinstance(exc, discord.LoginFailure):
                problem = (
                    f"residences/{b.residence.name}.yaml: discord.token_env: the token in "
                    f"{b.residence.discord.token_env if b.residence.discord else '?'} was rejected"
                )
            elif exc is not None:
                problem = f"{b.residence.name}: could not connect to Discord: {type(exc).__name__}: {exc}"
            else:
                problem = b.startup_problem or f"{b.residence.name}: the bot stopped"
        await outbox.close()  # before the bots' HTTP sessions: what waits stays in the ledger for the next start
        for b in bots:
            await b.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stopper.cancel()
        if problem and not stop.is_set():
            raise StartupError(problem)
    finally:
        await outbox.close()


async def _announce_when_ready(bots: list[ResidentBot], announce: Callable[[list[ResidentBot]], None] | None) -> None:
    if announce is None:
        return
    await asyncio.gather(*(b.settled.wait() for b in bots))
    announce(bots)


def start_rows(bots: list[ResidentBot], local_api: bool) -> list[startup.Row]:
    """Each ready bot's row of the start-up table: its user, and the channels its entries found."""
    rows = []
    for b in bots:
        entries = b.residence.discord.channels if b.residence.discord else []
        several = len(b.guilds) > 1
        found = [
            f"{c.guild.name}/#{c.name}" if several else f"#{c.name}"
            for g in b.guilds
            for c in g.text_channels
            if any(names_channel(e, c) for e in entries)
        ]
        rows.append(startup.row(b.residence, str(b.user), b.application_id, found, local_api))
    return rows


def main(base: Path, db: str, discord_api: str | None) -> int:
    """`residents run`: log lines go through the root logger's one handler (set up by the CLI), once."""
    dep = plan_deployment(base, local_api=discord_api is not None)
    base_url, key = provider_settings(required=any(r.provider == "anthropic" for r in dep.residences))
    if discord_api:
        point_at_local(discord_api)
    gc.freeze()  # everything imported lives as long as the process: out of the collector's full passes

    def announce(bots: list[ResidentBot]) -> None:
        print(startup.table(start_rows(bots, discord_api is not None), db), flush=True)

    asyncio.run(run_bots(dep, db, base_url, key, announce=announce))
    return 0
