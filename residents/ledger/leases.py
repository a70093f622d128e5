"""Leases: several `residents run` processes sharing one PostgreSQL ledger, each bot driven by one of them.

Why leases in the database: the processes may be on several machines and share nothing but the ledger.
A process registers (`processes`), then every `renew` seconds, in one transaction under an advisory lock
of its own (`LEASE_LOCK`), it beats its heartbeat, renews what it holds, and takes its fair share of what
is free. A unit is a bot (a residence) or one shard of a sharded bot. A lease is renewed only for the same
holder and epoch (fencing: a lease another process took carries a new epoch, so an old holder's renewal
fails); a lease whose `expires_at` passed, or whose holder stopped, may be taken by anyone, bumping its
epoch. Fair share: at most ceil(units / live processes) each; a process above its share gives the rest
up (after stopping them).

A handover is told, not waited for: registering, giving units up and stopping each `NOTIFY` the other
processes (`CHANNEL`), whose `Listener` wakes their renewal loop at once. Without it a unit given up would
lie free until the taker's next renewal (up to `renew` seconds, during which nobody answers as that bot);
with it a handover costs the new holder's connection to the gateway. A lost listener only makes that slow
again: the renewals still run every `renew` seconds.

Every time is the database's clock (`clock_timestamp()`), never a host's, in seconds since the epoch.
What this process may do between renewals is judged on its own **monotonic** clock (`Leases.may_post`):
the local deadline is the last successful renewal's start plus the lease length, less a margin, so a
process frozen (SIGSTOP) past its lease posts nothing once it runs again, before it has renewed.

These rows are operational state, not records: the chain has no entry for them and `verify` reads none.
SQLite keeps one process by its file lock (`lock.py`); nothing here runs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import asyncpg

from .connection import Connection, Session

log = logging.getLogger(__name__)

LEASE_LOCK = 0x6C65617365733031  # "leases01": one process's turn at the leases table at a time

CLOCK = "SELECT extract(epoch from clock_timestamp())::double precision"  # the database's clock, in seconds


@dataclass(frozen=True, order=True)
class Unit:
    """What one lease covers: a whole bot (`shard` None) or one gateway shard of a sharded bot."""

    residence: str
    shard: int | None = None

    @property
    def key(self) -> str:
        return self.residence if self.shard is None else f"{self.residence}#{self.shard}"


@dataclass(frozen=True)
class Terms:
    """How long a lease lasts and how often it is renewed: a dead holder's units are taken within
    `length + renew` seconds (the defaults: 20 s, under the 30 s issue 23 asks for)."""

    length: float = 15.0
    renew: float = 5.0

    @property
    def margin(self) -> float:
        """How much earlier than the database's expiry this process stops posting (in-flight sends, drift)."""
        return min(self.renew, self.length / 5)


@dataclass
class Tick:
    """What one renewal found: units kept (key → epoch), taken now, lost (taken by another, or released),
    and held beyond this process's fair share (to stop, then give up). `driven_since`: of the units taken,
    those another process drove before, and since when it did (the database's clock): what came for the bot
    since then was that holder's to answer, or is owed now (a mention that arrived while the bot changed
    hands, in a channel where it never answered before)."""

    kept: dict[str, int] = field(default_factory=dict)
    gained: dict[str, int] = field(default_factory=dict)
    driven_since: dict[str, float] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    excess: list[str] = field(default_factory=list)


REGISTER = (
    "INSERT INTO processes (host, pid, started_at, heartbeat_at, lease_seconds) VALUES ($1, $2,"
    " extract(epoch from clock_timestamp())::double precision, extract(epoch from clock_timestamp())::double precision,"
    " $3) RETURNING id"
)
OFFER = "INSERT INTO leases (unit, residence, shard) VALUES ($1, $2, $3) ON CONFLICT (unit) DO NOTHING"
RENEW = "UPDATE leases SET expires_at = $4 WHERE unit = $1 AND holder = $2 AND epoch = $3 RETURNING epoch"
LIVE = "SELECT count(*) FROM processes WHERE stopped_at IS NULL AND heartbeat_at + lease_seconds > $1"
# Every unit any process has offered: what the live processes share out (ceil(units / live) each).
UNITS = "SELECT count(*) FROM leases"
FREE = (
    "SELECT unit FROM leases WHERE unit = ANY($1::text[]) AND (holder IS NULL OR expires_at IS NULL"
    " OR expires_at <= $2 OR holder IN (SELECT id FROM processes WHERE stopped_at IS NOT NULL)) ORDER BY unit LIMIT $3"
)
# The new epoch, and when the previous holder took the unit (NULL: nobody ever drove it).
TAKE = (
    "UPDATE leases SET holder = $2, epoch = epoch + 1, acquired_at = $3, expires_at = $4"
    " FROM (SELECT acquired_at AS before FROM leases WHERE unit = $1) AS previous WHERE unit = $1"
    " RETURNING epoch, previous.before"
)
RELEASE_ALL = "UPDATE leases SET holder = NULL, expires_at = NULL WHERE holder = $1"
RELEASE = RELEASE_ALL + " AND unit = ANY($2::text[])"
# Told to every process listening on the ledger's database, with the teller's process id (its own is ignored).
CHANNEL = "residents_leases"
NOTIFY = "SELECT pg_notify($1, $2)"
STOPPED = "UPDATE processes SET stopped_at = extract(epoch from clock_timestamp())::double precision WHERE id = $1"


