"""End-to-end test kit: a local room, real discord.py bots on it, and a guard for swallowed errors.

discord.py runs event handlers and payload parsing in background tasks; an exception there
is only logged (or reported as "Task exception was never retrieved" at garbage collection),
so a test can pass while the bot crashed. `error_guard` turns those into test failures.

    async with error_guard(), running_room() as room:
        async with running_bot(room.url, "local-cairn", setup=add_cogs) as bot:
            room.post("general", "alice", "hello @cairn")
            await room.wait_for_message(lambda m: m["author"] == "cairn")
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import pathlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # lets the kit work even when the project isn't pip-installed
    sys.path.insert(0, str(ROOT))

import discord  # noqa: E402
from discord.ext import commands  # noqa: E402

from residents.discord.localapi import point_at_local  # noqa: E402
from residents.localservers.room import RoomServer  # noqa: E402

log = logging.getLogger(__name__)

Setup = Callable[[commands.Bot], Awaitable[None] | None]


@dataclass
class ErrorGuard:
    """ERROR log records and loop exception contexts seen while the guard was active."""

    records: list[logging.LogRecord] = field(default_factory=list)
    loop_errors: list[dict[str, Any]] = field(default_factory=list)
    ignore: list[Callable[[str], bool]] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = []
        for rec in self.records:
            text = rec.getMessage()
            if rec.exc_info and rec.exc_info[1] is not None:
                text += f" ({rec.exc_info[1]!r})"
            found.append(f"{rec.name}: {text}")
        for ctx in self.loop_errors:
            exc = ctx.get("exception")
            found.append(f"event loop: {ctx.get('message')}" + (f" ({exc!r})" if exc else ""))
        return [p for p in found if not any(skip(p) for skip in self.ignore)]

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise AssertionError("errors swallowed in background tasks:\n  " + "\n  ".join(problems))


class _Capture(logging.Handler):
    def __init__(self, guard: ErrorGuard) -> None:
        super().__init__(level=logging.ERROR)
        self.guard = guard

    def emit(self, record: logging.LogRecord) -> None:
        self.guard.records.append(record)


@contextlib.asynccontextmanager
async def error_guard(
    loggers: Sequence[str] = ("discord", "residents", "aiohttp", "asyncio"),
) -> AsyncIterator[ErrorGuard]:
    """Collect ERROR records from `loggers` and the running loop's exception handler; fail at exit."""
    guard = ErrorGuard()
    capture = _Capture(guard)
    watched = [logging.getLogger(name) for name in loggers]
    for logger in watched:
        logger.addHandler(capture)
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: guard.loop_errors.append(context))
    failed = False
    try:
        yield guard
    except BaseException:
        failed = True
        raise
    finally:
        gc.collect()  # surfaces "Task exception was never retrieved" while our handler is installed
        await asyncio.sleep(0)
        loop.set_exception_handler(previous)
        for logger in watched:
            logger.removeHandler(capture)
        if not failed:
            guard.check()


@contextlib.asynccontextmanager
async def running_room(
    channels: Sequence[str] = ("general",), guild_name: str = "residents", **kwargs: Any
) -> AsyncIterator[RoomServer]:
    """A RoomServer on a free port, with discord.py pointed at it; stopped on exit."""
    server = RoomServer(list(channels), guild_name, **kwargs)
    saved = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
    await server.start()
    point_at_local(server.url)
    try:
        yield server
    finally:
        await server.stop()
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved


def default_intents() -> discord.Intents:
    intents = discord.Intents.default()
    intents.message_content = True
    intents.members = True
    return intents


@contextlib.asynccontextmanager
async def running_bot(
    server_url: str,
    token: str,
    *,
    setup: Setup | None = None,
    intents: discord.Intents | None = None,
    sync_commands: bool = False,
    ready_timeout: float = 10.0,
    bot_class: type[commands.Bot] = commands.Bot,
    **bot_kwargs: Any,
) -> AsyncIterator[commands.Bot]:
    """A real commands.Bot logged in to the room, yielded once ready; always closed on exit.

    `setup(bot)` runs before login (add cogs, app commands, listeners). `sync_commands` copies
    the tree's global app commands to the room's guild and syncs them there once ready.
    """
    point_at_local(server_url)
    bot_kwargs.setdefault("command_prefix", "!")
    bot_kwargs.setdefault("guild_ready_timeout", 0.05)  # discord.py otherwise waits 2 s after GUILD_CREATE
    bot = bot_class(intents=intents or default_intents(), **bot_kwargs)
    if setup is not None:
        result = setup(bot)
        if inspect.isawaitable(result):
            await result
    task = asyncio.create_task(bot.start(token), name=f"discord-bot:{token}")
    try:
        await _until_ready(bot, task, ready_timeout)
        if sync_commands:
            guild = bot.guilds[0]
            bot.tree.copy_global_to(guild=guild)
            await asyncio.wait_for(bot.tree.sync(guild=guild), timeout=ready_timeout)
        yield bot
    finally:
        await asyncio.wait_for(bot.close(), timeout=5.0)
        try:
            await asyncio.wait_for(task, timeout=5.0)
        except asyncio.CancelledError:
            pass


async def _until_ready(bot: commands.Bot, task: asyncio.Task[None], timeout: float) -> None:
    ready = asyncio.create_task(bot.wait_until_ready())
    try:
        done, _ = await asyncio.wait({ready, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ready.cancel()
    if task in done:
        task.result()  # raises the login/connect error
        raise AssertionError("bot stopped before it was ready")
    if ready not in done:
        raise AssertionError(f"bot was not ready within {timeout}s")


async def eventually(check: Callable[[], Any], *, timeout: float = 5.0, interval: float = 0.01) -> Any:
    """Poll `check` until it returns something truthy (returned), or fail after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if result:
            return result
        if loop.time() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
