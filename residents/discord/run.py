"""`residents run`: every residence with Discord settings, each as its own bot, in one process.

Start-up problems (a missing token, an unknown channel, a bad configuration, a provider with no
key, or one that refuses the key) stop everything with one line before or as the bots connect;
SIGINT/SIGTERM close cleanly. Every provider call takes its residence's `retries.timeout_seconds`, so
residences with the same provider, server and key share one client and its connection pool.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import discord
from pydantic import ValidationError

from ..config import Checkpoints, Residence, ShardSettings, load_all_residences, load_project
from ..delivery.keys import KeyRejections
from ..delivery.live import LiveBoard, withdraw_left_in_progress
from ..delivery.outbox import Backoff, Outbox
from ..delivery.resume import recover
from ..generation.attempts import AttemptRunner
from ..generation.run import Generator
from ..ledger import Ledger, hold_ledger, postgres
from ..metrics import READY_POST_AGE, Metrics, MetricsPortInUse, MetricsServer
from ..observe import UNOBSERVED, Observer
from ..provider import Endpoint, KeyRejected, MissingKey, Provider, close_all, connect_all, endpoint
from ..resident import Resident
from . import startup
from .app import ResidentBot, commands_bot_of, names_channel, sharded
from .buttons import receipt_view
from .localapi import point_at_local
from .room import DiscordResumeRoom

log = logging.getLogger(__name__)


class StartupError(Exception):
    """One line that says what stopped start-up and where."""


class ProviderKeyRejected(StartupError):
    """A provider refused its key at start-up (HTTP 401/403): no reply could be generated, so none start."""


@dataclass
class Deployment:
    residences: list[Residence]
    tokens: dict[str, str]
    checkpoints: Checkpoints | None = None  # residents.yaml's `ledger.checkpoints`: posted by the commands bot


def process_shards(spec: str) -> ShardSettings:
    """`residents run --shards SPEC`: `auto`, `N` (every shard of N) or `N:0,2` (shards 0 and 2 of N), checked
    as `discord.shards` is; a problem is one StartupError line naming the option."""
    count, _, ids = spec.strip().partition(":")
    data: dict[str, object] = {"count": None if count == "auto" else count}
    try:
        if count != "auto":
            data["count"] = int(count)
        if ids:
            data["ids"] = [int(i) for i in ids.split(",")]
    except ValueError:
        raise StartupError(f"--shards {spec}: write auto, N, or N:ID,ID,... (e.g. 4:0,2)") from None
    try:
        return ShardSettings.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        problem = (err.get("ctx") or {}).get("error")
        raise StartupError(f"--shards {spec}: {getattr(problem, 'message', None) or err['msg']}") from None


def plan_deployment(
    base: Path, local_api: bool, env: dict[str, str] | None = None, shards: ShardSettings | None = None
) -> Deployment:
    """Residences with Discord settings and their tokens; against a local room any token will do.

    Every variable start-up needs and does not find (tokens, the provider key) is named in one line.
    `shards` (`residents run --shards`) is this process's sharding for every bot, in place of each
    residence's `discord.shards`.
    """
    env = dict(os.environ if env is None else env)
    folder = base / "residences"
    if not any(folder.glob("*.yaml")):
        where = f"no {folder} folder" if not folder.is_dir() else f"no residences in {folder}"
        raise StartupError(f"{where}: `residents init` writes a starter set (or pass --config DIR)")
    residences = [r for r in load_all_residences(base) if r.discord is not None]
    if shards is not None:
        residences = [
            r.model_copy(update={"discord": r.discord.model_copy(update={"shards": shards})})
            for r in residences
            if r.discord is not None
        ]
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
    return Deployment(residences, tokens, load_project(base).ledger.checkpoints)


def provider_endpoints(residences: list[Residence], env: Mapping[str, str]) -> dict[str, tuple[str, Endpoint]]:
    """Each residence's provider and where it is called, from the registry and the environment `env`."""
    out = {}
    for r in residences:
        try:
            out[r.name] = r.provider, endpoint(r.provider, r.base_url, r.api_key_env, env)
        except MissingKey as e:
            raise StartupError(str(e)) from None
    return out