@contextlib.contextmanager
def one_transaction(conn: Session) -> Iterator[None]:
    """The statements of the block in one transaction, rolled back on any failure (cancellation included)."""
    conn.execute("BEGIN")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def register(conn: Session, terms: Terms) -> int:
    """This process's row: its id, which its leases name."""
    [(pid,)] = conn.execute(REGISTER, (socket.gethostname(), os.getpid(), terms.length)).fetchall()
    conn.execute(NOTIFY, (CHANNEL, str(pid)))  # the others' share shrinks: they give up their surplus now
    return int(pid)


def tick(conn: Session, process: int, units: Sequence[Unit], held: dict[str, int], terms: Terms) -> Tick:
    """One renewal, in one transaction under `LEASE_LOCK`: heartbeat, renew `held` (key → epoch), then
    take free units of `units` up to the fair share, or name what is held beyond it."""
    out = Tick()
    with one_transaction(conn):
        conn.execute("SELECT pg_advisory_xact_lock($1)", (LEASE_LOCK,))
        [(now,)] = conn.execute(CLOCK).fetchall()
        conn.execute("UPDATE processes SET heartbeat_at = $2 WHERE id = $1", (process, now))
        conn.executemany(OFFER, [(u.key, u.residence, u.shard) for u in units])
        for key, epoch in held.items():
            row = conn.execute(RENEW, (key, process, epoch, now + terms.length)).fetchone()
            if row is None:
                out.lost.append(key)
            else:
                out.kept[key] = int(row[0])
        [(live,)] = conn.execute(LIVE, (now,)).fetchall()
        [(total,)] = conn.execute(UNITS).fetchall()
        share = math.ceil(total / max(1, live))
        if len(out.kept) > share:
            out.excess = sorted(out.kept)[share:]
        elif len(out.kept) < share:
            wanted = [u.key for u in units if u.key not in out.kept]
            for (key,) in conn.execute(FREE, (wanted, now, share - len(out.kept))).fetchall():
                [(epoch, before)] = conn.execute(TAKE, (key, process, now, now + terms.length)).fetchall()
                out.gained[key] = int(epoch)
                if before is not None:
                    out.driven_since[key] = float(before)
    return out


def release(conn: Session, process: int, keys: Iterable[str]) -> None:
    """Give units up at once (more than the fair share), and tell the others they are free (as it commits)."""
    with one_transaction(conn):
        conn.execute(RELEASE, (process, list(keys)))
        conn.execute(NOTIFY, (CHANNEL, str(process)))


def stopped(conn: Session, process: int) -> None:
    """A clean stop: every lease given up, the process marked stopped (not merely silent)."""
    with one_transaction(conn):
        conn.execute(RELEASE_ALL, (process,))
        conn.execute(STOPPED, (process,))
        conn.execute(NOTIFY, (CHANNEL, str(process)))  # sent as the transaction commits


@dataclass(frozen=True)
class ProcessRow:
    id: int
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    alive: bool
    units: list[tuple[str, float]]  # (unit, held since), each lease still running


@dataclass(frozen=True)
class Status:
    now: float  # the database's clock as it was read
    processes: list[ProcessRow]
    free: list[str]  # units no process's lease covers now


def status(conn: Session) -> Status:
    """Every process not stopped long ago (the last day's), each with the leases it holds, and the units no
    live process holds. One read, by the database's clock."""
    [(now,)] = conn.execute(CLOCK).fetchall()
    procs = conn.execute(
        "SELECT id, host, pid, started_at, heartbeat_at, lease_seconds, stopped_at FROM processes"
        " WHERE stopped_at IS NULL OR stopped_at > $1 ORDER BY id",
        (now - 86400,),
    ).fetchall()
    leases: dict[int, list[tuple[str, float]]] = {}
    free = []
    for unit, holder, acquired, expires in conn.execute(
        "SELECT unit, holder, acquired_at, expires_at FROM leases ORDER BY unit"
    ).fetchall():
        if holder is not None and expires is not None and expires > now:
            leases.setdefault(int(holder), []).append((str(unit), float(acquired)))
        else:
            free.append(str(unit))
    rows = [
        ProcessRow(
            int(p[0]),
            str(p[1]),
            int(p[2]),
            float(p[3]),
            float(p[4]),
            None if p[6] is None else float(p[6]),
            p[6] is None and float(p[4]) + float(p[5]) > now,
            leases.get(int(p[0]), []),
        )
        for p in procs
    ]
    return Status(float(now), rows, free)


