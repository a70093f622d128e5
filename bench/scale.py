"""Scale: `residents run` with many residents, on SQLite and on PostgreSQL with 1, 2 and 4 processes
(issue 23, item 5).

Each column is a fresh deployment: a local room with one guild of R channels (`c000`, ...), one residence
per channel (`r000` in `c000`, its own bot account), the scripted provider answering every request at once
(a short `end_turn` reply, or every `CUT_EVERY`-th message a cut at `max_tokens`, so partials and receipts
are posted too), and N `residents run` processes started as an operator starts them, on the same
configuration folder and the same ledger (a SQLite file, or a database on a throwaway PostgreSQL server
on loopback). The room and the provider run in this process; the residents in theirs.

- **Start-up is excluded**: the clock starts once the room sees every resident's bot connected (its
  commands synced, as a bot does when it is ready), on PostgreSQL once the processes' leases have settled
  (every process registered and holding its fair share, no unit free: no handover pending, `settled_leases`),
  and one untimed warm-up mention in every channel has been answered (first requests, connection pools, the
  ledger's first writes, the gateway sessions of bots handed over at start).
- **Generations per second**: people post as fast as they are answered: each channel's person posts its
  next message once the whole reply to the previous one is in the room (a closed loop, one message in
  flight per channel, every channel at once), M messages a round spread over the channels in turn; the
  generations settled in the ledger during the round over the round's wall time, median and range.
- **Time to the first post**: then M messages at a fixed rate (`--rate`), the channels in turn, from just
  before the room stores a person's message to the room's own event for the resident's first post in that
  channel (one clock: loopback, one process), p50 and p99. At saturation that time is mostly the queue
  (channels ÷ generations per second), so it is measured below it.
- **Failover** (with 2 PostgreSQL processes): once the rounds are done, one process is SIGKILLed and a
  new mention is posted in every channel; the figure is the time until every channel has been answered.
- A process that exits before the room sees every bot stops the benchmark with its one line.

On PostgreSQL the JSON counts the leases taken while the clock ran (`timed_handovers`, the epochs' sum
before the rounds and after the paced phase): 0 once start-up's handovers are excluded.

Every message must get exactly one reply, counted from the room (the channel's resident's posts after the
message and before the next: one, or a partial and its receipt), and every round must settle one generation
a message in the ledger, the cut ones cut; otherwise the benchmark stops rather than report a figure.

`python -m bench scale [--quick] [--procs 1,2,4] [--residents 200] [--messages N] [--rounds N] [--rate R]
[--json PATH]`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import discord

from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import RoomServer
from residents.localservers.room.model import Overwrite, RoomEvent

from . import pgserver, streams
from .common import ROOT, machine, median, percentile, scratch

log = logging.getLogger(__name__)

MODEL = "claude-sonnet-4-6"
MAX_TOKENS = 256  # each residence's ceiling: a cut reply reports reaching it
REPLY_CHARS = 400  # an ordinary reply: one post
CUT_CHARS = 1000  # a cut reply: a partial and its receipt
CUT_EVERY = 10  # every 10th message of a round asks for the long version, which is cut
CUT_MARK = "(the long version)"
POSTS = {False: 1, True: 2}  # a reply's posts in the room: speech; or a partial and its receipt
READY_WITHIN = 300.0  # seconds for every bot to connect (200 bots on a loaded 2-core machine)
ANSWER_WITHIN = 120.0  # seconds for a channel's reply
PERSON = "alice"  # who posts every message
TICKS = os.sysconf("SC_CLK_TCK")  # /proc's unit of CPU time
RATE = 10.0  # the paced phase's messages a second: well below what one process answers on a busy 2-core machine


@dataclass
class Arrival:
    at: float  # perf_counter when the room stored the post
    message_id: str
    author: str


@dataclass
class Column:
    """One deployment's figures."""

    backend: str
    procs: int
    rounds: list[dict[str, Any]] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    failover_s: float | None = None
    failover_note: str | None = None
    startup_s: float | None = None
    paced_per_s: float | None = None
    replies: dict[str, int] = field(default_factory=dict)
    timed_handovers: int | None = None  # PostgreSQL: leases taken between the clock's start and the paced end

    @property
    def label(self) -> str:
        return f"{'SQLite' if self.backend == 'sqlite' else 'PG'} {self.procs} proc{'s' if self.procs > 1 else ''}"

    def summary(self) -> dict[str, Any]:
        rates = [r["generations_per_s"] for r in self.rounds]
        return {
            "label": self.label,
            "backend": self.backend,
            "procs": self.procs,
            "startup_s": self.startup_s,
            "generations_per_s": {"median": median(rates), "min": min(rates), "max": max(rates)} if rates else None,
            "cpu_ms_per_generation": median([r["cpu_ms_per_generation"] for r in self.rounds]) if rates else None,
            "latency_p50_ms": percentile(self.latencies_ms, 50) if self.latencies_ms else None,
            "latency_p99_ms": percentile(self.latencies_ms, 99) if self.latencies_ms else None,
            "latency_max_ms": max(self.latencies_ms) if self.latencies_ms else None,
            "paced_messages_per_s": self.paced_per_s,
            "failover_s": self.failover_s,
            "failover_note": self.failover_note,
            "rounds": self.rounds,
            "replies": self.replies,
            "timed_handovers": self.timed_handovers,
        }