async def start_bot(bot: ResidentBot, token: str, outbox: Outbox) -> None:
    """`Bot.start`, with the residence's undelivered posts tried once between login and connect.

    What cannot be delivered yet stays first in its channel's queue and is retried with backoff;
    nothing planned later overtakes it.
    """
    await bot.login(token)
    room = DiscordResumeRoom(bot, views=lambda post: receipt_view(bot, post))
    await withdraw_left_in_progress(outbox.ledger, room, bot.residence.name)  # a live reply cut by a stop
    outbox.register(bot.residence.name, room)
    await outbox.resume(bot.residence.name)
    await bot.connect()


async def run_bots(
    dep: Deployment,
    db: str,
    env: Mapping[str, str],
    guild_ready_timeout: float = 2.0,
    stop: asyncio.Event | None = None,
    key_rejections: KeyRejections | None = None,
    backoff: Backoff | None = None,
    announce: Callable[[list[ResidentBot]], None] | None = None,
    metrics_port: int | None = None,
    ready_post_age: float = READY_POST_AGE,
    serving: Callable[[str], None] | None = None,
) -> None:
    """The bots of `dep` until `stop` is set (or a signal); a start-up problem raises StartupError.

    `env`: where each residence's provider reads its settings (the process's environment in
    `residents run`). `key_rejections` is shared by every resident (one notice per channel, whoever
    failed); a test passes its own to control the clock. `backoff` paces redelivery after a room
    failure. `announce` is told once, when every bot is ready. `metrics_port`: metrics and health
    are served on 127.0.0.1 from before anything connects (`residents.metrics`), and `serving` is told
    their base URL; `/readyz` fails while a post has waited longer than `ready_post_age` seconds.
    """
    if metrics_port is None:
        await _run(dep, db, env, guild_ready_timeout, stop, key_rejections, backoff, announce, None)
        return
    metrics = Metrics([r.name for r in dep.residences], ready_post_age)
    server = MetricsServer(metrics)
    try:
        url = await server.start(metrics_port)
    except MetricsPortInUse as e:
        raise StartupError(str(e)) from None
    try:
        if serving is not None:
            serving(url)
        await _run(dep, db, env, guild_ready_timeout, stop, key_rejections, backoff, announce, metrics)
    finally:
        await server.stop()


async def _run(
    dep: Deployment,
    db: str,
    env: Mapping[str, str],
    guild_ready_timeout: float,
    stop: asyncio.Event | None,
    key_rejections: KeyRejections | None,
    backoff: Backoff | None,
    announce: Callable[[list[ResidentBot]], None] | None,
    metrics: Metrics | None,
) -> None:
    endpoints = provider_endpoints(dep.residences, env)
    providers = connect_all((name, prov, where) for name, (prov, where) in endpoints.items())
    try:
        for p in {id(p): p for p in providers.values()}.values():
            try:
                await p.check_key()
            except KeyRejected as e:
                raise ProviderKeyRejected(str(e)) from None
        if key_rejections is None:
            key_env_of = {name: where.key_env for name, (_, where) in endpoints.items()}
            key_rejections = KeyRejections("the provider's key", key_env_of=key_env_of)  # every residence named
        async with Ledger.open(db) as ledger:
            if metrics is not None:
                ledger.observer = metrics
                metrics.sources.ledger_open = lambda: not ledger.db.closed
            # Before any bot connects: what a stopped process left open is settled and planned.
            await recover(ledger, {r.name for r in dep.residences})
            await _serve(dep, ledger, providers, guild_ready_timeout, stop, key_rejections, backoff, announce, metrics)
    finally:
        await close_all(providers.values())