class Leases:
    """This process's leases on one ledger: `start`, then `tick` every `terms.renew` seconds; `may_post`
    says, on the local monotonic clock, whether a unit's lease still covers a post now."""

    def __init__(self, conn: Connection, units: Sequence[Unit], terms: Terms) -> None:
        self.conn = conn  # a session of its own: a renewal never waits behind the ledger's commits
        self.units = list(units)
        self.terms = terms
        self.process = 0
        self.held: dict[str, int] = {}  # unit key → epoch
        self.driven_since: dict[str, float] = {}  # unit key → since when another process drove it (`Tick`)
        self._until: dict[str, float] = {}  # unit key → local monotonic deadline

    async def start(self) -> int:
        self.process = await self.conn.run(register, self.terms)
        return self.process

    async def tick(self) -> Tick:
        """Renew and take; the local deadline of every unit kept or taken moves on from this call's start."""
        began = time.monotonic()
        got = await self.conn.run(tick, self.process, self.units, dict(self.held), self.terms)
        until = began + self.terms.length - self.terms.margin
        for key in got.lost:
            self.forget(key)
        for key, epoch in {**got.kept, **got.gained}.items():
            self.held[key] = epoch
            self._until[key] = until
        self.driven_since.update(got.driven_since)
        return got

    def forget(self, key: str) -> None:
        """This process no longer holds `key`: nothing of it is posted from now on."""
        self.held.pop(key, None)
        self._until.pop(key, None)
        self.driven_since.pop(key, None)

    def may_post(self, key: str) -> bool:
        return time.monotonic() < self._until.get(key, -math.inf)

    def expired(self) -> list[str]:
        """Units held whose local deadline passed without a renewal (the database cannot be reached)."""
        now = time.monotonic()
        return [k for k in self.held if now >= self._until.get(k, -math.inf)]

    async def release(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for key in keys:
            self.forget(key)
        await self.conn.run(release, self.process, keys)

    async def stop(self) -> None:
        """Every lease given up and the process marked stopped; a failure is logged, not raised (the
        leases then run out by themselves)."""
        self.held.clear()
        self._until.clear()
        self.driven_since.clear()
        try:
            await asyncio.wait_for(self.conn.run(stopped, self.process), timeout=10)
        except Exception as e:
            log.warning("leases: could not give the leases up at stop (they run out by themselves): %s", e)


class Listener:
    """Wakes this process's renewal loop (`woken`) when another process on the ledger registers, gives units
    up or stops (`NOTIFY` on `CHANNEL`). A connection of its own on the caller's event loop, idle but for
    notifications; lost, it is made again by `ensure`, and meanwhile the renewals keep their own pace.
    `also`: other channels heard on the same connection (channel → what to call with each payload), such as
    the continue requests' (`continue_requests`); what they miss while it is lost, their owners look up."""

    def __init__(self, url: str, process: int, also: Mapping[str, Callable[[str], None]] | None = None) -> None:
        self.url, self.process = url, process
        self.also = dict(also or {})
        self.woken = asyncio.Event()
        self._conn: asyncpg.Connection | None = None
        self._failing = False

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload != str(self.process):
            self.woken.set()

    async def ensure(self) -> None:
        """Listening, or one line (once until it listens again) saying why not; never raises."""
        if self._conn is not None and not self._conn.is_closed():
            return
        try:
            conn = await asyncpg.connect(
                self.url, timeout=5, server_settings={"application_name": f"{os.getpid()} leases"[:63]}
            )
            await conn.add_listener(CHANNEL, self._heard)
            for channel, told in self.also.items():
                await conn.add_listener(channel, _payload_to(told))
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            if not self._failing:
                log.warning("leases: cannot hear other processes' handovers (renewals keep their pace): %s", e)
            self._failing = True
            return
        self._conn, self._failing = conn, False

    async def close(self) -> None:
        if self._conn is not None:
            try:
                await asyncio.wait_for(self._conn.close(), timeout=5)
            except Exception:
                self._conn.terminate()
            self._conn = None


def _payload_to(told: Callable[[str], None]) -> Callable[[object, int, str, str], None]:
    """asyncpg's listener callback (connection, pid, channel, payload), handing `told` the payload."""

    def heard(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        told(payload)

    return heard


def as_units(names: Iterable[tuple[str, int | None]]) -> list[Unit]:
    """(residence, shard count or None) → the units they make: a bot, or each of its shards."""
    out: list[Unit] = []
    for name, count in names:
        out += [Unit(name)] if count is None else [Unit(name, i) for i in range(count)]
    return out


def unit_of(key: str) -> Unit:
    name, sep, shard = key.rpartition("#")
    return Unit(name, int(shard)) if sep and shard.isdigit() else Unit(key)