def names(residents: int) -> list[str]:
    return [f"r{i:03d}" for i in range(residents)]


def channel_of(name: str) -> str:
    return "c" + name[1:]


def write_config(folder: Path, residents: int) -> None:
    """One residence per channel, no cooldown: every mention is answered."""
    (folder / "residences").mkdir(parents=True)
    for name in names(residents):
        (folder / "residences" / f"{name}.yaml").write_text(
            f"name: {name}\nmodel: {MODEL}\nmax_tokens: {MAX_TOKENS}\nsystem: You are {name}.\n"
            "policy:\n  floor: {cooldown_seconds: 0}\n"
            f"discord:\n  token_env: BENCH_SCALE_{name.upper()}_TOKEN\n  channels: [{channel_of(name)}]\n"
        )


def scripted_provider() -> ProviderServer:
    """Answers at once: a short reply, or the cut one when the newest message asks for the long version."""
    reply = sse.stream(streams.text(REPLY_CHARS), "end_turn", REPLY_CHARS // streams.CHARS_PER_TOKEN, model=MODEL)
    cut = sse.stream(streams.text(CUT_CHARS, seed=3), "max_tokens", MAX_TOKENS, model=MODEL)

    def answer(body: dict[str, Any]) -> Call:
        newest = json.dumps(body.get("messages", [])[-1:], ensure_ascii=False)
        return Call(sse=cut if CUT_MARK in newest else reply)

    return ProviderServer(answer)


def own_channels(room: RoomServer, who: list[str]) -> None:
    """Each resident's bot sees its own channel only, as an operator would set it on Discord (a permission
    overwrite per channel, the person who posts allowed in every one), so a message is dispatched to the
    one bot it is for rather than to every bot in the guild. The bots are made here, before their
    processes log in with the same tokens (`local-NAME`, as `residents run` uses against a local room)."""
    state = room.state
    person = state.person(PERSON, state.guild)
    view, nothing = discord.Permissions(view_channel=True), discord.Permissions.none()
    for name in who:
        bot = state.bot_for_token(f"local-{name}")
        channel = state.channel_by_ref(channel_of(name))
        channel.overwrites += [
            Overwrite(state.guild_id, 0, nothing, view),  # @everyone: the role's id is the guild's
            Overwrite(bot.id, 1, view, nothing),
            Overwrite(person.id, 1, view, nothing),
        ]


class Watch:
    """The residents' posts as the room stores them, per channel, in order, with the moment of each."""

    def __init__(self, room: RoomServer) -> None:
        self.posts: dict[str, list[Arrival]] = {}
        self.changed: dict[str, asyncio.Event] = {}  # one a channel: a post wakes only its channel's waiter
        room.state.subscribe(self._on_event)

    def _on_event(self, event: RoomEvent) -> None:
        msg = getattr(event, "message", None)
        if event.kind == "message_create" and msg is not None and msg.author.bot:
            channel = msg.channel.name
            self.posts.setdefault(channel, []).append(Arrival(time.perf_counter(), str(msg.id), msg.author.name))
            self.changed.setdefault(channel, asyncio.Event()).set()

    async def until(self, channel: str, count: int, timeout: float) -> list[Arrival]:
        """The channel's posts once there are at least `count`; TimeoutError naming the channel."""
        deadline = time.monotonic() + timeout
        changed = self.changed.setdefault(channel, asyncio.Event())
        while len(self.posts.get(channel, [])) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"#{channel}: {len(self.posts.get(channel, []))} of {count} resident posts")
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=left)
        return self.posts[channel]


