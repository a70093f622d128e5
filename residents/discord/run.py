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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import discord
from pydantic import ValidationError

from ..config import Checkpoints, Residence, ShardSettings, load_all_residences, load_project
from ..delivery.keys import KeyRejections
from ..delivery.live import LiveBoard, withdraw_left_in_progress
from ..delivery.outbox import Backoff, Outbox
from ..delivery.resume import open_channels, recover
from ..generation.attempts import AttemptRunner
from ..generation.run import Generator
from ..ledger import Ledger, hold_ledger, leases, postgres
from ..metrics import READY_POST_AGE, Metrics, MetricsPortInUse, MetricsServer
from ..observe import UNOBSERVED, Observer
from ..provider import Endpoint, KeyRejected, MissingKey, Provider, close_all, connect_all, endpoint
from ..resident import Resident
from . import startup
from .app import ResidentBot, commands_bot_of, names_channel, sharded
from .buttons import receipt_view
from .forward import Forwarder
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


async def start_bot(
    bot: ResidentBot,
    token: str,
    outbox: Outbox,
    prepare: Callable[[ResidentBot], Awaitable[None]] | None = None,
) -> None:
    """`Bot.start`, with the residence's undelivered posts tried once between login and connect.

    What cannot be delivered yet stays first in its channel's queue and is retried with backoff;
    nothing planned later overtakes it. `prepare` runs first after login (the bot can read the room).
    """
    await bot.login(token)
    if prepare is not None:
        await prepare(bot)
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
    terms: leases.Terms | None = None,
) -> None:
    """The bots of `dep` until `stop` is set (or a signal); a start-up problem raises StartupError.

    `env`: where each residence's provider reads its settings (the process's environment in
    `residents run`). `key_rejections` is shared by every resident (one notice per channel, whoever
    failed); a test passes its own to control the clock. `backoff` paces redelivery after a room
    failure. `announce` is told once, when every bot is ready. `metrics_port`: metrics and health
    are served on 127.0.0.1 from before anything connects (`residents.metrics`), and `serving` is told
    their base URL; `/readyz` fails while a post has waited longer than `ready_post_age` seconds.
    On a PostgreSQL ledger the process is one of any number sharing it: it drives only the bots (or shards)
    it holds a lease on, on `terms` (`residents.ledger.leases`; `_serve_leased`).
    """
    if metrics_port is None:
        await _run(dep, db, env, guild_ready_timeout, stop, key_rejections, backoff, announce, None, terms)
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
        await _run(dep, db, env, guild_ready_timeout, stop, key_rejections, backoff, announce, metrics, terms)
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
    terms: leases.Terms | None = None,
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
        shared = postgres.is_url(db)
        async with Ledger.open(db, shared=shared) as ledger:
            if metrics is not None:
                ledger.observer = metrics
                metrics.sources.ledger_open = lambda: not ledger.db.closed
            if shared:
                await _serve_leased(
                    dep, ledger, providers, guild_ready_timeout, stop, key_rejections, backoff, announce, metrics,
                    terms or leases.Terms(),
                )  # fmt: skip
                return
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
            problem = _task_problem(b, t)
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


def lease_units(residences: list[Residence]) -> list[leases.Unit]:
    """What the processes on one ledger share out: each bot, or each shard of a bot with a fixed count (the
    ids `discord.shards` names, or all of them); a bot on `auto` shards is one unit (its count is Discord's)."""
    units = []
    for r in residences:
        settings = r.discord.shards if r.discord is not None else None
        if settings is None or settings.count is None:
            units.append(leases.Unit(r.name))
        else:
            ids = settings.ids if settings.ids is not None else range(settings.count)
            units += [leases.Unit(r.name, i) for i in ids]
    return units


def _task_problem(b: ResidentBot, t: asyncio.Task[Any]) -> str:
    """The one line that stops `run` when a bot's task ended: a rejected token, a refused sharding, a
    connection that failed, or the problem the bot found as it got ready."""
    exc = t.exception()
    if isinstance(exc, discord.LoginFailure):
        return (
            f"residences/{b.residence.name}.yaml: discord.token_env: the token in "
            f"{b.residence.discord.token_env if b.residence.discord else '?'} was rejected"
        )
    if isinstance(exc, discord.ConnectionClosed) and exc.code in (CLOSE_INVALID_SHARD, CLOSE_SHARDING_REQUIRED):
        return shard_refusal(b.residence, exc.code, exc.shard_id)
    if exc is not None:
        return f"{b.residence.name}: could not connect to Discord: {type(exc).__name__}: {exc}"
    return b.startup_problem or f"{b.residence.name}: the bot stopped"


