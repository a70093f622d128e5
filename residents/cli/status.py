"""`residents status`: which processes run the residents of a ledger, and which bots each drives.

On PostgreSQL, any number of `residents run` processes share a ledger under leases
(`residents.ledger.leases`): each process with its host, pid, start, last heartbeat and whether it is
alive, and the bots (or shards) whose lease it holds and since when, all by the database's clock. On
SQLite one process writes a ledger, holding its file lock (`residents.ledger.lock`): who, or nobody.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import urllib.parse
from pathlib import Path
from typing import Any

import click

from ..ledger import leases, lock, postgres
from .common import DEFAULT_DB, UsageError, emit, emit_json, ledger_path, open_ledger


@click.command()
@click.option(
    "--db",
    metavar="PATH",
    help=f"The ledger: a SQLite path or a postgresql:// URL (default: {DEFAULT_DB} in the configuration folder).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
def status(db: str | None, as_json: bool) -> int:
    """The processes running residents on a ledger, and the bots each holds.

    On a PostgreSQL ledger: each process's host, pid, start and last heartbeat, whether it is alive (its
    heartbeat younger than its lease), and each bot (or shard, NAME#ID) whose lease it holds, since when;
    then the bots no live process holds. On SQLite: the one process holding the file's lock, or none.

    \b
    Example:
      residents status --db postgresql://residents@db.internal/residents
      residents status --json
    """
    path = ledger_path(db)
    if postgres.is_url(path):
        try:
            urllib.parse.urlsplit(path).port  # noqa: B018 (read for its check: a port that is not a number)
        except ValueError as e:
            raise UsageError(f"--db: not a usable PostgreSQL URL: {e}") from None
        return _postgresql(path, as_json)
    if not Path(path).exists():
        raise UsageError(f"{path}: no ledger there")
    held = lock.holder(path)
    pid, _, host = (held or "").partition(" ")
    if as_json:
        emit_json(
            {
                "ledger": path,
                "backend": "sqlite",
                "holder": None if held is None else {"pid": int(pid) if pid.isdigit() else None, "host": host or None},
            }
        )
    elif held is None:
        emit(f"{path}: no process holds it (SQLite: one process writes a ledger, holding its file lock)")
    else:
        who = f"process {pid} on {host}" if pid.isdigit() and host else "a process"
        emit(f"{path}: {who} holds it (SQLite: one process writes a ledger, holding its file lock)")
    return 0


def _postgresql(url: str, as_json: bool) -> int:
    async def read() -> leases.Status:
        async with open_ledger(url) as lg:
            return await lg.db.run(leases.status)

    got = asyncio.run(read())
    if as_json:
        emit_json(
            {
                "ledger": postgres.shown(url),
                "backend": "postgresql",
                "processes": [_as_json(p) for p in got.processes],
                "free": got.free,
            }
        )
        return 0
    alive = sum(1 for p in got.processes if p.alive)
    lines = [f"{postgres.shown(url)}: {alive} live process{'es' if alive != 1 else ''}"]
    for p in got.processes:
        state = (
            f"stopped {_at(p.stopped_at)}"
            if p.stopped_at is not None
            else f"last heartbeat {got.now - p.heartbeat_at:.1f} s ago, " + ("alive" if p.alive else "not alive")
        )
        lines.append(f"  process {p.id}: pid {p.pid} on {p.host}, started {_at(p.started_at)}, {state}")
        lines += [f"    {unit}  since {_at(since)}" for unit, since in p.units]
    if got.free:
        lines.append(f"  held by no process: {', '.join(got.free)}")
    emit("\n".join(lines))
    return 0


def _at(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _as_json(p: leases.ProcessRow) -> dict[str, Any]:
    return {
        "id": p.id,
        "host": p.host,
        "pid": p.pid,
        "started_at": p.started_at,
        "heartbeat_at": p.heartbeat_at,
        "stopped_at": p.stopped_at,
        "alive": p.alive,
        "units": [{"unit": unit, "since": since} for unit, since in p.units],
    }