@dataclass
class Sent:
    channel: str
    message_id: str
    cut: bool
    posted_at: float
    first_post_at: float | None = None


class Load:
    """People's messages and the count of the residents' posts each channel should have by now."""

    def __init__(self, room: RoomServer, watch: Watch) -> None:
        self.room, self.watch = room, watch
        self.expected: dict[str, int] = {}
        self.sent: list[Sent] = []
        self.paced_per_s: float | None = None  # the paced phase's messages a second, as answered

    async def ask(self, name: str, n: int, cut: bool) -> Sent:
        """One person's mention of `name` in its channel; returns once the whole reply is in the room."""
        channel = channel_of(name)
        text = f"@{name} question {n}: tell me about the harbour" + (f" {CUT_MARK}" if cut else "")
        before = self.expected.get(channel, 0)
        self.expected[channel] = before + POSTS[cut]
        at = time.perf_counter()
        view = self.room.post(channel, PERSON, text, mentions=[name])
        sent = Sent(channel, view["id"], cut, at)
        self.sent.append(sent)
        posts = await self.watch.until(channel, before + 1, ANSWER_WITHIN)
        sent.first_post_at = posts[before].at
        await self.watch.until(channel, before + POSTS[cut], ANSWER_WITHIN)
        return sent

    def replies(self, residents: list[str]) -> dict[str, int]:
        """Per person's message, the resident's posts after it and before the next one, from the room:
        exactly one reply is a reply's count of posts (`POSTS`), all by the channel's resident."""
        counts = {"messages": len(self.sent), "answered_once": 0, "unanswered": 0, "other": 0}
        by_channel: dict[str, list[Sent]] = {}
        for s in self.sent:
            by_channel.setdefault(s.channel, []).append(s)
        for channel, sent in by_channel.items():
            posts = list(self.watch.posts.get(channel, []))
            room = {m["id"]: i for i, m in enumerate(self.room.messages(channel))}
            owner = "r" + channel[1:]
            for k, s in enumerate(sent):
                upto = room[sent[k + 1].message_id] if k + 1 < len(sent) else len(room) + 1
                mine = [p for p in posts if room[s.message_id] < room.get(p.message_id, -1) < upto]
                if not mine:
                    counts["unanswered"] += 1
                elif len(mine) == POSTS[s.cut] and all(p.author == owner for p in mine):
                    counts["answered_once"] += 1
                else:
                    counts["other"] += 1
        return counts


def settled(location: str) -> tuple[int, int]:
    """Generations the ledger holds settled (no longer pending), and of them those cut at the ceiling,
    read straight from the backend."""
    statement = (
        "SELECT count(*), coalesce(sum(CASE WHEN stop_reason = 'max_tokens' THEN 1 ELSE 0 END), 0)"
        " FROM generations WHERE status <> 'pending'"
    )
    if location.startswith("postgresql://"):
        [(count, cut)] = pgserver.fetch(location, statement)
    else:
        with contextlib.closing(sqlite3.connect(f"file:{location}?mode=ro", uri=True)) as con:
            count, cut = con.execute(statement).fetchone()
    return int(str(count)), int(str(cut))


