"""`residents ledger copy` (issue 23, item 4): a ledger moved whole between a file and a PostgreSQL
database, in every direction, its chain with it: every row of every table the same, `verify` on the copy
ending on the source's head, the copy's export the source's byte for byte; a destination with rows, an
unreachable server, a bad path or a source at an older step refused in one line with nothing written;
a tampered source copied as it is, so `verify` on the copy names the same problem; a source a writer goes
on writing copied as it stood when the copy began.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pgkit
import pytest
from ledgerkit import BACKENDS, change, is_pg, rows

from residents import cli
from residents.ledger import Ledger, budgets
from residents.ledger import copy as ledger_copy
from residents.ledger.access import record_read, set_access, use_default_access
from residents.records import (
    Attempt,
    BudgetRefusal,
    Generation,
    NotShown,
    Post,
    PostKind,
    PostReason,
    Segment,
    SharedFile,
    Shown,
)

ROOT = Path(__file__).resolve().parent.parent
# Cuts and their receipts, a retry's stumps, thinking cut, a tool round and a tool cut.
SCENARIOS = ("ceiling", "retry", "thinking-cut", "tool-list", "tool-cut")
TRICKY = "Ünïcødé — 漢字 👩‍👩‍👧 trailing   \n\t and a lone surrogate \ud83d"
DAY = 1_800_000_000.0


async def write_extras(location: str) -> None:
    """What the scenarios leave out: the provider's usage counts, a spent budget's refusal and its notice,
    a stump's access chosen and its text read, a residence's default access."""
    async with Ledger.open(location) as lg:
        g = Generation(id="g-u", residence="cairn", channel="room", model="claude-fable-5-2", created_at=DAY)
        g.person = "u-1"
        a = Attempt(id="a-u", generation_id=g.id, segment=0, index=0, started_at=DAY)
        await lg.start_attempt(a, new_generation=g)
        a.text, a.outcome, a.stop_reason, a.ended_at = TRICKY, "completed", "end_turn", DAY + 0.125
        a.input_tokens, a.cache_write_tokens, a.cache_read_tokens, a.output_tokens = 100, 20, 300, 40
        g.text, g.status, g.stop_reason, g.finished_at = TRICKY, "completed", "end_turn", DAY + 0.1
        g.segments = [Segment(0, a.id, "end_turn", len(TRICKY), 40)]
        await lg.finish_generation(g, [], last_attempt=a)
        post = Post(id="p-u", generation_id=g.id, seq=1, kind=PostKind.SPEECH, content=TRICKY, channel="room")
        await lg.add_posts([post])
        await lg.mark_delivered(post, "m-u")
        notice = Post(
            id="p-b",
            generation_id=None,
            seq=1,
            kind=PostKind.NOTICE,
            content="budget reached",
            channel="room",
            reason=PostReason.BUDGET_REACHED,
        )
        refusal = BudgetRefusal(
            id="b-1",
            residence="cairn",
            channel="room",
            trigger="m-9",
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
        await lg.mark_delivered(notice, "m-b")
        [stump] = await lg.list_stump_meta(limit=1)
        await set_access(lg, stump.id, "private", stump.residence, None)
        await record_read(lg, stump.id, "mod-1", "moderator")
        await use_default_access(lg, "cairn", "moderators")  # after the stump: its access stays private


def build(location: str) -> None:
    for name in SCENARIOS:
        assert cli.main(["replay", str(ROOT / "scenarios" / f"{name}.yaml"), "--db", location, "--json"]) == 0
    asyncio.run(write_extras(location))


class Sources:
    """The rich ledger, built once per module on each backend as a test first asks for it; tests read it only."""

    def __init__(self, folder: Path, request: pytest.FixtureRequest) -> None:
        self.folder, self.request = folder, request
        self.built: dict[str, str] = {}

    def __call__(self, kind: str) -> str:
        if kind not in self.built:
            if kind == "sqlite":
                location = str(self.folder / "source.db")
            else:
                location = self.request.getfixturevalue("pg_server").create()
            build(location)
            self.built[kind] = location
        return self.built[kind]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Sources:
    return Sources(tmp_path_factory.mktemp("sources"), request)


def place(kind: str, tmp_path: Path, request: pytest.FixtureRequest, name: str = "copy.db") -> str:
    """A new empty place on a backend: a file's path (not made), or a new database's URL."""
    if kind == "sqlite":
        return str(tmp_path / name)
    server: pgkit.Server = request.getfixturevalue("pg_server")
    return server.create()


def copy(capsys: pytest.CaptureFixture[str], source: str, destination: str) -> tuple[int, list[str], list[str]]:
    """`residents ledger copy`: its exit status, stdout lines and stderr lines."""
    capsys.readouterr()  # what came before it (a source built)
    code = cli.main(["ledger", "copy", "--from", source, "--to", destination])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def verify(capsys: pytest.CaptureFixture[str], location: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = cli.main(["ledger", "verify", "--db", location, "--strict"])
    return code, capsys.readouterr().out.splitlines()


def export(capsys: pytest.CaptureFixture[str], location: str, out: Path) -> bytes:
    assert cli.main(["ledger", "export", "--db", location, "--out", str(out)]) == 0
    capsys.readouterr()
    return out.read_bytes()


def tables(location: str) -> list[str]:
    if is_pg(location):
        found = rows(location, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    else:
        found = rows(location, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'")
    return sorted(str(r[0]) for r in found if r[0] != "_migrations")


def contents(location: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, as values by column name (rowid aside), in one order: what the two ends compare on."""
    out = {}
    for t in tables(location):
        if is_pg(location):
            sql = "SELECT column_name FROM information_schema.columns WHERE table_name = $1"
            columns = sorted(str(r[0]) for r in rows(location, sql, t) if r[0] != "rowid")
        else:
            columns = sorted(str(r[0]) for r in rows(location, "SELECT name FROM pragma_table_info($1)", t))
        got = rows(location, f"SELECT {', '.join(columns)} FROM {t}")
        out[t] = sorted(
            (tuple(zip(columns, (bytes(v) if isinstance(v, memoryview) else v for v in r), strict=True)) for r in got),
            key=repr,
        )
    return out


