"""Two ledger backends, one contract (issue 23, item 1): every test here runs on a SQLite file and on a
real PostgreSQL server (`pgkit`: started for the session on loopback, one database per test).

Same records, same migrations, same hash chain (the same bytes hashed: one history written to both ends
on the same head), `verify` naming the same tampering, the CLI's verbs on a path or a URL, and one
writer at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import types
from contextlib import closing
from pathlib import Path

import pgkit
import pytest
from conftest import Pipeline, Room, residence
from ledgerkit import Backend, rows

from residents import cli, truth
from residents.ledger import Ledger, LedgerError, Superseded, appending, budgets
from residents.ledger.migrations import MIGRATIONS
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.records import (
    Attempt,
    BudgetRefusal,
    Generation,
    Outcome,
    Post,
    PostKind,
    PostReason,
    Segment,
    Stump,
)

pytestmark = pytest.mark.e2e  # a server, the whole CLI and a second `residents` process

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("retry", "ceiling", "thinking-cut")
TRICKY = "Ünïcødé — 漢字 and emoji 👩‍👩‍👧 with trailing spaces   \n\t and a lone surrogate \ud83d"


@pytest.fixture
def location(backend: Backend) -> str:
    """Where a test's ledger is: a SQLite file's path, or a fresh PostgreSQL database's URL (`backend`)."""
    return backend.location


def change(location: str, statement: str) -> None:
    """A row changed behind the ledger's back, as a person with the database's own client would."""
    if location.startswith("postgresql://"):
        pgkit.execute(location, statement)
        return
    with closing(sqlite3.connect(location)) as con:
        con.execute(statement)
        con.commit()


async def test_a_new_ledger_records_every_migration_once(location: str) -> None:
    async with Ledger.open(location):
        pass
    async with Ledger.open(location) as lg:  # a second start applies nothing new
        names = [r[0] for r in await lg.db.execute_fetchall("SELECT name FROM _migrations ORDER BY name")]
    assert names == sorted(name for name, _ in MIGRATIONS)


async def test_every_record_round_trips_byte_exact(location: str) -> None:
    """Texts (a lone surrogate too), attempts with blocks, stumps and posts read back as written."""
    g = Generation(id="g-1", residence="cairn", channel="room", model="m", request={"system": TRICKY})
    a = Attempt(id="a-1", generation_id="g-1", segment=0, index=0)
    async with Ledger.open(location) as lg:
        await lg.start_attempt(a, new_generation=g)
        await lg.add_chunk("a-1", 0, TRICKY[:10])
        assert await lg.streamed_text("a-1") == TRICKY[:10]
        a.text, a.outcome, a.stop_reason = TRICKY, "truncated", "max_tokens"
        g.text, g.status, g.stop_reason = TRICKY, "truncated", "max_tokens"
        g.segments = [Segment(0, "a-1", "max_tokens", len(TRICKY), None)]
        stump = Stump(
            id="s-1",
            generation_id="g-1",
            attempt_id="a-1",
            cause="max-tokens",
            text=TRICKY,
            output_tokens=None,
            residence="cairn",
            scope="output",
        )
        await lg.finish_generation(g, [stump], last_attempt=a)
        post = Post(id="p-1", generation_id="g-1", seq=1, kind="partial", content=TRICKY, channel="room")
        await lg.add_posts([post])
        await lg.mark_delivered(post, "m-9")
    async with Ledger.open(location, read_only=True) as lg:
        got = await lg.get_generation("g-1")
        assert got is not None
        assert got.text == TRICKY and got.request == {"system": TRICKY}
        assert [(x.text, x.outcome) for x in got.attempts] == [(TRICKY, "truncated")]
        assert [(s.text, s.published) for s in got.stumps] == [(TRICKY, True)]  # published by the trigger
        assert [(p.content, p.message_id) for p in got.posts] == [(TRICKY, "m-9")]
        assert await lg.undelivered_posts_of("cairn") == []
        assert [s.id for s in await lg.list_stump_meta()] == ["s-1"]
        assert [r["id"] for r in await lg.list_generations("cairn")] == ["g-1"]
    [(stored,)] = rows(location, "SELECT text FROM generations WHERE id = 'g-1'")
    assert bytes(stored) == TRICKY.encode("utf-8", "surrogatepass")