def _stop_waiting_for_ready(bot: discord.Client) -> None:
    """A bot stopped before it is ready leaves discord.py's wait for its guilds running, which would
    dispatch `ready` on the closed client: cancelled (discord.py offers no public way)."""
    state = getattr(bot, "_connection", None)
    for waiting in [getattr(state, "_ready_task", None), *getattr(state, "_ready_tasks", {}).values()]:
        if isinstance(waiting, asyncio.Task):
            waiting.cancel()


class _Driven:
    """The bots this process drives on a shared ledger: started as their leases are taken (the residence's
    open generations settled first, its undelivered posts resumed), stopped at once when one is lost."""

    def __init__(
        self,
        dep: Deployment,
        ledger: Ledger,
        outbox: Outbox,
        registry: dict[str, Resident],
        keeper: leases.Leases,
        guild_ready_timeout: float,
    ) -> None:
        self.dep, self.ledger, self.outbox, self.registry, self.keeper = dep, ledger, outbox, registry, keeper
        self.guild_ready_timeout = guild_ready_timeout
        self.residences = {r.name: r for r in dep.residences}
        self.commander = commands_bot_of(dep.residences)
        self.bots: dict[str, ResidentBot] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.shards: dict[str, frozenset[int | None]] = {}  # what each running bot carries
        self.peers: dict[str, ResidentBot] = {}
        self._guilds: dict[str, int | None] = {}  # channel id → its guild's id, as the room said
        self.resuming: set[asyncio.Task[int]] = set()
        self.changed = asyncio.Event()  # set when a bot is stopped (`announce_when_ready` waits no more for it)
        self.starting = True  # until the first renewal is acted on: what is taken then is the start's share
        self.withheld = 0  # surplus units kept at the last renewal because a reply of theirs was under way
        self.forwarder: Forwarder | None = None  # carried /continue requests, once the process is registered

    def _count(self, name: str) -> int | None:
        r = self.residences[name]
        settings = r.discord.shards if r.discord is not None else None
        return settings.count if settings is not None else None

    async def fence(self, residence: str, channel: str) -> bool:
        """Whether this process's lease covers a post as `residence` in `channel` now: the bot's lease, or
        for a sharded bot the lease of the shard carrying the channel's guild (direct messages: shard 0)."""
        count = self._count(residence)
        if count is None:
            return self.keeper.may_post(residence)
        bot = self.bots.get(residence)
        if bot is None or not channel.isdigit():
            return False
        if channel not in self._guilds:
            found = bot.get_channel(int(channel))
            if found is None:
                try:
                    found = await bot.fetch_channel(int(channel))
                except (TimeoutError, discord.HTTPException, OSError):
                    return False  # unknown here: not this process's to post, this time
            guild = getattr(found, "guild", None)
            self._guilds[channel] = guild.id if guild is not None else None
        guild_id = self._guilds[channel]
        shard = 0 if guild_id is None else (guild_id >> 22) % count
        return self.keeper.may_post(leases.Unit(residence, shard).key)

    async def _recover_shards(self, bot: ResidentBot) -> None:
        """After login, before the outbox resumes: settle and plan what a stopped process left open in the
        channels of the shards this process now holds (the bot's other shards may run on elsewhere)."""
        name = bot.residence.name
        mine = [c for c in await open_channels(self.ledger, name) if await self.fence(name, c)]
        if mine:
            await recover(self.ledger, {name}, mine)

    def wanted(self) -> dict[str, frozenset[int | None]]:
        """Per residence, the shards (None: the whole bot) this process's leases cover now."""
        out: dict[str, set[int | None]] = {}
        for key in self.keeper.held:
            unit = leases.unit_of(key)
            out.setdefault(unit.residence, set()).add(unit.shard)
        return {name: frozenset(shards) for name, shards in out.items()}

    async def start(self, name: str, shards: frozenset[int | None]) -> None:
        r = self.residences[name]
        count = self._count(name)
        if count is not None and r.discord is not None and r.discord.shards is not None:
            ids = sorted(i for i in shards if i is not None)
            r = r.model_copy(
                update={"discord": r.discord.model_copy(update={"shards": ShardSettings(count=count, ids=ids)})}
            )
            self.registry[name].residence = r
            prepare: Callable[[ResidentBot], Awaitable[None]] | None = self._recover_shards
        else:
            # The previous holder is gone (its lease ran out): what it left open is settled and planned now.
            await recover(self.ledger, {name})
            prepare = None
        bot_class = sharded(ResidentBot) if r.discord is not None and r.discord.shards is not None else ResidentBot
        bot = bot_class(
            self.registry[name],
            self.registry,
            guild_ready_timeout=self.guild_ready_timeout,
            commands_bot=name == self.commander,
            peers=self.peers,
            checkpoints=self.dep.checkpoints if name == self.commander else None,
        )
        keys = [leases.Unit(name, shard).key for shard in shards]
        since = [self.keeper.driven_since[k] for k in keys if k in self.keeper.driven_since]
        bot.driven_elsewhere_since = min(since, default=None)
        bot.forwarder = self.forwarder
        self.bots[name] = self.peers[name] = bot
        self.shards[name] = shards
        self.tasks[name] = asyncio.create_task(
            start_bot(bot, self.dep.tokens[name], self.outbox, prepare), name=f"bot:{name}"
        )
        # At start, a process takes its share; later, what it takes was another process's: said louder.
        log.log(
            logging.INFO if self.starting else logging.WARNING,
            "leases: %s now runs here%s",
            name,
            "" if count is None else f" (shards {sorted(i for i in shards if i is not None)} of {count})",
        )

    async def halt(self, name: str, why: str) -> None:
        """Stop a bot at once: nothing more of it is posted from here (the fence says so already)."""
        bot, task = self.bots.pop(name), self.tasks.pop(name)
        self.peers.pop(name, None)
        self.shards.pop(name, None)
        self.outbox.unregister(name)
        self.changed.set()
        _stop_waiting_for_ready(bot)
        await bot.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        _stop_waiting_for_ready(bot)  # (a READY that arrived while it closed began another wait)
        log.warning("leases: %s stopped here: %s", name, why)

    async def _busy(self, name: str) -> bool:
        """Whether `name` has a reply being generated (an open generation): not given up while it has, so
        the process taking it over never settles a turn that is still running here."""
        for gid in await self.ledger.unsettled_generations():
            g = await self.ledger.get_generation(gid)
            if g is not None and g.residence == name:
                return True
        return False

    async def settle(self, lost: list[str], excess: list[str], why: str = "its lease was taken") -> None:
        """Make the bots running match the leases held: stop what was lost or is given up (once idle), start
        what was taken."""
        idle = [key for key in excess if not await self._busy(leases.unit_of(key).residence)]
        self.withheld = len(excess) - len(idle)
        excess = idle
        for key in excess:
            self.keeper.forget(key)  # no post of it from here, before another process may take it
        wanted = self.wanted()
        for name in list(self.bots):
            if wanted.get(name) != self.shards[name]:
                await self.halt(name, why if lost else "another process shares the bots now")
        if excess:
            await self.keeper.release(excess)
        for name, shards in wanted.items():
            if name not in self.bots:
                await self.start(name, shards)
        self.starting = False
        for name in self.outbox.left & set(self.bots):
            # Its lease lapsed here for a moment (the database was slow) and is renewed: what the fence
            # left in the ledger meanwhile goes out now, in order, ahead of anything new.
            self.outbox.left.discard(name)
            self.resuming.add(asyncio.create_task(self.outbox.resume(name), name=f"resume:{name}"))
            self.resuming = {t for t in self.resuming if not t.done()}

    async def announce_when_ready(self, announce: Callable[[list[ResidentBot]], None] | None) -> None:
        """`announce` the bots this process took at start once each is ready, or given up meanwhile."""
        if announce is None:
            return
        first = list(self.bots.values())
        while waiting := [b for b in first if not b.settled.is_set() and self.bots.get(b.residence.name) is b]:
            self.changed.clear()
            watches = [asyncio.ensure_future(e.wait()) for e in [self.changed, *(b.settled for b in waiting)]]
            try:
                await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for watch in watches:
                    watch.cancel()
        announce([b for b in first if b.settled.is_set()])

    async def close(self) -> None:
        for task in self.resuming:
            task.cancel()
        await asyncio.gather(*self.resuming, return_exceptions=True)
        for name in list(self.bots):
            await self.halt(name, "the process stops")


