"""The ledger's PostgreSQL server going away mid-write (issue 23's failure parts): nothing lost, nothing
written twice, the ledger connects again.

Real parts: a real server (`pgkit`) whose sessions are ended with `pg_terminate_backend` or which is
stopped and started again on its folder and port; asyncpg's real errors; a loopback TCP relay between
the ledger and the server that drops the connection at one chosen moment (the server's answer to a
COMMIT it has made), which no server-side tool can do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pgkit
import pytest
from conftest import Pipeline, Room, residence
from roomkit import eventually

from residents.ledger import Ledger, LedgerWriteError, postgres
from residents.ledger.retry import until_written
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.records import Generation

pytestmark = pytest.mark.e2e  # a server stopped and started, a `residents run` process

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pg_server() -> Iterator[pgkit.Server]:
    with pgkit.server() as server:
        yield server


def generation(gid: str) -> Generation:
    return Generation(id=gid, residence="cairn", channel="room", model="m", trigger=None)


async def backend_pid(ledger: Ledger) -> int:
    [(pid,)] = await ledger.db.execute_fetchall("SELECT pg_backend_pid()")
    return int(pid)


def count(url: str, gid: str) -> int:
    return int(pgkit.fetch(url, "SELECT count(*) FROM generations WHERE id = $1", gid)[0][0])


class Relay:
    """A loopback TCP relay to the server. `drop_after_commit()`: the next answer the server gives to a
    COMMIT (its CommandComplete, tag "COMMIT") is not passed on; the connection is closed instead.
    `down`: new connections are closed at once and open ones cut (the server out of reach)."""

    COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"

    def __init__(self, port: int) -> None:
        self.target = port
        self.drop_commit = False
        self.dropped = 0
        self.down = False
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, database: str) -> str:
        return f"postgresql://ledger@127.0.0.1:{self.port}/{database}"

    def cut(self) -> None:
        self.down = True
        for w in list(self._open):
            w.transport.abort()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._open |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, False)),
            asyncio.create_task(self._pump(up_reader, writer, True)),
        ]
        try:
            # Either side ending (or the COMMIT's answer dropped) ends both: the connection is cut.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._open -= {writer, up_writer}
            for w in (writer, up_writer):
                w.transport.abort()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if answers and self.drop_commit and self.COMMIT_DONE in data:
                    self.drop_commit = False
                    self.dropped += 1
                    return  # not passed on: the connection is cut
                writer.write(data)
                await writer.drain()


@contextlib.asynccontextmanager
async def relayed(server: pgkit.Server) -> AsyncIterator[tuple[Relay, str, str]]:
    """A relay to a fresh database: (relay, the URL through it, the URL straight to the server)."""
    direct = server.create()
    relay = Relay(server.port)
    await relay.start()
    try:
        yield relay, relay.url(direct.rsplit("/", 1)[1]), direct
    finally:
        await relay.stop()


async def test_a_session_ended_between_writes_is_made_again(pg_server: pgkit.Server) -> None:
    url = pg_server.create()
    async with Ledger.open(url) as ledger:
        await ledger.create_generation(generation("g-before"))
        pid = await backend_pid(ledger)
        pgkit.fetch(url, "SELECT pg_terminate_backend($1)", pid)
        await ledger.create_generation(generation("g-after"))
        assert await backend_pid(ledger) != pid
        assert [await ledger.get_generation(g) is not None for g in ("g-before", "g-after")] == [True, True]
    assert count(url, "g-after") == 1


def end_every_other_session(url: str) -> None:
    """Every session on the database but the one asking ended, as a server restart ends them: the ledger's
    own, and the one holding its writer lock."""
    pgkit.fetch(
        url,
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"  # returns once each has ended
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )


def writer_lock_free(url: str) -> bool:
    """Whether a session of another process could take the writer lock alone (it lets go at once)."""
    [(taken,)] = pgkit.fetch(
        url,
        "SELECT pg_try_advisory_lock($1) AND pg_advisory_unlock($1)",
        postgres.WRITER_LOCK,
    )
    return bool(taken)


def writer_lock_holders(url: str) -> set[int]:
    """The server processes (pids) of the sessions holding the writer lock now."""
    rows = pgkit.fetch(
        url,
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid = $1::bigint::oid AND objid = $2::bigint::oid",
        *postgres.lock_key_parts(postgres.WRITER_LOCK),
    )
    return {int(pid) for (pid,) in rows}


@pytest.mark.parametrize("shared", [False, True], ids=["alone", "shared"])
async def test_a_writer_takes_its_lock_again_when_its_sessions_are_ended(pg_server: pgkit.Server, shared: bool) -> None:
    """A restart ends the session holding the writer lock with the others. The ledger's next statement,
    on a new connection, takes the lock again (alone, or shared as `residents run` holds it), so another
    writer is still refused rather than let in beside a process that goes on writing."""
    url = pg_server.create()
    async with Ledger.open(url, shared=shared) as ledger:
        await ledger.create_generation(generation("g-before"))
        assert not writer_lock_free(url)
        end_every_other_session(url)
        assert writer_lock_free(url)  # nothing holds it until the ledger is back
        await ledger.create_generation(generation("g-after"))
        assert not writer_lock_free(url)
    assert writer_lock_free(url)
    assert count(url, "g-after") == 1


async def test_a_writer_finding_its_lock_taken_after_a_restart_writes_nothing_until_it_is_free(
    pg_server: pgkit.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer (say a `ledger migrate`) took the writer lock while the server was away: the ledger's
    writes wait for it, then fail naming it (nothing written), and go on once it lets go."""
    monkeypatch.setattr(postgres, "RECONNECT", postgres.Reconnect(within=1.0, base=0.05, cap=0.2, connect_timeout=1))
    url = pg_server.create()
    async with Ledger.open(url) as ledger:
        end_every_other_session(url)
        other = await asyncpg.connect(url, server_settings={"application_name": "4242 elsewhere"})
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock($1)", postgres.WRITER_LOCK)
            with pytest.raises(LedgerWriteError, match=r"another writer \(4242 elsewhere\) took the ledger"):
                await ledger.create_generation(generation("g-refused"))
            assert count(url, "g-refused") == 0
        finally:
            await other.close()
        await ledger.create_generation(generation("g-refused"))
        assert not writer_lock_free(url)
    assert count(url, "g-refused") == 1