def head_line(lines: list[str]) -> str:
    """The head `verify` ends its line on."""
    [line] = lines
    return line.rsplit(" ", 1)[1]


DIRECTIONS = [
    pytest.param("sqlite", "sqlite", id="sqlite-to-sqlite"),
    pytest.param("sqlite", "postgresql", id="sqlite-to-postgresql", marks=pytest.mark.e2e),
    pytest.param("postgresql", "sqlite", id="postgresql-to-sqlite", marks=pytest.mark.e2e),
    pytest.param("postgresql", "postgresql", id="postgresql-to-postgresql", marks=pytest.mark.e2e),
]


@pytest.mark.parametrize(("source_kind", "destination_kind"), DIRECTIONS)
def test_a_ledger_copies_in_every_direction_whole_and_ends_on_the_same_head(
    source_kind: str,
    destination_kind: str,
    sources: Sources,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = sources(source_kind)
    destination = place(destination_kind, tmp_path, request)
    code, out, err = copy(capsys, source, destination)
    assert code == 0, err
    [(entries, digest)] = rows(source, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    assert out == [f"{name}: head {entries}:{digest}" for name in (source, destination)]
    assert f"chain: {entries} row(s)" in err and any(line.startswith("generations: ") for line in err)
    assert err[-1].startswith("copied ")

    assert contents(destination) == contents(source)
    for ordered in (
        "SELECT id FROM generations ORDER BY rowid",
        "SELECT stump_id, reader FROM stump_reads ORDER BY rowid",
    ):
        assert rows(destination, ordered) == rows(source, ordered)
    assert rows(destination, "SELECT access FROM stumps WHERE access = 'private'") == [("private",)]  # not reset
    code, lines = verify(capsys, destination)
    assert code == 0 and head_line(lines) == digest, lines
    assert verify(capsys, source)[1] == lines
    assert export(capsys, destination, tmp_path / "copy.jsonl") == export(capsys, source, tmp_path / "source.jsonl")

    async def write_on() -> None:  # the copy takes new rows after the copied ones (identity sequences set)
        async with Ledger.open(destination) as lg:
            await set_access(lg, (await lg.list_stump_meta(limit=1))[0].id, "moderators", "cairn", None)

    asyncio.run(write_on())
    last = "SELECT max(rowid) FROM stump_access_changes"
    assert rows(destination, last)[0][0] == rows(source, last)[0][0] + 1
    code, lines = verify(capsys, destination)
    assert code == 0 and f"chain of {entries + 1} entries" in lines[0]


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_destination_with_rows_is_refused_in_one_line_and_left_as_it_was(
    kind: str, sources: Sources, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    source = sources("sqlite")
    destination = place(kind, tmp_path, request)
    asyncio.run(write_extras_small(destination))
    before = contents(destination)
    stamp = os.stat(destination).st_mtime_ns if kind == "sqlite" else None
    code, out, err = copy(capsys, source, destination)
    assert (code, out) == (2, [])
    assert err == [
        f"residents: {destination}: not empty (table attempts has rows); copy into a new file or an empty database"
    ]
    assert contents(destination) == before
    if stamp is not None:
        assert os.stat(destination).st_mtime_ns == stamp


async def write_extras_small(location: str) -> None:
    async with Ledger.open(location) as lg:
        g = Generation(id="g-0", residence="cairn", channel="room", model="m", created_at=DAY)
        await lg.start_attempt(Attempt(id="a-0", generation_id="g-0", segment=0, index=0), new_generation=g)


@pytest.mark.parametrize("kind", BACKENDS)
def test_an_empty_ledger_or_an_empty_file_is_a_destination(
    kind: str, sources: Sources, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ledger made but never written (its schema only), or an empty file, takes a copy."""
    destination = place(kind, tmp_path, request)

    async def made() -> None:
        async with Ledger.open(destination):
            pass

    asyncio.run(made())
    assert copy(capsys, sources("sqlite"), destination)[0] == 0
    assert verify(capsys, destination)[0] == 0
    empty = tmp_path / "empty.db"
    empty.touch()
    assert copy(capsys, sources("sqlite"), str(empty))[0] == 0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("source", "destination", "says"),
    [
        ("{tmp}/none.db", "{tmp}/copy.db", "--from {tmp}/none.db: no ledger there"),
        ("{source}", "{tmp}", "{tmp}: a folder, not a ledger file"),
        ("{source}", "{tmp}/not-a-db", "{tmp}/not-a-db: not a ledger file to copy into: file is not a database"),
        ("{source}", "{source}", "{source}: the source and the destination are the same ledger"),
        ("{source}", "{tmp}/not-a-db/copy.db", "{tmp}/not-a-db/copy.db: cannot make a ledger there: "),
        (
            "{source}",
            "postgresql://ledger:secret@127.0.0.1:{port}/x",
            "postgresql://ledger:***@127.0.0.1:{port}/x: cannot open the ledger: ",
        ),
        (
            "postgresql://ledger@127.0.0.1:{port}/x",
            "{tmp}/copy.db",
            "postgresql://ledger@127.0.0.1:{port}/x: cannot open the ledger: ",
        ),
    ],
    ids=[
        "missing-source",
        "folder",
        "not-a-database",
        "itself",
        "under-a-file",
        "unreachable-destination",
        "unreachable-source",
    ],
)
def test_a_bad_path_or_an_unreachable_server_is_one_line_and_nothing_written(
    source: str, destination: str, says: str, sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not-a-db").write_bytes(b"not a database, but a file of some other kind" * 100)
    names = {"tmp": str(tmp_path), "source": sources("sqlite"), "port": str(closed_port())}
    before = sorted(os.listdir(tmp_path))
    code, out, err = copy(capsys, source.format(**names), destination.format(**names))
    assert (code, out, len(err)) == (2, [], 1), err
    assert err[0].startswith("residents: " + says.format(**names)), err
    assert sorted(os.listdir(tmp_path)) == before
    assert "secret" not in err[0]


def test_a_source_at_an_older_step_is_refused_naming_migrate(
    tmp_path: Path, sources: Sources, capsys: pytest.CaptureFixture[str]
) -> None:
    """Copying reads the source and never writes it, so it does not migrate it: `migrate` does, as the
    source's one writer."""
    old = tmp_path / "old.db"
    assert copy(capsys, sources("sqlite"), str(old))[0] == 0
    rows_before = contents(str(old))
    with closing(sqlite3.connect(old)) as con:
        con.execute("DELETE FROM _migrations WHERE name = 'm045_usage_budgets'")
        con.commit()
    code, out, err = copy(capsys, str(old), str(tmp_path / "copy.db"))
    assert (code, out) == (2, [])
    assert err == [
        f"residents: {old}: written by an older residents, 1 migration(s) to apply (from m045_usage_budgets);"
        f" `residents ledger migrate --db {old}` applies them"
    ]
    assert not (tmp_path / "copy.db").exists() and contents(str(old)) == rows_before


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_tampered_source_is_copied_as_it_is_and_verify_names_the_same_problem(
    kind: str, sources: Sources, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy moves a ledger; `verify` judges it. A damaged ledger can be moved to be looked at, and the
    copy shows the damage exactly as the source does, on either backend."""
    tampered = tmp_path / "tampered.db"
    assert copy(capsys, sources("sqlite"), str(tampered))[0] == 0
    [(gid,)] = rows(str(tampered), "SELECT id FROM generations WHERE status = 'truncated' ORDER BY rowid LIMIT 1")
    with closing(sqlite3.connect(tampered)) as con:
        con.execute("UPDATE generations SET text = CAST('rewritten' AS BLOB) WHERE id = ?", (gid,))
        con.commit()
    code, problems = verify(capsys, str(tampered))
    assert code == 1 and any(gid in line for line in problems), problems
    destination = place(kind, tmp_path, request)
    assert copy(capsys, str(tampered), destination)[0] == 0
    assert verify(capsys, destination) == (1, problems)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_source_a_writer_goes_on_writing_is_copied_as_it_stood_when_the_copy_began(
    kind: str, sources: Sources, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of three rows; once the first table is copied, rows are committed to the tables still to copy
    (a generation, a chain entry) while a running writer holds the source: the copy is the one state the
    source was in when the copy began, and ends on that state's head."""
    source = place(kind, tmp_path, request, "source.db")
    await asyncio.to_thread(copy_quiet, await asyncio.to_thread(sources, "sqlite"), source)  # off this loop
    [head] = rows(source, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    monkeypatch.setattr(ledger_copy, "PAGE", 3)
    destination = str(tmp_path / "copy.db")
    told: list[str] = []

    def progress(table: str, copied: int, done: bool) -> None:
        if not told:
            change(source, LATE_GENERATION)
            change(source, LATE_ENTRY)
        told.append(table)

    async with Ledger.open(source):  # a running process holding the source as its writer
        copied = await ledger_copy.copy_ledger(source, destination, progress)
    assert told[0] < "chain" < "generations"  # the rows came before those tables were read
    assert copied.source_head == copied.copy_head == tuple(head)
    assert rows(source, "SELECT count(*) FROM generations WHERE id = 'g-late'") == [(1,)]
    assert rows(destination, "SELECT count(*) FROM generations WHERE id = 'g-late'") == [(0,)]
    assert rows(source, "SELECT max(seq) FROM chain") == [(head[0] + 1,)]
    assert rows(destination, "SELECT max(seq) FROM chain") == [(head[0],)]
    assert dict(copied.rows)["generations"] == rows(source, "SELECT count(*) FROM generations")[0][0] - 1


LATE_GENERATION = (
    "INSERT INTO generations (id, residence, channel, model, status, standing, continuation_ended, created_at)"
    " VALUES ('g-late', 'cairn', 'room', 'm', 'pending', 'none', 'none', 1.0)"
)
LATE_ENTRY = (
    "INSERT INTO chain (seq, kind, record, prev, body, hash)"
    " SELECT max(seq) + 1, 'genesis', NULL, max(hash), '{}', max(hash) FROM chain"
)


def copy_quiet(source: str, destination: str) -> None:
    assert asyncio.run(ledger_copy.copy_ledger(source, destination)).copy_head is not None


@pytest.mark.parametrize(("source_kind", "destination_kind"), DIRECTIONS)
def test_attachments_copy_byte_exact_in_every_direction(
    source_kind: str,
    destination_kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A request's attachments (a name with a lone surrogate, kept as bytes: a BLOB, a BYTEA) copy as they
    are, and `verify` checks them on the copy."""
    source = place(source_kind, tmp_path, request, "a.db")

    async def write() -> None:
        files = [
            SharedFile("m-1", 0, "pic " + TRICKY, "image/png", 10, "ab" * 32, Shown.IMAGE),
            SharedFile("m-1", 1, "x.bin", None, 5, "cd" * 32, Shown.DESCRIBED, NotShown.UNSUPPORTED),
        ]
        async with Ledger.open(source) as lg:
            g = Generation(id="g-a", residence="cairn", channel="room", model="m", attachments=files)
            await lg.start_attempt(Attempt(id="a-a", generation_id="g-a", segment=0, index=0), new_generation=g)

    asyncio.run(write())
    destination = place(destination_kind, tmp_path, request, "b.db")
    assert copy(capsys, source, destination)[0] == 0
    assert contents(destination) == contents(source)
    assert [bytes(n) for (n,) in rows(destination, "SELECT name FROM attachments ORDER BY position")] == [
        ("pic " + TRICKY).encode("utf-8", "surrogatepass"),
        b"x.bin",
    ]
    capsys.readouterr()
    code = cli.main(["ledger", "verify", "--db", destination])  # its one generation left under way
    assert code == 0, capsys.readouterr().out


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_copy_that_fails_midway_leaves_no_rows_and_no_new_file(
    kind: str,
    sources: Sources,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One transaction: a write that fails (here the third page written) leaves the destination as it was,
    and a file the copy made is removed; one line says which table."""
    calls = []
    real = ledger_copy._insert

    def failing(conn: Any, table: ledger_copy.Table, sql: str, page: list[tuple[Any, ...]]) -> None:
        calls.append(sql)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(conn, table, sql, page)

    monkeypatch.setattr(ledger_copy, "_insert", failing)
    destination = place(kind, tmp_path, request)
    code, out, err = copy(capsys, sources("sqlite"), destination)
    assert (code, out) == (2, [])
    assert [e for e in err if e.startswith("residents:")] == err[-1:]
    assert err[-1].startswith(f"residents: {destination}: table ") and "No space left on device" in err[-1]
    if kind == "sqlite":
        assert not Path(destination).exists()
    else:
        assert all(n == 0 for t in tables(destination) for (n,) in rows(destination, f"SELECT count(*) FROM {t}"))