class Processes:
    """N `residents run` processes on one configuration folder and one ledger; their output in files."""

    def __init__(self, folder: Path, location: str, room_url: str, provider_url: str, n: int) -> None:
        self.folder, self.location, self.n = folder, location, n
        self.room_url, self.provider_url = room_url, provider_url
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        env.update(ANTHROPIC_BASE_URL=self.provider_url, ANTHROPIC_API_KEY="k", PYTHONPATH=str(ROOT))
        for i in range(self.n):
            out = open(self.folder / f"run{i}.out", "wb")  # noqa: SIM115 (the child holds it; closed below)
            err = open(self.folder / f"run{i}.err", "wb")  # noqa: SIM115
            command = [sys.executable, "-m", "residents", "run", "--discord-api", self.room_url, "--db", self.location]
            command += ["--log-level", "warning"]  # connection lines of hundreds of bots are not the benchmark's
            try:
                self.procs.append(
                    await asyncio.create_subprocess_exec(
                        *command, cwd=self.folder, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err
                    )
                )
            finally:
                out.close()
                err.close()

    def last_line(self, i: int) -> str:
        lines = (self.folder / f"run{i}.err").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"(no output; exit status {self.procs[i].returncode})"

    def cpu_s(self) -> float:
        """CPU time (user and system) the running processes have used so far, from /proc/PID/stat."""
        total = 0.0
        for p in self.procs:
            if p.returncode is None:
                with contextlib.suppress(OSError):
                    fields = Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()
                    total += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        return total

    def exited(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.returncode is not None]

    async def stop(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), timeout=30)
            except TimeoutError:
                p.kill()
                await p.wait()


# The leases as a whole, by the database's clock: live processes, units, units no live lease covers, and
# the most units one process holds.
LEASES = """
WITH now AS (SELECT extract(epoch from clock_timestamp())::double precision AS t)
SELECT
  (SELECT count(*) FROM processes, now WHERE stopped_at IS NULL AND heartbeat_at + lease_seconds > now.t),
  (SELECT count(*) FROM leases),
  (SELECT count(*) FROM leases, now WHERE holder IS NULL OR expires_at IS NULL OR expires_at <= now.t),
  (SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM leases, now WHERE expires_at > now.t GROUP BY holder) h)
"""