async def write_history(location: str) -> tuple[int, str]:
    """One fixed history (ids, times, texts): the chain's head it ends on."""
    g = Generation(id="g-7", residence="cairn", channel="room", model="m", created_at=1.0)
    a = Attempt(id="a-7", generation_id="g-7", segment=0, index=0, started_at=1.0)
    async with Ledger.open(location) as lg:
        await lg.start_attempt(a, new_generation=g)
        a.text, a.outcome, a.stop_reason, a.ended_at = TRICKY, "completed", "end_turn", 2.0
        g.text, g.status, g.stop_reason, g.finished_at = TRICKY, "completed", "end_turn", 2.0
        g.segments = [Segment(0, "a-7", "end_turn", len(TRICKY), 12)]
        await lg.finish_generation(g, [], last_attempt=a)
        post = Post(id="p-7", generation_id="g-7", seq=1, kind="speech", content=TRICKY, channel="room")
        await lg.add_posts([post])
        await lg.mark_delivered(post, "m-1")
    [(seq, digest)] = rows(location, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    return int(seq), str(digest)


async def test_the_same_history_ends_on_the_same_head_on_both_backends(
    tmp_path: Path, pg_server: pgkit.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain hashes the same canonical bytes for the same records, whichever backend stores them (on
    PostgreSQL the hash is computed by the database's own `chain_hash`): one head on both."""
    monkeypatch.setattr(appending, "time", types.SimpleNamespace(time=lambda: 1_800_000_000.0))  # each entry's `at`
    on_sqlite = await write_history(str(tmp_path / "l.db"))
    url = pg_server.create()
    on_postgresql = await write_history(url)
    assert on_sqlite == on_postgresql and on_sqlite[0] == 4  # attempt, generation, post, delivered
    sqlite_rows = rows(str(tmp_path / "l.db"), "SELECT seq, kind, record, prev, body, hash FROM chain ORDER BY seq")
    assert [tuple(r) for r in rows(url, "SELECT seq, kind, record, prev, body, hash FROM chain ORDER BY seq")] == [
        tuple(r) for r in sqlite_rows
    ]


def replayed(location: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Scenarios replayed on the real pipeline into the ledger at `location` (a path or a URL)."""
    for name in SCENARIOS:
        assert cli.main(["replay", str(ROOT / "scenarios" / f"{name}.yaml"), "--db", location, "--json"]) == 0
    capsys.readouterr()


def test_replayed_scenarios_verify_with_their_head(location: str, capsys: pytest.CaptureFixture[str]) -> None:
    replayed(location, capsys)
    [(last, head)] = rows(location, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    assert cli.main(["ledger", "verify", "--db", location, "--strict"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].endswith(f"; chain of {last} entries, head {head}"), out


def test_verify_names_a_row_changed_behind_the_ledgers_back(location: str, capsys: pytest.CaptureFixture[str]) -> None:
    replayed(location, capsys)
    [(sid,)] = rows(location, "SELECT id FROM stumps WHERE cause = 'retry-abandoned'")
    change(location, f"UPDATE stumps SET output_tokens = 999 WHERE id = '{sid}'")
    assert cli.main(["ledger", "verify", "--db", location]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out and any(sid in line for line in out), out


def test_an_entry_of_the_chain_cannot_be_changed(location: str, capsys: pytest.CaptureFixture[str]) -> None:
    replayed(location, capsys)
    error = Exception if location.startswith("postgresql://") else sqlite3.IntegrityError
    with pytest.raises(error, match="append-only"):
        change(location, "UPDATE chain SET body = '{}' WHERE seq = 1")
    with pytest.raises(error, match="append-only"):
        change(location, "DELETE FROM chain WHERE seq = 1")


def test_list_show_stumps_and_export_read_a_path_or_a_url(location: str, capsys: pytest.CaptureFixture[str]) -> None:
    replayed(location, capsys)
    assert cli.main(["ledger", "list", "--db", location, "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ids = [r[0] for r in rows(location, "SELECT id FROM generations ORDER BY created_at DESC")]
    assert [g["id"] for g in (listed[0] if isinstance(listed[0], list) else listed)] == ids
    assert cli.main(["ledger", "show", ids[-1], "--db", location, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["id"] == ids[-1]
    assert cli.main(["ledger", "stumps", "--db", location]) == 0
    assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("s-")]) == 3
    assert cli.main(["ledger", "export", "--db", location]) == 0
    exported = capsys.readouterr().out.splitlines()
    [(count,)] = rows(location, "SELECT count(*) FROM chain")
    assert len(exported) == count


async def test_a_second_writer_is_refused_in_one_line(location: str) -> None:
    """While one process writes the ledger, another is refused before it reads or writes anything, exit 2
    and one line naming the writer: the lock on a file, an advisory lock on PostgreSQL. Once the first
    closes, the next starts."""
    first = await Ledger.open(location)
    try:
        again = await Ledger.open(location)  # the same process may open its ledger again (the demo does)
        await again.close()
        second = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "residents", "ledger", "migrate", "--db", location],
            capture_output=True,
            text=True,
            timeout=60,
        )
        err = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(err) == 1, second
        assert re.fullmatch(
            rf"residents: .+: in use by process {os.getpid()} on {re.escape(socket.gethostname())};"
            r" one process writes a ledger at a time \(the read-only `residents ledger` verbs work beside it\)",
            err[0],
        ), err
    finally:
        await first.close()
    async with Ledger.open(location):  # the first writer gone: the next one starts
        pass


async def test_the_real_pipeline_writes_a_turn_to_either_backend(location: str) -> None:
    server = ProviderServer()
    await server.start()
    ledger = await Ledger.open(location)
    p = Pipeline(server, ledger, [])
    try:
        text = TRICKY
        reply, posts = await p.turn(
            p.resident(residence()), Room(), "go", [Call(sse=sse.stream(text, "max_tokens", 4096, size=5))]
        )
        assert reply.generation.status == "truncated" and [x.kind for x in posts][:1] == ["partial"]
        stored = await ledger.get_generation(reply.generation.id)
        assert stored is not None and stored.text == text and [s.text for s in stored.stumps] == [text]
    finally:
        await p.client.close()
        await ledger.close()
        await server.stop()


async def test_an_unreachable_server_is_one_clear_line(pg_server: pgkit.Server) -> None:
    url = f"postgresql://ledger:secret@127.0.0.1:{pg_server.port}/no_such_database"
    with pytest.raises(LedgerError) as got:
        await Ledger.open(url)
    message = str(got.value)
    assert "no_such_database" in message and "cannot open the ledger" in message and "secret" not in message
    assert "\n" not in message


def test_residents_yaml_names_the_ledger_when_no_db_is_given(
    tmp_path: Path, pg_server: pgkit.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ledger:` in residents.yaml takes a URL (or a path) as --db does; --db still wins over it."""
    url = pg_server.create()
    replayed(url, capsys)
    (tmp_path / "residents.yaml").write_text(f"ledger: {url}\n")
    assert cli.main(["--config", str(tmp_path), "ledger", "verify"]) == 0
    [(count,)] = rows(url, "SELECT count(*) FROM chain")
    assert f"chain of {count} entries" in capsys.readouterr().out
    (tmp_path / "residents.yaml").write_text("ledger:\n  db: mysql://somewhere/ledger\n")
    assert cli.main(["--config", str(tmp_path), "ledger", "list"]) == 2
    err = capsys.readouterr().err
    assert "ledger.db" in err and "give a path (SQLite) or a postgresql:// URL" in err


def test_without_postgresql_binaries_the_tests_fail_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no server can be started, the PostgreSQL half of these tests errors with this line; it is
    never skipped (CI installs the binaries)."""
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(pgkit.glob, "glob", lambda pattern: [])
    with pytest.raises(RuntimeError, match=r"server binaries \(initdb, postgres\) are not installed"):
        pgkit.binaries()


def test_verify_shared_by_worker_processes_reads_either_backend(
    location: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long ledger is checked with a worker process, on a read-only session of its own: on a URL too,
    with the same lines as one process gives."""
    from residents.ledger import verify

    replayed(location, capsys)
    [(sid,)] = rows(location, "SELECT id FROM stumps WHERE cause = 'retry-abandoned'")
    change(location, f"UPDATE stumps SET output_tokens = 999 WHERE id = '{sid}'")
    assert cli.main(["ledger", "verify", "--db", location]) == 1
    alone = capsys.readouterr().out
    monkeypatch.setattr(verify, "PARALLEL_FROM", 0)
    monkeypatch.setattr(verify, "CHUNK", 2)
    assert cli.main(["ledger", "verify", "--db", location]) == 1
    assert capsys.readouterr().out == alone


async def test_run_writes_a_url_and_a_second_run_shares_it_driving_nothing_the_first_holds(
    tmp_path: Path, pg_server: pgkit.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`residents run --db URL` against the local room: its table names the URL without the password, and
    a second `run` on the same database is one more process sharing it (`tests/test_leases.py`): the one
    bot stays with the first, so the second connects none."""
    from roomkit import running_room

    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(
        "name: cairn\nmodel: claude-3-opus-20240229\nmax_tokens: 1024\n"
        "discord:\n  token_env: BACKENDS_CAIRN_TOKEN\n  channels: [general]\n"
    )
    url = pg_server.create().replace("ledger@", "ledger:hunter2@")  # (trust: the server asks for none)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    provider = ProviderServer()
    await provider.start()
    env.update(ANTHROPIC_BASE_URL=provider.url, ANTHROPIC_API_KEY="k", PYTHONPATH=str(ROOT))

    async def run(room_url: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "residents", "run", "--discord-api", room_url, "--db", url,
            cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

    try:
        async with running_room(["general"]) as room:
            first = await run(room.url)
            try:
                assert first.stdout is not None
                line = (await asyncio.wait_for(first.stdout.readline(), timeout=40)).decode().strip()
                assert line.startswith("residents run: 1 resident connected; ledger postgresql://ledger:***@"), line
                assert "hunter2" not in line
                second = await run(room.url)
                assert second.stdout is not None
                line = (await asyncio.wait_for(second.stdout.readline(), timeout=40)).decode().strip()
                assert line.startswith("residents run: 0 residents connected; ledger postgresql://"), line
                holders = pgkit.fetch(url, "SELECT l.unit, p.pid FROM leases l JOIN processes p ON p.id = l.holder")
                assert holders == [("cairn", first.pid)]
                second.send_signal(signal.SIGINT)
                _, err = await asyncio.wait_for(second.communicate(), timeout=20)
                assert second.returncode == 0, err.decode()
                first.send_signal(signal.SIGINT)
                await asyncio.wait_for(first.communicate(), timeout=20)
            finally:
                if first.returncode is None:
                    first.kill()
                    await first.wait()
            assert first.returncode == 0
    finally:
        await provider.stop()
    assert await asyncio.to_thread(cli.main, ["ledger", "verify", "--db", url]) == 0


async def test_stump_access_reads_and_the_moderators_listings_on_either_backend(
    location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stump's access chosen by its resident and each read of its text (both in the chain), a resident's
    own stumps, the moderators' pages by channel, residence, cause and `before`, and the chain's head as
    checkpoints publish it: the same on both backends, and `verify` holds after."""
    from residents.ledger import access
    from residents.ledger.checkpoints import chain_head

    await asyncio.to_thread(replayed, location, capsys)
    [(sid,)] = rows(location, "SELECT id FROM stumps WHERE cause = 'retry-abandoned'")
    async with Ledger.open(location) as lg:
        await access.set_access(lg, sid, "private", "cairn", None)
        await access.record_read(lg, sid, "mo (42)", "moderator")
        assert await access.access_of(lg, sid) == "private"
        assert [r["reader"] for r in (await access.reads_of(lg, [sid]))[sid]] == ["mo (42)"]
        stump = await lg.get_stump(sid)
        assert stump is not None and await access.stump_text(lg, sid) == stump.text
        channel = (await lg.get_generation(stump.generation_id)).channel  # type: ignore[union-attr]
        own, _ = await access.own_stumps(lg, "cairn", channel, 10)
        assert sid in [s["id"] for s in own]
        every = await lg.list_stump_meta(limit=10)
        assert len(every) == 3 and every == sorted(every, key=lambda s: s.created_at, reverse=True)
        channel_of = {g: c for g, c in rows(location, "SELECT id, channel FROM generations")}
        in_channel = [s.id for s in every if channel_of[s.generation_id] == channel]
        assert [s.id for s in await lg.list_stump_meta(channels=[channel], limit=10)] == in_channel
        assert [s.id for s in await lg.list_stump_meta(channels=["elsewhere", channel], limit=10)] == in_channel
        assert await lg.list_stump_meta(channels=[], limit=10) == []
        assert [s.id for s in await lg.list_stump_meta(cause="retry-abandoned", residence="cairn")] == [sid]
        assert [s.id for s in await lg.list_stump_meta(before=every[0].id, limit=10)] == [s.id for s in every[1:]]
        head = await chain_head(lg.db)
    [(last, digest)] = rows(location, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    assert head == (last, digest)
    kinds = [r[0] for r in rows(location, "SELECT kind FROM chain ORDER BY seq DESC LIMIT 2")]
    assert kinds == ["stump-read", "stump-access"]
    assert await asyncio.to_thread(cli.main, ["ledger", "verify", "--db", location, "--head", f"{last}:{digest}"]) == 0


def test_every_bundled_scenario_writes_the_same_ledger_on_both_backends(
    tmp_path: Path, pg_server: pgkit.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every scenario (tools, live messages, continuations, refusals, OpenAI's) replayed on the real
    pipeline into a file and into a database: the same rows in every table, the same kinds of chain entry
    in the same order, and `verify --strict` holds on both."""
    url, path = pg_server.create(), str(tmp_path / "l.db")
    for scenario in sorted((ROOT / "scenarios").glob("*.yaml")):
        for location in (path, url):
            assert cli.main(["replay", str(scenario), "--db", location, "--json"]) == 0, scenario.name
    capsys.readouterr()
    tables = [r[0] for r in rows(path, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    counted = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in tables)
    assert [int(n) for n in rows(url, counted)[0]] == [int(n) for n in rows(path, counted)[0]]
    assert (
        rows(path, "SELECT count(*) FROM tool_calls")[0][0] > 0 and rows(path, "SELECT count(*) FROM chain")[0][0] > 100
    )
    kinds = "SELECT kind FROM chain ORDER BY seq"
    assert [r[0] for r in rows(url, kinds)] == [r[0] for r in rows(path, kinds)]
    for location in (path, url):
        assert cli.main(["ledger", "verify", "--db", location, "--strict"]) == 0, capsys.readouterr()


async def test_a_change_that_fails_leaves_the_others_of_its_commit_alone(location: str) -> None:
    """The group commit on either backend: three changes asked together go in one commit, each in a
    savepoint of its own; the one that fails (a stump id taken) is told so and leaves nothing, its chain
    entry included, and the other two are written with theirs."""
    g = Generation(id="g-group", residence="cairn", channel="room", model="m")

    def stump(sid: str, text: str) -> Stump:
        return Stump(sid, g.id, None, "retry-abandoned", text, None, residence="cairn")

    async with Ledger.open(location) as lg:
        await lg.create_generation(g)
        await lg.add_stumps([stump("s-a", "first")])
        got = await asyncio.gather(
            lg.add_stumps([stump("s-b", "second")]),
            lg.add_stumps([stump("s-a", "taken")]),
            lg.add_stumps([stump("s-c", "third")]),
            return_exceptions=True,
        )
        assert got[0] is None and got[2] is None and isinstance(got[1], Exception), got
        assert "s-a" in str(got[1]) or "unique" in str(got[1]).lower() or "UNIQUE" in str(got[1])
    assert [tuple(r) for r in rows(location, "SELECT id, text FROM stumps ORDER BY id")] == [
        ("s-a", b"first"),
        ("s-b", b"second"),
        ("s-c", b"third"),
    ]
    assert [r[0] for r in rows(location, "SELECT record FROM chain ORDER BY seq")] == ["s-a", "s-b", "s-c"]
    assert await asyncio.to_thread(cli.main, ["ledger", "verify", "--db", location]) == 0


async def test_a_settled_attempt_takes_no_more_writes_and_a_missing_one_is_not_called_settled(
    location: str,
) -> None:
    """A process that lost its bot while stopped writes on into an attempt the taker settled: each of its
    late changes (chunks, the attempt's end, the generation's end) is refused as Superseded and changes
    nothing of the settlement; the text it streamed is kept as one `taken-over` stump. A chunk for an attempt that never existed is not a takeover: its foreign key says so."""
    g = Generation(id="g-late", residence="cairn", channel="room", model="m")
    a = Attempt(id="a-late", generation_id=g.id, segment=0, index=1)
    async with Ledger.open(location) as lg:
        await lg.start_attempt(a, g)
        await lg.add_chunks(a.id, [(0, 0, "text", "before", None)])
        change(location, "UPDATE attempts SET outcome='incomplete' WHERE id='a-late'")
        late = Attempt(id=a.id, generation_id=g.id, segment=0, index=1, text="before after", outcome=Outcome.COMPLETED)
        for write in (
            lg.add_chunks(a.id, [(1, 0, "text", " after", None)]),
            lg.finish_attempt(late),
            lg.finish_generation(g, [], last_attempt=late),
        ):
            with pytest.raises(Superseded, match="a-late is no longer streaming"):
                await write
        with pytest.raises(Exception, match="(?i)foreign key") as missing:  # refused by the schema, not as late
            await lg.add_chunks("a-never", [(0, 0, "text", "lost", None)])
        assert not isinstance(missing.value, Superseded)
    assert [bytes(r[0]) for r in rows(location, "SELECT text FROM attempt_chunks ORDER BY seq")] == [b"before"]
    assert rows(location, "SELECT outcome FROM attempts") == [("incomplete",)]
    # What it streamed meanwhile is kept, once, as a stump of its own beside the taker's settlement.
    got = rows(location, "SELECT attempt_id, scope, cause, text, residence FROM stumps")
    assert [(a, sc, c, bytes(t), res) for a, sc, c, t, res in got] == [
        ("a-late", "attempt", "taken-over", b"before after", "cairn")
    ]
    assert rows(location, "SELECT count(*) FROM attempt_chunks WHERE attempt_id='a-never'") == [(0,)]


def test_a_url_without_a_ledger_or_a_server_is_one_line_from_every_verb(
    pg_server: pgkit.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """The read-only verbs never make a ledger: an empty database is named as not a ledger; a server that
    does not answer is named with the reason; one line each, exit 1, no password, no traceback."""
    empty = pg_server.create()
    for verb in (["list"], ["stumps"], ["verify"], ["export"], ["show", "g-x"]):
        assert cli.main(["ledger", *verb, "--db", empty]) == 1, verb
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith("not a ledger (it has no _migrations table)"), (verb, err)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"postgresql://ledger:secret@127.0.0.1:{s.getsockname()[1]}/ledger"
        assert cli.main(["ledger", "list", "--db", nobody]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot open the ledger" in err[0] and "secret" not in err[0], err
    assert "Traceback" not in "\n".join(err)
    assert rows(empty, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


DAY = 1_800_000_000.0  # 2027-01-15 08:00 UTC: every time of `write_spending`


async def write_spending(location: str) -> tuple[budgets.Spent, budgets.Spent, bool]:
    """One fixed day of provider calls and a spent budget: two settled attempts with the provider's counts
    (cache writes and reads among them), one it gave no counts for, and a reply the budget refused with the
    channel's notice. What the ledger's budget reads say of it: spent by the residence and by one person,
    and whether the channel was told."""
    async with Ledger.open(location) as lg:
        for n, (person, counts) in enumerate([("u-1", (100, 20, 300, 40)), ("u-2", (7, 0, 0, 3)), ("u-1", None)]):
            g = Generation(
                id=f"g-{n}",
                residence="cairn",
                channel="room",
                model="claude-fable-5-2",
                created_at=DAY + n,
                person=person,
            )
            a = Attempt(id=f"a-{n}", generation_id=g.id, segment=0, index=0, started_at=DAY + n)
            await lg.start_attempt(a, new_generation=g)
            a.text, a.outcome, a.stop_reason, a.ended_at = "words", "completed", "end_turn", DAY + n + 0.5
            if counts is not None:
                a.input_tokens, a.cache_write_tokens, a.cache_read_tokens, a.output_tokens = counts
            g.text, g.status, g.stop_reason, g.finished_at = "words", "completed", "end_turn", DAY + n + 0.5
            g.segments = [Segment(0, a.id, "end_turn", 5, a.output_tokens)]
            await lg.finish_generation(g, [], last_attempt=a)
            post = Post(id=f"p-{n}", generation_id=g.id, seq=1, kind=PostKind.SPEECH, content="words", channel="room")
            await lg.add_posts([post])
            await lg.mark_delivered(post, f"m-{n}")
        line = truth.budget_notice("input", "residence", 400)
        notice = Post(
            id="p-b",
            generation_id=None,
            seq=1,
            kind=PostKind.NOTICE,
            content=line,
            channel="room",
            reason=PostReason.BUDGET_REACHED,
        )
        refusal = BudgetRefusal(
            id="b-1",
            residence="cairn",
            channel="room",
            trigger="m-5",
            person="u-1",
            scope="residence",
            tokens="input",
            budget=400,
            spent=427,
            day="2027-01-15",
            post_id="p-b",
            created_at=DAY + 9,
        )
        await budgets.refuse(lg, refusal, [notice])
        await lg.mark_delivered(notice, "m-6")
        told = await budgets.told(lg, "cairn", "room", "2027-01-15")
        return await budgets.spent(lg, "cairn", DAY), await budgets.spent(lg, "cairn", DAY, "u-1"), told


async def test_a_budget_refusal_and_usage_counts_round_trip_and_verify_on_both_backends(
    tmp_path: Path, pg_server: pgkit.Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The provider's counts, a refusal of a spent budget and its notice read back the same from either
    backend: the budget's sums, `residents usage --json` by residence, channel and day, the refusal's
    chain entry (one head on both), and a strict verify."""
    monkeypatch.setattr(appending, "time", types.SimpleNamespace(time=lambda: DAY))  # each entry's `at`
    on_sqlite, url = str(tmp_path / "l.db"), pg_server.create()
    spent = [await write_spending(where) for where in (on_sqlite, url)]
    assert spent[0] == spent[1] == (budgets.Spent(427, 43), budgets.Spent(420, 40), True)
    reports = {}
    for where in (on_sqlite, url):
        for by in ("residence", "channel", "day"):
            assert await asyncio.to_thread(cli.main, ["usage", "--db", where, "--by", by, "--json"]) == 0
            reports[where, by] = json.loads(capsys.readouterr().out)
        assert await asyncio.to_thread(cli.main, ["ledger", "verify", "--db", where, "--strict"]) == 0
        assert capsys.readouterr().out.count("\n") == 1
    for by in ("residence", "channel", "day"):
        assert reports[on_sqlite, by] == reports[url, by]
    [day] = reports[url, "day"]["rows"]
    assert (day["day"], day["attempts"], day["attempts_without_counts"]) == ("2027-01-15", 3, 1)
    assert (day["input_tokens"], day["cache_write_tokens"], day["cache_read_tokens"], day["output_tokens"]) == (
        107,
        20,
        300,
        43,
    )
    assert day["estimated_cost_usd"] is not None and day["estimated_cost_usd"] > 0
    chains = [rows(where, "SELECT seq, kind, record, body, hash FROM chain ORDER BY seq") for where in (on_sqlite, url)]
    assert [tuple(r) for r in chains[0]] == [tuple(r) for r in chains[1]]
    assert [r[1:3] for r in chains[1] if r[1] == "budget-refusal"] == [("budget-refusal", "b-1")]
    assert rows(url, "SELECT id, budget, spent, post_id FROM budget_refusals") == [("b-1", 400, 427, "p-b")]
