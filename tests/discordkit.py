"""End-to-end kit for the Discord side: `residents run`'s own `run_bots` on the local room and provider.

    async with deployed(tmp_path, [residence(...)], calls=[Call(sse=...)]) as d:
        d.room.post("general", "alice", "hello @cairn", mentions=["cairn"])
        await d.bot_messages(1)

Everything goes over real sockets: discord.py ↔ the local room server (REST + gateway), the anthropic
SDK ↔ the local provider server; the ledger is a real SQLite file. Errors discord.py swallows in
background tasks fail the test (roomkit's `error_guard`, on top of conftest's autouse guard).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import discord
from aiohttp import web

from residents.config import Checkpoints, Residence
from residents.discord import run as run_mod
from residents.discord.app import ResidentBot
from residents.discord.run import Deployment, run_bots
from residents.ledger import Ledger, postgres
from residents.localservers.provider import Call, ProviderServer, Responder
from residents.localservers.room import Layout, RoomServer

try:
    from roomkit import error_guard, eventually, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import error_guard, eventually, running_room

READY_TIMEOUT = 10.0


class GatedProvider(ProviderServer):
    """The local provider, able to hold requests before answering (a slow model) until released."""

    def __init__(self, responder: Responder | None = None) -> None:
        super().__init__(responder)
        self.gate: asyncio.Event | None = None
        self.arrived = 0  # requests received, held or not

    def hold(self) -> None:
        self.gate = asyncio.Event()

    def release(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self.gate = None

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        self.arrived += 1
        gate = self.gate
        if gate is not None:
            await asyncio.wait_for(gate.wait(), timeout=READY_TIMEOUT)
        return await super()._messages(request)


@dataclass
class Deployed:
    room: RoomServer
    provider: GatedProvider
    ledger: Ledger  # a second connection to the bots' ledger, for reading
    db: Path | str  # the bots' ledger: a SQLite file, or a PostgreSQL database's URL
    bots: list[ResidentBot]
    stop: asyncio.Event
    task: asyncio.Task[None]
    seen: dict[str, list[int]] = field(default_factory=dict)  # message ids each bot's on_message saw

    def bot(self, name: str) -> ResidentBot:
        return next(b for b in self.bots if b.residence.name == name)

    def messages(self, channel: str = "general") -> list[dict[str, Any]]:
        return self.room.messages(channel)

    def bot_messages(self, channel: str = "general") -> list[dict[str, Any]]:
        return [m for m in self.room.messages(channel) if m["bot"]]

    async def wait_bot_messages(self, n: int, channel: str = "general", timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until at least `n` bot messages are in the channel; returns them all."""
        return await self.room.wait_until(
            lambda: (lambda ms: ms if len(ms) >= n else None)(self.bot_messages(channel)), timeout=timeout
        )

    async def wait_receipt(self, channel: str = "general", timeout: float = 10.0) -> dict[str, Any]:
        return await self.room.wait_for_message(
            lambda m: m["bot"] and m["content"].startswith("-# "), channel=channel, timeout=timeout
        )

    async def wait_seen(self, bot: str, message_id: str, timeout: float = 5.0) -> None:
        """Wait until `bot`'s on_message listeners have been handed `message_id` (and have run a step)."""
        await eventually(lambda: int(message_id) in self.seen.get(bot, []), timeout=timeout)
        await asyncio.sleep(0.02)  # the cog's listener was scheduled before ours: let it take its step

    async def quiet(self, seconds: float = 0.3) -> None:
        """Wait until nothing new happens in the room or at the provider for `seconds`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT
        last = None
        while loop.time() < deadline:
            now = (sum(len(c.messages) for c in self.room.state.channels.values()), self.provider.arrived)
            if now == last:
                return
            last = now
            await asyncio.sleep(seconds)
        raise AssertionError("the room never went quiet")

    async def command(
        self,
        member: str,
        name: str,
        options: list[dict[str, Any]] | None = None,
        *,
        bot: str = "cairn",
        moderator: bool = True,
        channel: str = "general",
    ) -> dict[str, Any]:
        out = await self.room.invoke_command(
            channel, member, name, bot=bot, options=options or [], moderator=moderator, timeout=10.0, settle=0.1
        )
        assert not out["timed_out"], out
        return out

    async def generations(self, residence: str = "cairn") -> list[Any]:
        rows = await self.ledger.list_generations(residence, limit=100)
        out = [await self.ledger.get_generation(r["id"]) for r in rows]
        return sorted(out, key=lambda g: g.created_at)


def sub(name: str, **options: Any) -> list[dict[str, Any]]:
    """Options for a subcommand `/group name k:v ...`."""
    return [{"name": name, "type": 1, "options": [{"name": k, "value": v} for k, v in options.items()]}]


def opts(**options: Any) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in options.items()]


@contextlib.asynccontextmanager
async def deployed(
    tmp_path: Path,
    residences: Sequence[Residence],
    *,
    calls: Sequence[Call] = (),
    responder: Responder | None = None,
    channels: Sequence[str] = ("general",),
    layout: Layout | None = None,
    expected_errors: Sequence[str] = (),
    checkpoints: Checkpoints | None = None,
    db: str | None = None,
    **run_options: Any,
) -> AsyncIterator[Deployed]:
    """`run_bots` for `residences` (token `local-NAME`) until every bot is connected with its commands synced
    (in every guild of `layout`, when the room is built from one).

    `expected_errors`: substrings of ERROR lines the test provokes on purpose; `checkpoints`: residents.yaml's
    `ledger.checkpoints`; `db`: the ledger (a path or a URL; `ledger.db` in tmp_path unless given);
    `run_options` go to `run_bots`.
    """
    bots: list[ResidentBot] = []
    seen: dict[str, list[int]] = {}

    class TrackedBot(ResidentBot):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            bots.append(self)
            name = self.residence.name
            seen[name] = []

            async def on_message(message: discord.Message) -> None:
                seen[name].append(message.id)

            self.add_listener(on_message)

    where: Path | str = tmp_path / "ledger.db" if db is None else db
    async with error_guard() as guard, running_room(channels, layout=layout) as room:
        guard.ignore.extend(lambda problem, e=e: e in problem for e in expected_errors)
        provider = GatedProvider(responder)
        await provider.start()
        provider.enqueue(list(calls))
        stop = asyncio.Event()
        saved = run_mod.ResidentBot
        run_mod.ResidentBot = TrackedBot  # type: ignore[misc]
        task = asyncio.create_task(
            run_bots(
                Deployment(list(residences), {r.name: f"local-{r.name}" for r in residences}, checkpoints),
                str(where),
                {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "test-key", **run_options.pop("env", {})},
                guild_ready_timeout=0.05,
                stop=stop,
                **run_options,
            )
        )
        ledger: Ledger | None = None
        try:
            names = {r.name for r in residences}

            def ready() -> bool:
                if task.done():
                    task.result()
                    raise AssertionError("run_bots stopped before the bots were ready")
                state = {b["name"]: b for b in room.snapshot()["bots"]}
                return (
                    all(n in state and state[n]["connected"] and synced(n) for n in names)
                    and len(bots) == len(names)
                    and all(b.is_ready() for b in bots)
                )

            def synced(name: str) -> bool:
                """The bot has put its command list in every guild of the room its gateway sessions carry (all of
                them, unless it runs some of its shards; on_ready syncs them one by one): the moderators' commands
                for the commands bot, an empty list for the others."""
                app = room.state.bot_by_name(name)
                if app is None:
                    return False
                sessions = room.gateway.live_sessions(app)
                carried = [g for g in room.state.guilds.values() if any(s.carries(g.id) for s in sessions)]
                return bool(carried) and all((app.id, g.id) in room.state.synced for g in carried)

            await eventually(ready, timeout=READY_TIMEOUT)
            # On PostgreSQL `run_bots` holds the writer lock shared: a reader beside it, as `residents ledger` is.
            ledger = await Ledger.open(where, read_only=postgres.is_url(str(where)))
            yield Deployed(room, provider, ledger, where, bots, stop, task, seen)
        finally:
            run_mod.ResidentBot = saved  # type: ignore[misc]
            provider.release()
            stop.set()
            try:
                await asyncio.wait_for(task, timeout=10.0)
            finally:
                if ledger is not None:
                    await ledger.close()
                await provider.stop()