def settled_leases(location: str, procs: int, units: int) -> bool:
    """Whether `procs` processes share `units` with no handover pending: each registered and live, every unit
    held, none holding more than its fair share (ceil(units / processes)), so no process gives any up and
    none has any to take (`residents.ledger.leases`)."""
    [(live, total, free, most)] = pgserver.fetch(location, LEASES)
    share = -(-units // procs)
    return (live, total, free) == (procs, units, 0) and int(str(most)) <= share


async def until_settled(location: str, procs: int, units: int) -> None:
    """Wait until the leases have settled (`settled_leases`), read every 0.1 s: handovers are start-up."""
    deadline = time.monotonic() + READY_WITHIN
    while not await asyncio.to_thread(settled_leases, location, procs, units):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the leases of {procs} processes did not settle within {READY_WITHIN:.0f} s")
        await asyncio.sleep(0.1)  # a poll of the database's state, not a stand-in for it


def lease_takings(location: str) -> int:
    """How many times any lease has been taken so far: the sum of their epochs, each taking bumping one."""
    [(total,)] = pgserver.fetch(location, "SELECT coalesce(sum(epoch), 0) FROM leases")
    return int(str(total))


def online(room: RoomServer, wanted: set[str]) -> int:
    """How many of `wanted` the room sees connected with their commands synced (a bot does it when ready)."""
    synced = {app for app, _guild in room.state.synced}
    return sum(
        1 for b in room.state.bots() if b.name in wanted and room.gateway.connected(b) and b.application_id in synced
    )


async def until_online(room: RoomServer, procs: Processes, wanted: set[str]) -> str | None:
    """Wait until the room sees every bot ready; None, or the one line of a process that stopped first."""
    waits = [asyncio.create_task(p.wait()) for p in procs.procs]
    deadline = time.monotonic() + READY_WITHIN
    try:
        while online(room, wanted) < len(wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{online(room, wanted)} of {len(wanted)} bots online after {READY_WITHIN:.0f} s")
            done, _ = await asyncio.wait(waits, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
            if done:
                i = procs.exited()[0]
                return f"exit status {procs.procs[i].returncode}: {procs.last_line(i)}"
        return None
    finally:
        for w in waits:
            w.cancel()


@dataclass(frozen=True)
class Settings:
    residents: int
    messages: int  # a round's, and the paced phase's
    rounds: int
    rate: float  # the paced phase's messages per second


async def measure(backend: str, procs: int, s: Settings, folder: Path, location: str) -> Column:
    col = Column(backend, procs)
    who = names(s.residents)
    write_config(folder, s.residents)
    provider = scripted_provider()
    await provider.start()
    room = RoomServer([channel_of(n) for n in who])
    own_channels(room, who)
    await room.start()
    watch = Watch(room)
    load = Load(room, watch)
    run = Processes(folder, location, room.url, provider.url, procs)
    try:
        t0 = time.perf_counter()
        await run.start()
        stopped = await until_online(room, run, set(who))
        if stopped is None and backend == "postgresql":
            # Bots handed over between processes at start reconnect in their new holder: that is start-up too.
            await until_settled(location, procs, len(who))
            stopped = await until_online(room, run, set(who))
        if stopped is not None:
            raise RuntimeError(f"{col.label}: residents run stopped at start: {stopped}")
        await asyncio.gather(*(load.ask(n, 0, False) for n in who))  # warm-up, untimed
        col.startup_s = time.perf_counter() - t0
        takings = await asyncio.to_thread(lease_takings, location) if backend == "postgresql" else None
        for r in range(s.rounds):
            col.rounds.append(await saturated(load, who, s.messages, r * s.messages + 1, location, run))
            if (col.rounds[-1]["generations"], col.rounds[-1]["cut"]) != (s.messages, col.rounds[-1]["cut_asked"]):
                raise RuntimeError(f"{col.label}: the ledger settled other than what was asked: {col.rounds[-1]}")
            log.info("%s round %d: %.1f generations/s", col.label, r + 1, col.rounds[-1]["generations_per_s"])
        col.latencies_ms = await paced(load, who, s.messages, s.rate, s.rounds * s.messages + 1)
        col.paced_per_s = load.paced_per_s
        if takings is not None:
            col.timed_handovers = await asyncio.to_thread(lease_takings, location) - takings
        col.replies = load.replies(who)
        if col.replies["answered_once"] != col.replies["messages"]:
            raise RuntimeError(f"{col.label}: not every message got exactly one reply: {col.replies}")
        if backend == "postgresql" and procs == 2:  # last: it leaves one process
            await failover(col, load, run, who)
        return col
    finally:
        await run.stop()
        await room.stop()
        await provider.stop()


def cut(k: int) -> bool:
    """Whether a phase's k-th message (from 0) asks for the long version, which is cut at the ceiling."""
    return (k + 1) % CUT_EVERY == 0


async def saturated(
    load: Load, who: list[str], messages: int, first: int, location: str, run: Processes
) -> dict[str, Any]:
    """One round as fast as answered: every channel at once, each posting its next message once the reply
    to its previous one is whole; generations settled in the ledger over the round's wall time, and the
    residents' processes' CPU time over them."""
    queues = {n: [k for k in range(messages) if k % len(who) == i] for i, n in enumerate(who)}

    async def channel(name: str, ks: list[int]) -> list[Sent]:
        return [await load.ask(name, first + k, cut(k)) for k in ks]

    before = await asyncio.to_thread(settled, location)
    w, cpu, here = time.perf_counter(), run.cpu_s(), time.process_time()
    done = await asyncio.gather(*(channel(n, ks) for n, ks in queues.items() if ks))
    wall, cpu, here = time.perf_counter() - w, run.cpu_s() - cpu, time.process_time() - here
    after = await asyncio.to_thread(settled, location)
    waits = [(x.first_post_at - x.posted_at) * 1e3 for xs in done for x in xs if x.first_post_at is not None]
    return {
        "messages": messages,
        "generations": after[0] - before[0],
        "cut": after[1] - before[1],
        "cut_asked": sum(1 for k in range(messages) if cut(k)),
        "wall_s": wall,
        "generations_per_s": (after[0] - before[0]) / wall,
        "cpu_ms_per_generation": cpu * 1e3 / max(1, after[0] - before[0]),
        # this process's: the room (REST, gateway) and the provider, which the residents' figure leaves out
        "room_and_provider_cpu_ms_per_generation": here * 1e3 / max(1, after[0] - before[0]),
        "first_post_p50_ms": percentile(waits, 50),  # at saturation: mostly the queue (Little's law)
    }


async def paced(load: Load, who: list[str], messages: int, rate: float, first: int) -> list[float]:
    """`messages` at `rate` a second, the channels in turn (a channel's next waits for its previous reply
    to be whole): each one's time to its first post, in ms."""
    turns = {n: asyncio.Lock() for n in who}  # FIFO: a channel's messages go in order
    t0 = time.perf_counter()

    async def one(k: int) -> float:
        name = who[k % len(who)]
        async with turns[name]:
            await asyncio.sleep(max(0.0, t0 + k / rate - time.perf_counter()))  # the schedule, not a wait for state
            x = await load.ask(name, first + k, cut(k))
        return ((x.first_post_at or x.posted_at) - x.posted_at) * 1e3

    waits = list(await asyncio.gather(*(one(k) for k in range(messages))))
    posted = [x.posted_at for x in load.sent[-messages:]]
    if messages > 1:  # as posted: below `rate` where a channel's previous reply was not yet whole
        load.paced_per_s = (messages - 1) / (max(posted) - min(posted))
    return waits


async def failover(col: Column, load: Load, run: Processes, who: list[str]) -> None:
    """SIGKILL the first process; the time until every channel has answered a new mention (and each
    exactly once, counted from the room as for the rest)."""
    run.procs[0].send_signal(signal.SIGKILL)
    await run.procs[0].wait()
    t0 = time.perf_counter()
    sent = await asyncio.gather(*(load.ask(n, -1, False) for n in who), return_exceptions=True)
    missing = [x for x in sent if isinstance(x, BaseException)]
    if missing:
        col.failover_note = (
            f"{len(missing)} of {len(who)} residents did not answer within {ANSWER_WITHIN:.0f} s of the SIGKILL"
            f" ({missing[0]})"
        )
        return
    col.failover_s = max(x.first_post_at or t0 for x in sent if isinstance(x, Sent)) - t0
    col.replies = load.replies(who)
    if col.replies["answered_once"] != col.replies["messages"]:
        col.failover_note = f"after the SIGKILL, not every message got exactly one reply: {col.replies}"


@contextlib.contextmanager
def postgres_if(needed: bool) -> Iterator[pgserver.Server | None]:
    if not needed:
        yield None
        return
    with pgserver.server() as server:
        yield server


def run(procs: list[int], s: Settings) -> dict[str, Any]:
    """SQLite with one process, then PostgreSQL with each of `procs`, one after another."""
    r: dict[str, Any] = {"machine": machine(), **asdict(s), "cut_every": CUT_EVERY, "columns": []}
    t0 = time.perf_counter()
    with postgres_if(bool(procs)) as server:
        for backend, n in [("sqlite", 1)] + [("postgresql", n) for n in procs]:
            folder = Path(scratch("scale"))
            location = str(folder / "ledger.db") if server is None or backend == "sqlite" else server.create()
            log.info("%s, %d process(es): %s", backend, n, s)
            try:
                col = asyncio.run(measure(backend, n, s, folder, location))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            r["columns"].append(col.summary())
    r["duration_s"] = time.perf_counter() - t0
    return r


def table(r: dict[str, Any]) -> str:
    m = r["machine"]
    cols = r["columns"]
    width = 22
    lines = [
        f"scale: {r['residents']} residents in {r['residents']} channels, {r['messages']} messages a round"
        f" (every {r['cut_every']}th cut), {r['rounds']} round(s) · {m['nproc']}× {m['cpu']} · load"
        f" {m['load_avg_1min_at_start']} · {r['duration_s']:.0f} s",
        f"{'':<24}" + "".join(f"{c['label']:>{width}}" for c in cols),
    ]

    def row(label: str, cell: Any) -> str:
        return f"{label:<24}" + "".join(f"{cell(c):>{width}}" for c in cols)

    def rate(c: dict[str, Any]) -> str:
        g = c["generations_per_s"]
        return "not available" if g is None else f"{g['median']:.1f} [{g['min']:.1f}–{g['max']:.1f}]"

    def ms(key: str, digits: int = 0) -> Any:
        return lambda c: "not available" if c[key] is None else f"{c[key]:.{digits}f} ms"

    def fail(c: dict[str, Any]) -> str:
        if c["failover_s"] is not None:
            return f"{c['failover_s']:.2f} s"
        if c["backend"] == "postgresql" and c["procs"] == 2:
            return "not available"
        return "–"

    paced = f"@ {r['rate']:g}/s"
    lines += [
        row("gen/s median [range]", rate),
        row("CPU per gen, median", ms("cpu_ms_per_generation", 1)),
        row(f"first post p50 {paced}", ms("latency_p50_ms")),
        row(f"first post p99 {paced}", ms("latency_p99_ms")),
        row("failover (SIGKILL)", fail),
        "(gen/s: as fast as answered, every channel at once; CPU: the residents' processes', per generation"
        " settled; first post: a person's message to the resident's first post in the room,"
        f" {r['messages']} messages at {r['rate']:g} a second)",
    ]
    for c in cols:
        if c["failover_note"]:
            lines.append(f"{c['label']} failover: {c['failover_note']}")
    if not any(c["backend"] == "postgresql" and c["procs"] == 2 for c in cols):
        lines.append("failover: measured with 2 PostgreSQL processes (--procs with 2)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20 residents, 40 messages a round, 2 rounds (< 60 s)")
    p.add_argument("--procs", default="1,2,4", help="PostgreSQL process counts, comma-separated (default 1,2,4)")
    p.add_argument("--residents", type=int, help="residents, one per channel (default 200; --quick 20)")
    p.add_argument("--messages", type=int, help="people's messages a round and paced (default 2 per resident)")
    p.add_argument("--rounds", type=int, help="rounds as fast as answered, per column (default 3; --quick 2)")
    p.add_argument("--rate", type=float, default=RATE, help=f"the paced messages a second (default {RATE:g})")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON here")
    a = p.parse_args(argv)

    def problem(line: str) -> int:
        print(f"python -m bench scale: {line}", file=sys.stderr)
        return 2

    try:
        procs = [int(x) for x in a.procs.split(",") if x.strip()]
    except ValueError:
        return problem(f"--procs {a.procs}: write counts separated by commas, e.g. 1,2,4")
    if any(n < 1 for n in procs):
        return problem(f"--procs {a.procs}: every count is at least 1")
    residents = (20 if a.quick else 200) if a.residents is None else a.residents
    s = Settings(
        residents,
        2 * residents if a.messages is None else a.messages,
        (2 if a.quick else 3) if a.rounds is None else a.rounds,
        a.rate,
    )
    if not 1 <= s.residents <= 1000:
        return problem(f"--residents {s.residents}: from 1 to 1000 (one channel and one bot each)")
    if s.messages < 1 or s.rounds < 1 or not s.rate > 0:
        return problem("--messages, --rounds: at least 1; --rate: above 0")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("bench").setLevel(logging.INFO)
    r = run(procs, s)
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1) + "\n", encoding="utf-8")
    print(table(r))
    return 0
