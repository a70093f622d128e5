"""`residents demo`: the local room, a scripted provider and the residents, wired together.

The same code that runs in Discord: real discord.py bots over real sockets to the local room
server, the real anthropic SDK to the local provider, a real SQLite ledger (`data/demo.db`).
The script (show.py) plays in the room itself: in the browser once a page opens it, or, headless,
at once with its transcript printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..config import Residence, load_all_residences
from ..discord.localapi import point_at_local
from ..discord.run import Deployment, run_bots
from ..ledger import Ledger
from ..ledger import live as live_ledger
from ..localservers.provider import ProviderServer
from ..localservers.room.server import RoomServer
from .script import Scripted, demo_responder
from .show import BROWSER_PACE, REAL_API_INTRO, TRANSCRIPT_INTRO, DemoShow, Pace, settled, transcript_lines

HERE = Path(__file__).resolve().parent

# The script starts when the first page opens the room, or this long after start, whichever is first.
START_WITHIN_S = 20.0


@dataclass
class Demo:
    room: RoomServer
    provider: ProviderServer | None
    ledger: Ledger
    task: asyncio.Task[None]
    stop: asyncio.Event
    residences: list[Residence]
    responder: Scripted | None = None


def residences(provider: str, model: str | None) -> list[Residence]:
    found = load_all_residences(HERE)
    if provider == "anthropic":
        from .. import models
        from ..config import Residence as R

        m = model or "claude-sonnet-5"
        ceiling = models.caps(m).max_output_tokens
        # On the real API the ceiling is shown with a small max_tokens, so a cut still happens quickly.
        found = [
            R.model_validate(
                {
                    **r.model_dump(),
                    "model": m,
                    "max_tokens": min(r.max_tokens, ceiling, 400 if r.name == "cairn" else 1024),
                }
            )
            for r in found
        ]
    return found


async def start(
    db: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    provider: str = "scripted",
    model: str | None = None,
    cast: list[Residence] | None = None,
) -> Demo:
    """The room, the provider and the bots, connected; `cast` replaces the demo's own residences."""
    res = cast if cast is not None else residences(provider, model)
    channels = list(dict.fromkeys(c for r in res if r.discord for c in r.discord.channels)) or ["general"]
    room = RoomServer(channels, "residents demo")
    await room.start(host, port)
    point_at_local(room.url)
    prov: ProviderServer | None = None
    responder: Scripted | None = None
    env = dict(os.environ)  # the real API's settings, with `--provider anthropic`
    if provider == "scripted":
        responder = demo_responder({r.name: r.model for r in res})
        prov = ProviderServer(responder=responder)
        await prov.start(host, 0)
        env |= {"ANTHROPIC_BASE_URL": prov.url, "ANTHROPIC_API_KEY": "demo"}
    ledger = await Ledger.open(db)  # a reader beside the bots' own connection (WAL allows both)
    room.set_annotator(_annotator(ledger))
    stop = asyncio.Event()
    dep = Deployment(res, {r.name: f"local-{r.name}" for r in res})
    task = asyncio.create_task(run_bots(dep, db, env, guild_ready_timeout=0.1, stop=stop), name="demo-bots")
    demo = Demo(room, prov, ledger, task, stop, res, responder)
    try:
        await _until_connected(demo, len(res))
    except BaseException:  # e.g. a provider key refused at start-up: the servers close before the one line
        await shutdown(demo)
        raise
    return demo


def _annotator(ledger: Ledger):
    async def annotate(ids: list[str]) -> dict[str, dict[str, Any]]:
        posts = await ledger.posts_by_message(ids)
        found = {mid: {"kind": p.kind, "generation_id": p.generation_id} for mid, p in posts.items()}
        # A live reply still being written (or its set-aside attempt) is known from its live messages.
        for m in await live_ledger.by_message(ledger, [i for i in ids if i not in found]):
            if m.message_id is None:  # never: these were found by their message id
                continue
            found[m.message_id] = {"kind": "live" if m.state == "live" else "stump", "generation_id": m.generation_id}
        return found

    return annotate


async def _until_connected(demo: Demo, n: int, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while sum(1 for b in demo.room.snapshot()["bots"] if b.get("connected") and b.get("synced")) < n:
        if demo.task.done():
            demo.task.result()
            raise RuntimeError("the residents stopped before they connected")
        if loop.time() > deadline:
            raise RuntimeError("the residents did not connect to the local room in time")
        await asyncio.sleep(0.05)


async def shutdown(demo: Demo) -> None:
    """Stop the bots, then the room (which lets a page's request in flight finish), then the ledger.

    The room asks the ledger what each message is while a page is open, so the ledger closes last:
    closed first, a request arriving during shutdown met a closed connection.
    """
    demo.stop.set()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(demo.task, 10)
    demo.room.set_annotator(None)
    await demo.room.stop()
    if demo.provider:
        await demo.provider.stop()
    await demo.ledger.close()


async def _settled(demo: Demo, trigger: str, resident: str, timeout: float = 30.0) -> str:
    """Wait until the reply to `trigger` is settled and every post of it delivered; its generation id."""
    return await settled(demo.ledger, trigger, resident, timeout)


def fresh_ledger(db: str) -> bool:
    """Start the demo's own ledger afresh (runs do not pile up files); True when a previous one was replaced."""
    replaced = False
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(db + suffix)
            replaced = replaced or suffix == ""
        except FileNotFoundError:
            pass
    return replaced


async def play(demo: Demo, out: TextIO, pace: Pace | None = None) -> DemoShow:
    """The script at once, then the transcript with kinds and what the moderator saw (headless)."""
    pace = pace or Pace()
    timeout = 30.0 if demo.provider is not None else 180.0
    show = DemoShow(demo.room, demo.ledger, demo.responder, pace, settle_timeout=timeout)
    await (await show.start())
    if show.state != "done":
        raise RuntimeError(f"the demo script stopped: {show.problem}")
    msgs = demo.room.messages("general")
    kinds = await _annotator(demo.ledger)([str(m["id"]) for m in msgs])
    refused = [p for p in await demo.ledger.refused_posts() if p.channel == demo.room.channel_id("general")]
    intro = TRANSCRIPT_INTRO if demo.provider is not None else REAL_API_INTRO  # scripted, or the real API
    print("\n".join(transcript_lines(msgs, kinds, show.commands, intro, refused)), file=out)
    return show


async def main_async(
    db: str, host: str, port: int, headless: bool, provider: str, model: str | None, ledger_line: str = ""
) -> int:
    demo = await start(db, host, port, provider, model)
    try:
        if ledger_line:
            print(ledger_line, flush=True)
        if headless:
            await play(demo, sys.stdout)
            return 0
        timeout = 30.0 if demo.provider is not None else 180.0
        show = DemoShow(demo.room, demo.ledger, demo.responder, BROWSER_PACE, settle_timeout=timeout)
        demo.room.set_show(show)
        print(
            f"residents demo: open {demo.room.url}/ in a browser (Ctrl-C to stop); the script plays there "
            f"once the page opens, then the room is yours to type in",
            flush=True,
        )
        starter = asyncio.create_task(show.start_when_watched(START_WITHIN_S), name="demo-starter")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait([waiter, demo.task], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        starter.cancel()
        if show.task is not None:
            show.task.cancel()
            await asyncio.gather(show.task, return_exceptions=True)
        if demo.task.done() and not stop.is_set():
            demo.task.result()
        return 0
    finally:
        await shutdown(demo)
