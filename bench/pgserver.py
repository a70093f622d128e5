"""A throwaway PostgreSQL server: the real server, on a temporary data folder, listening on loopback only,
stopped when its context ends; `create()` gives each user (a test, a benchmark's run) a database of its own.
The ledger's tests reach it through `tests/pgkit.py`, the scale benchmark directly (bench never imports tests).

The server's binaries come from the Debian package (`.ci/run` installs `postgresql` when they are
missing); with none at all, a test that asks for the server fails saying so: it is not skipped.
PostgreSQL refuses to run as root: as root, the server runs as the `postgres` (or `nobody`) user.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg

READY_WITHIN = 30.0  # seconds for the server to accept connections


def binaries() -> Path:
    """The folder of `initdb` and `postgres`: on PATH, or where Debian's package puts them."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "postgres").exists():
            return Path(folder)
    raise RuntimeError(
        "PostgreSQL's server binaries (initdb, postgres) are not installed: `.ci/run` installs them"
        " (apt-get install postgresql); the ledger's PostgreSQL tests and the scale benchmark need a real server"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that runs the server as a user it accepts (not root), and that user."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return ["runuser", "-u", name, "--"], pwd.getpwnam(name)
    raise RuntimeError("running as root, and no `postgres` or `nobody` user to run PostgreSQL as")


class Server:
    """A running server: `url(database)` names a database on it; `create()` makes a fresh one; `stop()`
    and `start()` take it down and bring it back on the same folder and port (a restart)."""

    def __init__(self, port: int, folder: Path, process: subprocess.Popen[bytes]) -> None:
        self.port, self.folder, self.process = port, folder, process
        self._names = itertools.count(1)

    def stop(self) -> None:
        """Fast shutdown (clients disconnected, no wait for them), as `pg_ctl stop -m fast` does it."""
        _stop(self.folder / "data")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def start(self) -> None:
        """The server started again on its folder and port, once it accepts connections."""
        self.process = _start(self.folder, self.port)
        _wait_ready(self, self.folder / "server.log")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://ledger@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> None:
        execute(self.url(database), statement)

    def create(self) -> str:
        """A new empty database (from template0: nothing another test left); its URL."""
        name = f"ledger{next(self._names)}"
        self.sql(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.url(name)


@contextlib.contextmanager
def server() -> Iterator[Server]:
    """initdb into a temporary folder, start `postgres` on 127.0.0.1 (its socket in that folder too),
    wait until it accepts connections, yield it; stop it (fast shutdown) and remove the folder."""
    prefix, user = _as_user()
    folder = Path(tempfile.mkdtemp(prefix="residents-pg-"))
    try:
        if user is not None:
            os.chown(folder, user.pw_uid, user.pw_gid)
        data = folder / "data"
        subprocess.run(
            [
                *prefix,
                str(binaries() / "initdb"),
                "-D",
                str(data),
                "-U",
                "ledger",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        port = _free_port()
        running = Server(port, folder, _start(folder, port))
        try:
            _wait_ready(running, folder / "server.log")
            yield running
        finally:
            running.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _start(folder: Path, port: int) -> subprocess.Popen[bytes]:
    """`postgres` on the data folder in `folder`, listening on 127.0.0.1:`port`, its log appended to
    `folder/server.log`."""
    prefix, _ = _as_user()
    with open(folder / "server.log", "ab") as log:
        return subprocess.Popen(
            [
                *prefix,
                str(binaries() / "postgres"),
                "-D",
                str(folder / "data"),
                "-k",
                str(folder),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _stop(data: Path) -> None:
    """Fast shutdown by pg_ctl as the server's user, waiting for it."""
    prefix, _ = _as_user()
    subprocess.run(
        [*prefix, str(binaries() / "pg_ctl"), "stop", "-D", str(data), "-m", "fast", "-w", "-t", "30"],
        capture_output=True,
        timeout=60,
    )


def _wait_ready(server: Server, log: Path) -> None:
    """Until a connection is accepted (the server is past its start-up), or the server stops, or time's up."""
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"PostgreSQL stopped at start: {log.read_text(errors='replace')[-2000:]}")
        try:
            server.sql("SELECT 1")
            return
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            time.sleep(0.1)
    raise RuntimeError(f"PostgreSQL did not accept connections within {READY_WITHIN:.0f} s")


def fetch(url: str, statement: str, *params: object) -> list[tuple[object, ...]]:
    """One statement on the database at `url`, its rows as tuples: through asyncpg on a loop of its own,
    in a thread of its own (so a test's own running loop may call it too)."""
    return _in_thread(_fetch(url, statement, params))


def execute(url: str, script: str) -> None:
    """Statements without parameters (one or several) on the database at `url`."""
    _in_thread(_execute(url, script))


def _in_thread(work: Any) -> Any:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result(timeout=60)


async def _fetch(url: str, statement: str, params: tuple[object, ...]) -> list[tuple[object, ...]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch(statement, *params)]
    finally:
        await conn.close()


async def _execute(url: str, script: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(script)
    finally:
        await conn.close()