async def _serve_leased(
    dep: Deployment,
    ledger: Ledger,
    providers: dict[str, Provider],
    guild_ready_timeout: float,
    stop: asyncio.Event | None,
    key_rejections: KeyRejections,
    backoff: Backoff | None,
    announce: Callable[[list[ResidentBot]], None] | None,
    metrics: Metrics | None,
    terms: leases.Terms,
) -> None:
    """One of several processes on a PostgreSQL ledger: every `terms.renew` seconds renew the leases held,
    take a fair share of the free ones, and start or stop bots to match (`_Driven`), until `stop`."""
    try:
        # A renewal fails rather than waits; its new connections take the shared writer lock again.
        conn = await postgres.connect(ledger.path, reconnect=postgres.AT_ONCE, writer="shared")
    except Exception as e:
        raise StartupError(f"{postgres.shown(ledger.path)}: cannot open the ledger: {postgres.reason(e)}") from None
    keeper = leases.Leases(conn, lease_units(dep.residences), terms)
    outbox = Outbox(ledger, backoff)
    observer: Observer = metrics if metrics is not None else UNOBSERVED
    outbox.observer = observer
    generator = Generator(AttemptRunner(providers, ledger, observer=observer))
    board = LiveBoard()
    registry: dict[str, Resident] = {}
    for r in dep.residences:
        registry[r.name] = Resident(r, generator, ledger, outbox, key_rejections)
        registry[r.name].board = board
        registry[r.name].observer = observer
    driven = _Driven(dep, ledger, outbox, registry, keeper, guild_ready_timeout)
    outbox.fence = driven.fence
    if metrics is not None:
        metrics.sources.backlog = outbox.backlog
        metrics.sources.sessions = lambda: {
            name: b.gateway_session and not b.is_closed() for name, b in driven.bots.items()
        }
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    announcer: asyncio.Task[None] | None = None
    listener: leases.Listener | None = None
    problem = None
    failing = False  # the last renewal failed: said once at warning, then at info until one succeeds
    try:
        try:
            await keeper.start()
        except Exception as e:
            raise StartupError(
                f"{postgres.shown(ledger.path)}: cannot register this process: {postgres.reason(e)}"
            ) from None
        forwarder = driven.forwarder = Forwarder(conn, keeper.process, registry, driven.bots, driven.fence)
        listener = leases.Listener(ledger.path, keeper.process, also=forwarder.channels())
        while not stop.is_set():
            await listener.ensure()
            listener.woken.clear()  # what is told from now on is seen by this renewal or wakes the next
            try:
                got = await keeper.tick()
                lost, excess = got.lost, got.excess
                failing = False
            except Exception as e:  # the server cannot be reached: what ran out stops, the rest waits
                log.log(
                    logging.INFO if failing else logging.WARNING,
                    "leases: renewal failed (tried again every %gs; the bots stop as their leases run out): %s",
                    terms.renew,
                    postgres.reason(e),
                )
                failing = True
                lost, excess = keeper.expired(), []
                for key in lost:
                    keeper.forget(key)
            await driven.settle(lost, excess, "its lease ran out unrenewed" if failing else "its lease was taken")
            if not failing:
                try:
                    await forwarder.sweep()  # /continue requests for bots driven here that no notice brought
                except Exception as e:
                    log.info("leases: could not look for /continue requests (looked again next renewal): %s", e)
            if announcer is None:
                announcer = asyncio.create_task(driven.announce_when_ready(announce))
            ended = [name for name, t in driven.tasks.items() if t.done()]
            if ended:
                problem = _task_problem(driven.bots[ended[0]], driven.tasks[ended[0]])
                break
            # Next renewal: in `terms.renew` s, or at once when another process tells of a handover; soon when
            # a surplus unit was kept for a reply under way (the process short of it waits for it meanwhile).
            waits: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(listener.woken.wait()),
                *driven.tasks.values(),
            ]
            pause = min(terms.renew, HANDOVER_RETRY) if driven.withheld else terms.renew
            await asyncio.wait(waits, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
            waits[0].cancel()
            waits[1].cancel()
    finally:
        if announcer is not None:
            announcer.cancel()
        if listener is not None:
            await listener.close()
        if driven.forwarder is not None:
            await driven.forwarder.close()
        await outbox.close()
        await driven.close()
        await keeper.stop()
        await conn.close()
    if problem and not stop.is_set():
        raise StartupError(problem)


HANDOVER_RETRY = 0.5  # seconds between renewals while a surplus unit waits for its reply to end

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
    terms: leases.Terms | None = None,
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
    # asked anything or the ledger read. `run_bots`' own opening shares this process's hold. On PostgreSQL
    # any number of processes share the ledger, each bot driven by one of them under a lease.
    holding = None if postgres.is_url(db) else hold_ledger(db)
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
                terms=terms,
            )
        )
    finally:
        if holding is not None:
            holding.release()
    return 0