async def _serve(
    dep: Deployment,
    ledger: Ledger,
    providers: dict[str, Provider],
    guild_ready_timeout: float,
    stop: asyncio.Event | None,
    key_rejections: KeyRejections,
    backoff: Backoff | None,
    announce: Callable[[list[ResidentBot]], None] | None,
    metrics: Metrics | None = None,
) -> None:
    """The bots, on an open ledger and each residence's provider (their owner closes them), until `stop`
    or a problem. `metrics`, when served, observes every part and reads the outbox and the bots' sessions."""
    registry: dict[str, Resident] = {}
    bots: list[ResidentBot] = []
    outbox = Outbox(ledger, backoff)
    observer: Observer = metrics if metrics is not None else UNOBSERVED
    outbox.observer = observer
    try:
        generator = Generator(AttemptRunner(providers, ledger, observer=observer))
        board = LiveBoard()  # the process's live messages in progress, as its outbox is the process's
        for r in dep.residences:
            registry[r.name] = Resident(r, generator, ledger, outbox, key_rejections)
            registry[r.name].board = board
            registry[r.name].observer = observer
        commander = commands_bot_of(dep.residences)
        peers: dict[str, ResidentBot] = {}
        for r in dep.residences:
            bot_class = sharded(ResidentBot) if r.discord is not None and r.discord.shards is not None else ResidentBot
            bots.append(
                bot_class(
                    registry[r.name],
                    registry,
                    guild_ready_timeout=guild_ready_timeout,
                    commands_bot=r.name == commander,
                    peers=peers,
                    checkpoints=dep.checkpoints if r.name == commander else None,
                )
            )
            peers[r.name] = bots[-1]
        if metrics is not None:
            metrics.sources.backlog = outbox.backlog
            metrics.sources.sessions = lambda: {b.residence.name: b.gateway_session and not b.is_closed() for b in bots}
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
            elif isinstance(exc, discord.ConnectionClosed) and exc.code in (
                CLOSE_INVALID_SHARD,
                CLOSE_SHARDING_REQUIRED,
            ):
                problem = shard_refusal(b.residence, exc.code, exc.shard_id)
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


CLOSE_INVALID_SHARD = 4010  # Discord's gateway close codes: "Invalid shard"
CLOSE_SHARDING_REQUIRED = 4011  # "Sharding required": a session would carry too many guilds


def shard_refusal(residence: Residence, code: int, shard_id: int | None) -> str:
    """The one line for a gateway that refused the bot's sharding (close code 4010 or 4011)."""
    where = f"residences/{residence.name}.yaml: discord.shards"
    settings = residence.discord.shards if residence.discord is not None else None
    if code == CLOSE_INVALID_SHARD:
        return f"{where}: the gateway refused shard {shard_id} as invalid (close code 4010)"
    if settings is None:
        return (
            f"{where}: the gateway requires sharding (close code 4011): the bot is in more guilds than one "
            "session may carry; set discord.shards: auto"
        )
    return (
        f"{where}: shard {shard_id} of {settings.count if settings.count is not None else 'the recommended count'} "
        "would carry more guilds than one session may (close code 4011); set a larger count, or auto"
    )


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


def main(
    base: Path,
    db: str,
    discord_api: str | None,
    shards: str | None = None,
    metrics_port: int | None = None,
    ready_post_age: float = READY_POST_AGE,
) -> int:
    """`residents run`: log lines go through the root logger's one handler (set up by the CLI), once."""
    dep = plan_deployment(
        base, local_api=discord_api is not None, shards=process_shards(shards) if shards is not None else None
    )
    if discord_api:
        point_at_local(discord_api)
    gc.freeze()  # everything imported lives as long as the process: out of the collector's full passes

    def announce(bots: list[ResidentBot]) -> None:
        print(startup.table(start_rows(bots, discord_api is not None), postgres.shown(db)), flush=True)

    # Refused (LedgerInUse, exit 2) while another process writes this ledger: before the provider is
    # asked anything or the ledger read. `run_bots`' own opening shares this process's hold.
    holding = hold_ledger(db)
    try:
        asyncio.run(
            run_bots(
                dep,
                db,
                os.environ,
                announce=announce,
                metrics_port=metrics_port,
                ready_post_age=ready_post_age,
                serving=lambda url: print(f"metrics: {url}/metrics; health: {url}/healthz, {url}/readyz", flush=True),
            )
        )
    finally:
        holding.release()
    return 0
