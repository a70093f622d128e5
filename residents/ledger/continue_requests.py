"""Continue requests: a moderator's /continue carried to the process that drives the resident's bot.

Why in the database: on a shared PostgreSQL ledger (`leases.py`) the commands bot runs in one process, but
a continuation posts as the resident's own bot, which another process may drive. The asking process records
a request (`ask`) and tells the others (`NOTIFY` on `ASKED`); the process holding the bot's lease takes it
(`take`: at most once, and only while nobody gave it up and its deadline has not passed), runs the
continuation, and writes the moderator's answer to the row (`answer`, told on `ANSWERED`). The asking
process waits for that answer; if nobody took the request in time it gives it up (`give_up`), in the same
row lock as a take, so a late holder can never act on a request the moderator was told did not run.

These rows are operational state, like `processes` and `leases`: no chain entry is made of them, and
`verify` reads none. Every time is the database's clock. On SQLite the table exists and stays empty: one
process drives every bot there, and /continue runs in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .connection import Session
from .leases import CLOCK, NOTIFY, one_transaction

ASKED = "residents_continue_asked"  # payload: the request's id
ANSWERED = "residents_continue_answered"  # payload: the request's id

# Every time is the database's clock, written out whole in each statement (no SQL is built from values).
ASK = (
    "INSERT INTO continue_requests (generation, residence, channel, segments, asked_by, asked_at, deadline)"
    " VALUES ($1, $2, $3, $4, $5, extract(epoch from clock_timestamp())::double precision,"
    " extract(epoch from clock_timestamp())::double precision + $6) RETURNING id"
)
# Taken at most once, by one process, before the deadline and unless the asker gave it up.
TAKE = (
    "UPDATE continue_requests SET taken_by = $2, taken_at = extract(epoch from clock_timestamp())::double precision"
    " WHERE id = $1 AND taken_by IS NULL AND given_up_at IS NULL"
    " AND deadline > extract(epoch from clock_timestamp())::double precision"
    " RETURNING generation, residence, channel, segments"
)
GIVE_UP = (
    "UPDATE continue_requests SET given_up_at = extract(epoch from clock_timestamp())::double precision"
    " WHERE id = $1 AND taken_by IS NULL RETURNING id"
)
ANSWER = (
    "UPDATE continue_requests SET answer = $2, answered_at = extract(epoch from clock_timestamp())::double precision"
    " WHERE id = $1 AND taken_by = $3"
)
# The taker is alive while it beats its heartbeat within its lease and has not stopped (`leases.LIVE`).
STATE = (
    "SELECT r.taken_by, r.answer, r.given_up_at, p.stopped_at IS NULL AND p.heartbeat_at + p.lease_seconds > $2"
    " FROM continue_requests r LEFT JOIN processes p ON p.id = r.taken_by WHERE r.id = $1"
)
PENDING = (
    "SELECT id FROM continue_requests WHERE taken_by IS NULL AND given_up_at IS NULL AND deadline > $2"
    " AND residence = ANY($1::text[]) ORDER BY id"
)
ONE = (
    "SELECT generation, residence, channel, segments FROM continue_requests"
    " WHERE id = $1 AND taken_by IS NULL AND given_up_at IS NULL AND deadline > $2"
)


@dataclass(frozen=True)
class Request:
    """What a taken request asks: one segment more of `generation`, from the `segments` its asker saw."""

    id: int
    generation: str
    residence: str
    channel: str
    segments: int


@dataclass(frozen=True)
class State:
    """Where a request stands: who took it (None: nobody yet), the moderator's answer once written, whether
    the asker gave it up, and whether its taker still runs (None while nobody took it)."""

    taken_by: int | None
    answer: str | None
    given_up: bool
    taker_alive: bool | None


def ask(conn: Session, generation: str, residence: str, channel: str, segments: int, asker: int, within: float) -> int:
    """Record a request another process may take within `within` seconds, and tell them (as it commits)."""
    with one_transaction(conn):
        [(rid,)] = conn.execute(ASK, (generation, residence, channel, segments, asker, within)).fetchall()
        conn.execute(NOTIFY, (ASKED, str(rid)))
    return int(rid)


def take(conn: Session, request: int, process: int) -> Request | None:
    """The request, now this process's alone; None if another took it, it was given up, or its time passed."""
    row = conn.execute(TAKE, (request, process)).fetchone()
    if row is None:
        return None
    return Request(request, str(row[0]), str(row[1]), str(row[2]), int(row[3]))


def answer(conn: Session, request: int, process: int, text: str) -> None:
    """The moderator's answer, written by the process that took the request, and told to the asker."""
    with one_transaction(conn):
        conn.execute(ANSWER, (request, text, process))
        conn.execute(NOTIFY, (ANSWERED, str(request)))


def give_up(conn: Session, request: int) -> bool:
    """Stop waiting for a taker: True if nobody had taken it (and now nobody ever will), False if one had."""
    return conn.execute(GIVE_UP, (request,)).fetchone() is not None


def state(conn: Session, request: int) -> State:
    [(now,)] = conn.execute(CLOCK).fetchall()
    [(taken_by, text, given_up_at, alive)] = conn.execute(STATE, (request, now)).fetchall()
    return State(
        None if taken_by is None else int(taken_by),
        None if text is None else str(text),
        given_up_at is not None,
        None if taken_by is None else bool(alive),
    )


def pending(conn: Session, residences: Sequence[str]) -> list[int]:
    """Requests for these residents that nobody took yet and that may still be taken (a notice missed)."""
    [(now,)] = conn.execute(CLOCK).fetchall()
    return [int(r[0]) for r in conn.execute(PENDING, (list(residences), now)).fetchall()]


def pending_one(conn: Session, request: int) -> Request | None:
    """What the request asks, while it may still be taken (for the process deciding whether it is its own)."""
    [(now,)] = conn.execute(CLOCK).fetchall()
    row = conn.execute(ONE, (request, now)).fetchone()
    return None if row is None else Request(request, str(row[0]), str(row[1]), str(row[2]), int(row[3]))