async def test_a_session_ended_during_a_commit_is_rolled_back_and_written_once(pg_server: pgkit.Server) -> None:
    """The session is ended while its COMMIT runs (a deferred trigger holds the COMMIT): the transaction is
    rolled back by the server, looked up as not committed, and the whole change written again, once."""
    url = pg_server.create()
    async with Ledger.open(url) as ledger:
        pgkit.execute(
            url,
            """
            CREATE SEQUENCE held_once;
            CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF nextval('held_once') = 1 THEN PERFORM pg_sleep(60); END IF; RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON generations DEFERRABLE INITIALLY DEFERRED
              FOR EACH ROW EXECUTE FUNCTION hold_commit();
            """,
        )
        pid = await backend_pid(ledger)
        write = asyncio.create_task(ledger.create_generation(generation("g-held")))
        await eventually(
            lambda: pgkit.fetch(url, "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'", pid),
            timeout=10,
        )
        pgkit.fetch(url, "SELECT pg_terminate_backend($1)", pid)
        await asyncio.wait_for(write, timeout=20)
        assert await backend_pid(ledger) != pid
    assert count(url, "g-held") == 1


async def test_a_commit_whose_answer_is_lost_is_looked_up_not_written_twice(
    pg_server: pgkit.Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The server commits, and the connection drops before its answer arrives: the ledger asks the server
    whether that transaction committed (it did), and the change is not written again."""
    async with relayed(pg_server) as (relay, url, direct):
        async with Ledger.open(url) as ledger:
            relay.drop_commit = True
            with caplog.at_level(logging.WARNING, logger="residents.ledger.postgres"):
                await ledger.create_generation(generation("g-once"))
            assert relay.dropped == 1
            assert any("was committed" in r.getMessage() for r in caplog.records)
            await ledger.create_generation(generation("g-next"))
        assert count(direct, "g-once") == 1 and count(direct, "g-next") == 1


async def test_past_the_bound_a_write_is_refused_and_goes_on_once_the_server_is_back(
    pg_server: pgkit.Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server out of reach for longer than the reconnect bound: the write fails as a `LedgerWriteError`
    (the disk-full path, `until_written`), and is written once the server can be reached again."""
    monkeypatch.setattr(postgres, "RECONNECT", postgres.Reconnect(within=1.0, base=0.05, cap=0.2, connect_timeout=1))
    async with relayed(pg_server) as (relay, url, direct):
        async with Ledger.open(url) as ledger:
            relay.cut()
            with pytest.raises(
                LedgerWriteError, match="the ledger could not write: its database could not be reached for 1s"
            ):
                await ledger.create_generation(generation("g-out"))
            assert count(direct, "g-out") == 0
            with caplog.at_level(logging.WARNING, logger="residents.ledger.retry"):
                waiting = asyncio.create_task(until_written("g-out", ledger.create_generation, generation("g-out")))
                await eventually(lambda: any("not recorded yet" in m for m in caplog.messages), timeout=10)
            relay.down = False
            await asyncio.wait_for(waiting, timeout=20)
        assert count(direct, "g-out") == 1


async def test_a_full_disk_on_the_server_is_a_ledger_write_error(pg_server: pgkit.Server) -> None:
    """SQLSTATE 53100 (disk_full), as the server raises it, is the same refusal as SQLITE_FULL."""
    url = pg_server.create()
    async with Ledger.open(url) as ledger:
        pgkit.execute(
            url,
            """
            CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.id = 'g-full' THEN
              RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
            END IF; RETURN NEW; END $$;
            CREATE TRIGGER full_disk BEFORE INSERT ON generations FOR EACH ROW EXECUTE FUNCTION full_disk();
            """,
        )
        with pytest.raises(LedgerWriteError, match="No space left on device"):
            await ledger.create_generation(generation("g-full"))
        await ledger.create_generation(generation("g-fine"))
    assert count(url, "g-full") == 0 and count(url, "g-fine") == 1


async def test_the_server_restarted_while_a_reply_is_under_way_loses_and_repeats_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A turn's provider stream is held; the server is stopped, the stream let go (the turn's writes find no
    server), the server started again on its folder and port: the turn is recorded once, posted once, and
    `verify` holds."""
    from discordkit import GatedProvider

    from residents import cli

    with pgkit.server() as server:
        url = server.create()
        provider = GatedProvider()
        await provider.start()
        ledger = await Ledger.open(url)
        p = Pipeline(provider, ledger, [])
        try:
            room = Room()
            resident = p.resident(residence(), room)
            provider.enqueue([Call(sse=sse.stream("said once, whatever the server does", "end_turn", 5))])
            provider.hold()
            m = room.say("alice", "hello")
            turn = asyncio.create_task(resident.respond(room, "room", list(room.history), trigger=m.id))
            await eventually(lambda: provider.arrived == 1, timeout=10)
            await asyncio.to_thread(server.stop)
            with caplog.at_level(logging.WARNING, logger="residents.ledger.postgres"):
                provider.release()
                await eventually(
                    lambda: any("connection to its database was lost" in m for m in caplog.messages), timeout=10
                )
            assert not turn.done()
            await asyncio.to_thread(server.start)
            reply = await asyncio.wait_for(turn, timeout=30)
            assert reply.generation is not None and reply.generation.status == "completed"
            assert [x.content for x in room.sent] == ["said once, whatever the server does"]
        finally:
            await p.client.close()
            await ledger.close()
            await provider.stop()
        assert pgkit.fetch(url, "SELECT count(*) FROM generations")[0][0] == 1
        assert pgkit.fetch(url, "SELECT count(*) FROM posts WHERE message_id IS NOT NULL")[0][0] == 1
        assert await asyncio.to_thread(cli.main, ["ledger", "verify", "--db", url, "--strict"]) == 0


@pytest.mark.parametrize("fault", ["session ended", "server restarted"])
async def test_residents_run_goes_on_after_its_ledger_is_cut_mid_reply(
    tmp_path: Path, pg_server: pgkit.Server, fault: str
) -> None:
    """`residents run --db URL`: while a reply is streaming, the server ends the process's ledger session
    (`pg_terminate_backend`), or is stopped and started again on its folder and port (a server of the
    test's own). The reply is recorded once and posted once, the process says in its log that it connected
    again, and it answers the next mention; `verify --strict` holds."""
    if fault == "server restarted":
        with pgkit.server() as own:
            await run_cut_mid_reply(tmp_path, own, fault)
    else:
        await run_cut_mid_reply(tmp_path, pg_server, fault)


async def run_cut_mid_reply(tmp_path: Path, pg_server: pgkit.Server, fault: str) -> None:
    from discordkit import GatedProvider
    from roomkit import running_room

    from residents import cli

    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(
        "name: cairn\nmodel: claude-3-opus-20240229\nmax_tokens: 1024\n"
        "discord:\n  token_env: RECONNECT_CAIRN_TOKEN\n  channels: [general]\n"
        "policy:\n  floor: {cooldown_seconds: 0, reply_to: mentions}\n"
    )
    url = pg_server.create()
    provider = GatedProvider()
    await provider.start()
    provider.enqueue([Call(sse=sse.stream(f"reply {n}, said once", "end_turn", 5, size=4)) for n in (1, 2)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(ANTHROPIC_BASE_URL=provider.url, ANTHROPIC_API_KEY="k", PYTHONPATH=str(ROOT))
    log_path = tmp_path / "run.log"
    writer_parts = postgres.lock_key_parts(postgres.WRITER_LOCK)
    try:
        async with running_room(["general"]) as room:
            with open(log_path, "wb") as log_file:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "residents", "run", "--discord-api", room.url, "--db", url,
                    cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=log_file,
                )  # fmt: skip
            try:
                assert proc.stdout is not None
                line = (await asyncio.wait_for(proc.stdout.readline(), timeout=40)).decode()
                assert line.startswith("residents run: 1 resident connected"), line

                def cairn() -> list[str]:
                    return [m["content"] for m in room.messages("general") if m["author"] == "cairn"]

                provider.hold()
                room.post("general", "alice", "first, @cairn", mentions=["cairn"])
                await eventually(lambda: provider.arrived == 1, timeout=20)
                if fault == "server restarted":
                    await asyncio.to_thread(pg_server.stop)
                    provider.release()  # the reply's writes find no server
                    await eventually(lambda: "connection to its database was lost" in log_path.read_text(), timeout=20)
                    await asyncio.to_thread(pg_server.start)
                # The process's sessions (its ledger's and its leases'), not the one holding its writer lock,
                # are ended mid-reply.
                ended = (
                    []
                    if fault == "server restarted"
                    else pgkit.fetch(
                        url,
                        "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a WHERE a.datname = current_database()"
                        " AND a.application_name LIKE $1 AND a.pid NOT IN (SELECT pid FROM pg_locks WHERE"
                        " locktype = 'advisory' AND classid = $2::bigint::oid AND objid = $3::bigint::oid)",
                        f"{proc.pid} %",
                        *writer_parts,
                    )
                )
                assert ended == ([] if fault == "server restarted" else [(True,)] * len(ended)) and (
                    fault == "server restarted" or ended
                )
                provider.release()
                await eventually(lambda: cairn() == ["reply 1, said once"], timeout=40)
                room.post("general", "alice", "second, @cairn", mentions=["cairn"])
                await eventually(lambda: cairn() == ["reply 1, said once", "reply 2, said once"], timeout=40)
                proc.send_signal(signal.SIGINT)
                await asyncio.wait_for(proc.communicate(), timeout=30)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0
            assert cairn() == ["reply 1, said once", "reply 2, said once"]
    finally:
        await provider.stop()
    text = log_path.read_text()
    assert "connection to its database was lost" in text and "reached its database again" in text, text
    assert pgkit.fetch(url, "SELECT count(*) FROM generations WHERE status = 'completed'") == [(2,)]
    assert pgkit.fetch(url, "SELECT count(*) FROM posts WHERE message_id IS NOT NULL") == [(2,)]
    assert await asyncio.to_thread(cli.main, ["ledger", "verify", "--db", url, "--strict"]) == 0
