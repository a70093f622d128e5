"""The ledger's hash chain, over the real pipeline and the real CLI, on both backends (`backend`) where the
test is not about SQLite itself: every settled record is in it, in the
same transaction; editing one row with the database's client makes `residents ledger verify` name that record's entry;
an export verifies offline — by the CLI and by the few lines in docs/provenance.md — and fails after any one byte
changes; an old ledger begins its chain at a marked genesis.

The ledgers are made by `residents replay` of the bundled scenarios: a retried attempt (an abandoned
attempt and its stump), a cut reply (partials and a receipt), and a cut inside reasoning (a thinking block).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from ledgerkit import Backend, rows

from residents import cli
from residents.ledger import Ledger, appending, chain
from residents.ledger.export import check_export
from residents.ledger.verify import check, verify
from residents.records import Generation, Stump

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("retry", "ceiling", "thinking-cut")


def replayed_into(location: str, capsys: pytest.CaptureFixture[str], scenarios: tuple[str, ...] = SCENARIOS) -> str:
    """The scenarios replayed through the real pipeline into the ledger at `location` (a path or a URL)."""
    for name in scenarios:
        assert cli.main(["replay", str(ROOT / "scenarios" / f"{name}.yaml"), "--db", location, "--json"]) == 0
    capsys.readouterr()
    return location


def replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str], scenarios: tuple[str, ...] = SCENARIOS) -> Path:
    """... into a SQLite file (the tests of what SQLite alone does)."""
    db = tmp_path / "ledger.db"
    replayed_into(str(db), capsys, scenarios)
    return db


def unguarded(backend: Backend) -> None:
    """The chain's append-only triggers out of the way, as someone forcing an edit would do: dropped on
    SQLite, disabled on PostgreSQL."""
    if backend.name == "sqlite":
        script(Path(backend.location), "DROP TRIGGER chain_no_update; DROP TRIGGER chain_no_delete;")
    else:
        backend.change("ALTER TABLE chain DISABLE TRIGGER USER")


def sql(db: Path, statement: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute(statement, params).fetchall()
        con.commit()
        return rows
    finally:
        con.close()


def script(db: Path, statements: str) -> None:
    con = sqlite3.connect(db)
    try:
        con.executescript(statements)
    finally:
        con.close()


def entry_of(db: Path | str, kind: str, record: str) -> int:
    [(seq,)] = rows(str(db), "SELECT max(seq) FROM chain WHERE kind=$1 AND record=$2", kind, record)
    assert seq is not None, f"no {kind} entry for {record}"
    return int(seq)


def run_verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = cli.main(["ledger", "verify", *args])
    return code, capsys.readouterr().out.splitlines()


def texts(db: Path | str) -> list[str]:
    """Every text the ledger holds: what no entry, export or answer may contain."""
    found = []
    for table, column in (
        ("generations", "text"),
        ("attempts", "text"),
        ("stumps", "text"),
        ("posts", "content"),
        ("attempt_blocks", "content"),
    ):
        found += [
            bytes(r[0]).decode("utf-8", "surrogatepass") for r in rows(str(db), f"SELECT {column} FROM {table}") if r[0]
        ]
    return found


def test_every_settled_record_is_in_the_chain_and_verify_ends_with_the_head(backend: Backend, capsys):
    db = replayed_into(backend.location, capsys)
    sql = backend.rows
    counts = {k: int(n) for k, n in sql("SELECT kind, count(*) FROM chain GROUP BY kind")}
    [(gens,)] = sql("SELECT count(*) FROM generations WHERE status != 'pending'")
    [(attempts,)] = sql("SELECT count(*) FROM attempts WHERE outcome != 'streaming'")
    [(stumps,)] = sql("SELECT count(*) FROM stumps")
    [(posts,)] = sql("SELECT count(*) FROM posts")
    [(delivered,)] = sql("SELECT count(*) FROM posts WHERE message_id IS NOT NULL")
    assert counts == {"generation": gens, "attempt": attempts, "stump": stumps, "post": posts, "delivered": delivered}
    assert stumps == 3 and posts > 4 and delivered == posts  # a retry stump, a cut output, a cut reasoning block
    [(last, head)] = sql("SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    code, out = run_verify(capsys, "--db", db)
    assert code == 0 and out == [out[0]] and out[0].endswith(f"; chain of {last} entries, head {head}")
    bodies = "\n".join(r[0] for r in sql("SELECT body FROM chain"))
    for text in texts(db):  # hashes and metadata only
        for i in range(0, max(1, len(text) - 16), 8):
            assert text[i : i + 16] not in bodies or not text[i : i + 16].strip(), text[i : i + 16]


EDITS = [  # (what a person changes with the database's client, its parameters, the kind of entry, which record's)
    (
        "UPDATE stumps SET text=$1 WHERE cause='retry-abandoned'",
        (b"changed",),
        "stump",
        "SELECT id FROM stumps WHERE cause='retry-abandoned'",
    ),
    (
        "UPDATE posts SET content=$1 WHERE kind='partial' AND seq=2",
        (b"something else",),
        "post",
        "SELECT id FROM posts WHERE kind='partial' AND seq=2",
    ),
    (
        "UPDATE posts SET message_id='999' WHERE kind='receipt' AND generation_id IN"
        " (SELECT generation_id FROM posts WHERE kind='partial')",
        (),
        "delivered",
        "SELECT id FROM posts WHERE message_id='999'",
    ),
    (
        "UPDATE attempt_blocks SET content=$1, chars=15 WHERE type='thinking'",
        (b"other reasoning",),
        "attempt",
        "SELECT attempt_id FROM attempt_blocks WHERE type='thinking'",
    ),
    (
        "UPDATE attempts SET error='edited_error' WHERE rowid=(SELECT min(rowid) FROM attempts WHERE outcome='abandoned')",
        (),
        "attempt",
        "SELECT id FROM attempts WHERE error='edited_error'",
    ),
    # No invariant of the records alone can see this one: only the chain does.
    (
        "UPDATE generations SET output_tokens=output_tokens+1 WHERE stop_reason='max_tokens' AND chars > 0",
        (),
        "generation",
        "SELECT id FROM generations WHERE stop_reason='max_tokens' AND chars > 0",
    ),
]


@pytest.mark.parametrize("edit,params,kind,record_sql", EDITS, ids=[e[2] + str(i) for i, e in enumerate(EDITS)])
def test_editing_one_row_makes_verify_name_its_entry(backend: Backend, capsys, edit, params, kind, record_sql):
    db = replayed_into(backend.location, capsys)
    assert run_verify(capsys, "--db", db)[0] == 0
    backend.change(edit, *params)
    [(record,)] = backend.rows(record_sql)
    seq = entry_of(db, kind, record)
    code, out = run_verify(capsys, "--db", db)
    assert code == 1
    assert out[0].startswith(f"chain entry {seq} ({kind} {record}): the ledger no longer matches it: "), out


def test_a_changed_or_missing_chain_entry_is_named(backend: Backend, capsys):
    db = replayed_into(backend.location, capsys)
    sql, change = backend.rows, backend.change
    refused = (sqlite3.IntegrityError, asyncpg.PostgresError)
    with pytest.raises(refused, match="append-only"):  # the table refuses edits ...
        change("UPDATE chain SET body=body WHERE seq=3")
    with pytest.raises(refused, match="append-only"):
        change("DELETE FROM chain WHERE seq=3")
    unguarded(backend)  # ... until someone forces it
    [(kind, record, body)] = sql("SELECT kind, record, body FROM chain WHERE seq=3")
    changed = body.replace('"chars":', '"chars":1', 1)
    assert changed != body
    change("UPDATE chain SET body=$1 WHERE seq=3", changed)
    code, out = run_verify(capsys, "--db", db)
    assert code == 1 and out[0] == f"chain entry 3 ({kind} {record}): its hash does not match its content", out
    change("UPDATE chain SET body=$1 WHERE seq=3", body)
    assert run_verify(capsys, "--db", db)[0] == 0
    change("DELETE FROM chain WHERE seq=5")
    code, out = run_verify(capsys, "--db", db)
    [(kind6, record6)] = sql("SELECT kind, record FROM chain WHERE seq=6")
    assert code == 1 and out[0] == f"chain entry 6 ({kind6} {record6}): follows entry 4; entries 5..5 are missing"
    assert any(line.endswith(": not in the chain") for line in out), out  # the record entry 5 stated


def test_a_record_written_without_its_entry_is_named(backend: Backend, capsys):
    db = replayed_into(backend.location, capsys)
    backend.change(
        "INSERT INTO stumps (id, generation_id, attempt_id, residence, scope, cause, text, chars, created_at)"
        " SELECT 's-unchained00', generation_id, attempt_id, residence, 'attempt', 'retry-abandoned', text, chars, 0"
        " FROM stumps WHERE cause='retry-abandoned'",
    )
    code, out = run_verify(capsys, "--db", db)
    assert code == 1 and "stump s-unchained00: not in the chain" in out, out


def test_an_export_verifies_offline_and_fails_after_any_one_byte_changes(tmp_path, capsys):
    db = replayed(tmp_path, capsys, ("ceiling",))  # a cut: its attempt, generation, stump, posts and deliveries
    out = tmp_path / "chain.jsonl"
    assert cli.main(["ledger", "export", "--db", str(db), "--out", str(out)]) == 0
    [(last, head)] = sql(db, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    assert f"wrote entries 1..{last} to {out}; head {last}:{head}" in capsys.readouterr().err
    data = out.read_bytes()
    assert data.count(b"\n") == last
    for text in texts(db):
        assert text[:40].encode("utf-8", "surrogatepass") not in data or not text[:40].strip()

    nowhere = tmp_path / "no-ledger-here.db"  # offline: no database is opened, or made
    code, said = run_verify(capsys, "--export", str(out), "--db", str(nowhere))
    assert code == 0 and said == [f"export ok: entries 1..{last} ({last}), head {head}"] and not nowhere.exists()

    checked = 0
    for i in range(len(data)):  # every single byte, changed: never accepted
        changed = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
        assert not check_export(changed, "bad.jsonl").ok, f"a change of byte {i} was accepted"
        checked += 1
    assert checked == len(data) > 4000

    bad = tmp_path / "bad.jsonl"
    at = data.index(b'"chars":') + len(b'"chars":')  # one digit of the first entry's character count
    bad.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
    code, said = run_verify(capsys, "--export", str(bad))
    assert code == 1 and said == [f"{bad}:1: entry 1: its hash does not match its content"]
    bad.write_bytes(data[:-40])
    assert run_verify(capsys, "--export", str(bad))[0] == 1


def _docs_checker(tmp_path: Path) -> Path:
    doc = (ROOT / "docs" / "provenance.md").read_text()
    m = re.search(r"```python\n(# check_export\.py.*?)```", doc, re.S)
    assert m, "the export checker in docs/provenance.md is gone"
    path = tmp_path / "check_export.py"
    path.write_text(m.group(1))
    return path


def test_the_few_lines_in_the_docs_check_an_export_too(tmp_path, capsys):
    db = replayed(tmp_path, capsys)
    out = tmp_path / "chain.jsonl"
    assert cli.main(["ledger", "export", "--db", str(db), "--out", str(out)]) == 0
    checker = _docs_checker(tmp_path)
    [(head,)] = sql(db, "SELECT hash FROM chain ORDER BY seq DESC LIMIT 1")
    run = subprocess.run([sys.executable, str(checker), str(out)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout.strip().endswith(f"head {head}"), run.stderr
    data = out.read_bytes()
    for i in range(0, len(data), max(1, len(data) // 12)):
        bad = tmp_path / "bad.jsonl"
        bad.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])
        run = subprocess.run([sys.executable, str(checker), str(bad)], capture_output=True, text=True, timeout=30)
        assert run.returncode != 0, f"the checker in docs/provenance.md accepted a change of byte {i}"


def test_an_export_since_an_entry_starts_from_its_anchor(backend: Backend, tmp_path, capsys):
    db = replayed_into(backend.location, capsys)
    out = tmp_path / "newer.jsonl"
    assert cli.main(["ledger", "export", "--db", db, "--out", str(out), "--since", "5"]) == 0
    [(anchor,)] = backend.rows("SELECT hash FROM chain WHERE seq=4")
    [(last, head)] = backend.rows("SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    code, said = run_verify(capsys, "--export", str(out))
    assert code == 0 and said == [
        f"export ok: entries 5..{last} ({last - 4}), head {head}; it continues entry 4, whose hash it names as {anchor}"
    ]
    assert cli.main(["ledger", "export", "--db", db, "--out", str(out), "--since", str(last + 1)]) == 2
    assert f"--since {last + 1}: no such entry" in capsys.readouterr().err


def test_an_old_ledger_begins_its_chain_at_a_marked_genesis(tmp_path, capsys):
    """SQLite only by nature: a ledger from before the chain is a file; PostgreSQL's baseline has the chain."""
    db = replayed(tmp_path, capsys)
    before = dict(sql(db, "SELECT kind, count(*) FROM chain GROUP BY kind"))
    # The ledger as it was before the chain: no table, no migration recorded.
    script(
        db,
        "DROP TRIGGER chain_no_update; DROP TRIGGER chain_no_delete; DROP TABLE chain;"
        " DELETE FROM _migrations WHERE name='m025_chain';",
    )
    # The read-only verbs change nothing: they name the migration and the verb that applies it.
    assert cli.main(["ledger", "verify", "--db", str(db)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"residents: {db}: written by an older residents, 1 migration(s) to apply (from m025_chain);"
        f" `residents ledger migrate --db {db}` applies them"
    ]
    assert cli.main(["ledger", "migrate", "--db", str(db)]) == 0  # applies m025 and backfills
    assert capsys.readouterr().out == f"{db}: 1 migration(s) applied: m025_chain\n"
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 0, out
    [(body,)] = sql(db, "SELECT body FROM chain WHERE seq=1")
    genesis = json.loads(body)
    assert (genesis["kind"], genesis["backfill"]) == ("genesis", sum(before.values()))
    assert dict(sql(db, "SELECT kind, count(*) FROM chain WHERE seq > 1 GROUP BY kind")) == before
    run_verify(capsys, "--db", str(db))  # opened again: nothing more is backfilled
    assert sql(db, "SELECT count(*) FROM chain") == [(sum(before.values()) + 1,)]
    sql(db, "UPDATE stumps SET text=CAST('changed' AS BLOB) WHERE cause='retry-abandoned'")
    [(sid,)] = sql(db, "SELECT id FROM stumps WHERE cause='retry-abandoned'")
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out[0].startswith(f"chain entry {entry_of(db, 'stump', sid)} (stump {sid}): ")


async def test_a_failed_write_leaves_neither_its_records_nor_their_entries(backend: Backend):
    ledger = await Ledger.open(backend.location)
    try:
        assert await ledger.db.execute_fetchall("SELECT * FROM chain") == []  # nothing before anything settles
        g = Generation(id="g-atomic000000", residence="cairn", channel="1", model="claude-3-opus-20240229")
        await ledger.create_generation(g)
        first = Stump("s-first0000000", g.id, None, "retry-abandoned", "kept", None, residence="cairn")
        await ledger.add_stumps([first])
        entries = await ledger.db.execute_fetchall("SELECT count(*) FROM chain")
        clash = Stump("s-first0000000", g.id, None, "retry-abandoned", "again", None, residence="cairn")
        g.status, g.stop_reason, g.text = "completed", "end_turn", ""
        with pytest.raises((sqlite3.IntegrityError, asyncpg.UniqueViolationError)):
            await ledger.finish_generation(g, [Stump("s-second000000", g.id, None, "max_tokens", "x", None), clash])
        assert await ledger.db.execute_fetchall("SELECT count(*) FROM chain") == entries
        assert (await ledger.get_generation(g.id)).status == "pending"  # type: ignore[union-attr]
        assert await ledger.get_stump("s-second000000") is None
        assert await verify(ledger) == []

        # Another kind of entry (a stump's access, say) appended with the change it records: linked and hashed,
        # and a change to it is named like any other.
        await ledger.transact(
            [
                ("UPDATE stumps SET published=0 WHERE id=$1", (first.id,)),
                appending.append("stump_access", first.id, {"id": first.id, "access": "private"}),
            ]
        )
        assert await verify(ledger) == []
    finally:
        await ledger.close()
    await asyncio.to_thread(unguarded, backend)
    await asyncio.to_thread(
        backend.change, "UPDATE chain SET body=replace(body, 'private', 'moderators') WHERE kind='stump_access'"
    )
    ledger = await Ledger.open(backend.location)
    try:
        [line] = await verify(ledger)
        assert re.fullmatch(
            r"chain entry \d+ \(stump_access s-first0000000\): its hash does not match its content", line
        )
    finally:
        await ledger.close()


def test_a_fresh_ledger_opened_writes_no_entry(backend: Backend):
    async def go() -> list:
        ledger = await Ledger.open(backend.location)
        try:
            return await ledger.db.execute_fetchall("SELECT * FROM chain")
        finally:
            await ledger.close()

    assert asyncio.run(go()) == []


def test_a_residents_access_choice_and_every_read_of_stump_text_are_in_the_chain(backend: Backend, capsys):
    """Issue 12: stump access (the resident's choice, and each read of the text) is chained like a record."""
    from residents.ledger import access

    db = replayed_into(backend.location, capsys, ("retry",))
    [(sid,)] = backend.rows("SELECT id FROM stumps WHERE cause='retry-abandoned' LIMIT 1")

    async def choose_read_and_verify() -> list[str]:
        async with Ledger.open(db) as lg:
            await access.set_access(lg, sid, "private", "cairn", None)
            await access.record_read(lg, sid, "mo (42)", "moderator")
            return await verify(lg)

    async def verify_again() -> list[str]:
        async with Ledger.open(db) as lg:
            return await verify(lg)

    assert asyncio.run(choose_read_and_verify()) == []
    assert entry_of(db, "stump-access", sid) > entry_of(db, "stump", sid)
    [(body,)] = backend.rows("SELECT body FROM chain WHERE kind='stump-read' AND record=$1", sid)
    assert json.loads(body)["reader"] == "mo (42)" and "text" not in body
    # rewriting who chose, or who read, is named with its entry
    backend.change("UPDATE stump_access_changes SET access='moderators' WHERE stump_id=$1", sid)
    backend.change("UPDATE stump_reads SET reader='nobody' WHERE stump_id=$1", sid)
    found = asyncio.run(verify_again())
    assert any(f"(stump-access {sid}): the ledger no longer matches it: access" in v for v in found), found
    assert any(f"(stump-read {sid}): the ledger no longer matches it: reader" in v for v in found), found


def test_the_chain_checked_in_worker_processes_names_the_same_lines_in_the_same_order(
    backend: Backend, capsys, monkeypatch
):
    """A long ledger is checked by this process and one worker (the chain's walk, the entries whose record
    is gone, ranges of generations); with every kind of tamper at once, `verify` names
    the same lines, in the same order, as checking it in one pass: edited records, a changed, unparsable, non-canonical or relabelled entry, a
    deleted entry, a record gone, a record never chained."""
    db = replayed_into(backend.location, capsys)
    unguarded(backend)
    [(body3,)] = backend.rows("SELECT body FROM chain WHERE seq=3")
    [(body9,)] = backend.rows("SELECT body FROM chain WHERE seq=9")
    for statement in (
        "UPDATE stumps SET text=$1 WHERE cause='retry-abandoned'",
        "UPDATE posts SET message_id='999' WHERE kind='receipt'",
        "UPDATE chain SET body='not json' WHERE seq=7",
        "UPDATE chain SET kind='stump' WHERE seq=11",
        "UPDATE chain SET body=body||'é' WHERE seq=12",
        "DELETE FROM chain WHERE seq=14",
        "DELETE FROM posts WHERE rowid=(SELECT max(rowid) FROM posts WHERE kind='partial')",
        "INSERT INTO stumps (id, generation_id, attempt_id, residence, scope, cause, text, chars, created_at)"
        " SELECT 's-unchained00', generation_id, attempt_id, residence, 'attempt', 'retry-abandoned', text, chars, 0"
        " FROM stumps WHERE cause='retry-abandoned' LIMIT 1",
    ):
        backend.change(statement, *((b"changed",) if "$1" in statement else ()))
    backend.change("UPDATE chain SET body=$1 WHERE seq=3", body3.replace('"chars":', '"chars":1', 1))
    backend.change("UPDATE chain SET body=$1 WHERE seq=9", body9.replace(":", ": ", 1))
    code, one_pass = run_verify(capsys, "--db", db)
    assert code == 1
    for expected in (
        "its hash does not match its content",
        "its body is not JSON",
        "its body is not canonical JSON",
        "its kind/record columns (stump,",
        "entries 14..14 are missing",
        "the record it attests is not in the ledger",
        "the record it attests is no longer delivered",
        "stump s-unchained00: not in the chain",
    ):
        assert any(expected in line for line in one_pass), (expected, one_pass)
    from residents.ledger import verify as verifying

    monkeypatch.setattr(verifying, "PARALLEL_FROM", 0)
    code, in_workers = run_verify(capsys, "--db", db)
    assert code == 1 and in_workers == one_pass


def test_the_latest_entry_of_every_kind_whose_record_is_gone_is_named_in_one_pass_and_in_a_worker(
    backend: Backend, capsys, monkeypatch
):
    """A record of each table deleted behind the ledger's back (a generation, an attempt, a stump that was
    chosen and read, a delivered post, a refused post, a budget refusal): the latest entry of each of
    the nine kinds naming one is named as attesting nothing, the same in one pass, shared with a worker,
    and by `chain.unattested` run in a worker process itself."""
    from residents.ledger import access, budgets
    from residents.ledger import rows as ledger_rows
    from residents.ledger import verify as verifying
    from residents.records import BudgetRefusal, Refusal

    db = replayed_into(backend.location, capsys, ("retry", "ceiling"))
    [(sid, res, gid)] = backend.rows("SELECT id, residence, generation_id FROM stumps ORDER BY id LIMIT 1")
    [(cut,)] = backend.rows("SELECT id FROM generations WHERE status='truncated'")
    [(aid,)] = backend.rows("SELECT id FROM attempts WHERE generation_id=$1 ORDER BY id LIMIT 1", cut)
    [(pid,)] = backend.rows("SELECT id FROM posts WHERE generation_id=$1 AND kind='receipt'", cut)

    async def more() -> None:
        async with Ledger.open(db) as lg:
            await access.set_access(lg, sid, "private", res, gid)
            await access.record_read(lg, sid, "mo (42)", "moderator")
            post = ledger_rows.post(
                {"id": "p-refused0000", "generation_id": None, "seq": 99, "kind": "notice",
                 "content": b"-# a notice", "channel": "c", "reason": "declined-continue"}
            )  # fmt: skip
            await lg.add_posts([post])
            await lg.mark_refused(post, Refusal(403, 50013, "403 Forbidden (error code: 50013): Missing Permissions"))
            was = BudgetRefusal("br-1", "cairn", "c", "m-1", None, "residence", "output", 10, 12, "2026-12-05", None)
            await budgets.refuse(lg, was, [])

    asyncio.run(more())
    gone = {
        "generations": cut, "attempts": aid, "stumps": sid, "posts": pid, "budget_refusals": "br-1",
    }  # fmt: skip
    gone_too = ("posts", "p-refused0000")
    if backend.name == "postgresql":  # (SQLite's own connection does not enforce foreign keys)
        for table in gone:
            backend.change(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
    for table, record in [*gone.items(), gone_too]:
        backend.change(f"DELETE FROM {table} WHERE id=$1", record)
    code, one_pass = run_verify(capsys, "--db", db)
    assert code == 1
    latest = {
        (kind, record): seq
        for seq, kind, record in backend.rows("SELECT seq, kind, record FROM chain ORDER BY seq")
        if record in {*gone.values(), gone_too[1]}
    }
    assert {kind for kind, _ in latest} == set(chain.TABLE_OF)  # all nine kinds
    for (kind, record), seq in latest.items():
        attests = "no longer delivered" if kind == "delivered" else "not in the ledger"
        assert any(line.startswith(f"chain entry {seq} ({kind} {record}): the record it attests is {attests}")
                   for line in one_pass), (kind, one_pass)  # fmt: skip
    monkeypatch.setattr(verifying, "PARALLEL_FROM", 0)
    assert run_verify(capsys, "--db", db) == (1, one_pass)
    [(top,)] = backend.rows("SELECT max(seq) FROM chain")
    with contextlib.closing(verifying._read_only(db)) as conn:
        here = chain.unattested(conn.cursor(), top)
    with verifying._pool() as pool:
        there = pool.submit(verifying._in_worker, db, chain.unattested, top).result()
    assert there.lines == here.lines and len(here.lines) == len(latest)


def confirmed(db: Path) -> tuple[int, list[str]]:
    """How many records' latest entries their builders confirm byte for byte (`chain.confirms`), and the
    lines holding every record against its entries gives."""
    from residents.ledger import verify as verifying

    con = sqlite3.connect(db)
    try:
        part = verifying._range(con.cursor(), "", None, verifying._prelude(con), 1000)
    finally:
        con.close()
    return part.held.confirmed, [line for _, _, line in part.held.lines] + part.held.unchained


def test_the_builders_confirm_every_entry_of_every_kind_of_record(tmp_path, capsys):
    """Each record's latest entry is, byte for byte, what its builder gives now, for every kind and field
    (blocks of every type, several segments, retries, cuts, continuations, tool rounds, deliveries): on
    a whole ledger every one is confirmed and none is left to a second look. A string outside ASCII
    still holds; a changed record is named with what differs."""
    everything = (
        "retry", "ceiling", "thinking-cut", "continuation", "on-request", "tool-cut", "tool-list",
        "tool-retry", "unknown-block", "lookalike", "refusal", "openai-reasoning", "openai-tool-calls",
    )  # fmt: skip
    db = replayed(tmp_path, capsys, everything)
    [(latest,)] = sql(
        db,
        "SELECT count(*) FROM (SELECT DISTINCT kind, record FROM chain WHERE kind IN"
        " ('attempt', 'generation', 'stump', 'post', 'delivered'))",
    )
    assert sql(db, "SELECT count(*) FROM chain WHERE kind = 'delivered'")[0][0] > 0
    assert confirmed(db) == (latest, [])

    async def add() -> None:
        async with Ledger.open(db) as lg:
            g = Generation(id="g-outside-ascii", residence="café", channel="room", model="m")
            await lg.create_generation(g)
            g.status, g.text, g.finished_at = "completed", "Bonjour.", 1.0
            await lg.finish_generation(g, [])

    asyncio.run(add())
    assert confirmed(db) == (latest + 1, [])
    assert asyncio.run(_verify(db)) == []
    script(db, "UPDATE generations SET model = 'other' WHERE id = 'g-outside-ascii'")
    assert [line.split(": ", 2)[-1] for line in asyncio.run(_verify(db))] == ["model (entry m, ledger other)"]


def test_a_number_in_a_text_column_is_named_like_any_other_change(tmp_path, capsys):
    """SQLite stores a number given to a text column as text: such a change is named like any other."""
    db = replayed(tmp_path, capsys)
    [(gid, model)] = sql(db, "SELECT id, model FROM generations WHERE status = 'completed' LIMIT 1")
    sql(db, "UPDATE generations SET model = ? WHERE id = ?", (0.3, gid))
    assert sql(db, "SELECT typeof(model) FROM generations WHERE id = ?", (gid,)) == [("text",)]
    assert [line.split(": ", 2)[-1] for line in asyncio.run(_verify(db))] == [
        f"model (entry {chain._short(model)}, ledger 0.3)"
    ]


def test_blocks_put_in_another_order_are_named_whatever_order_a_plan_reads_them_in(tmp_path, capsys):
    """An attempt's blocks swapped (their pos), the chain left alone, with an index that reads them in
    the order they were written: the entry no longer matches, and `verify` says so."""
    db = replayed(tmp_path, capsys, ("unknown-block",))
    [(aid,)] = sql(db, "SELECT attempt_id FROM attempt_blocks GROUP BY attempt_id HAVING count(*) >= 2 LIMIT 1")
    seq = entry_of(db, "attempt", aid)
    script(
        db,
        f"UPDATE attempt_blocks SET pos = pos + 100 WHERE attempt_id = '{aid}';"
        f"UPDATE attempt_blocks SET pos = (SELECT max(pos) FROM attempt_blocks WHERE attempt_id = '{aid}') + 101 - pos"
        f" WHERE attempt_id = '{aid}';"
        "CREATE INDEX blocks_as_written ON attempt_blocks(attempt_id, idx, type, content);",
    )
    assert any(
        line.startswith(f"chain entry {seq} (attempt {aid}): the ledger no longer matches it: blocks")
        for line in asyncio.run(_verify(db))
    )


def test_a_block_equal_to_its_text_only_by_a_collation_is_named(tmp_path, capsys):
    """A block's content told from its attempt's text byte for byte, not by `=`: with the column made
    NOCASE and the block's case changed (the chain left alone), the entry no longer matches."""
    db = replayed(tmp_path, capsys)
    [(aid, text)] = sql(
        db,
        "SELECT a.id, a.text FROM attempts a JOIN attempt_blocks b ON b.attempt_id = a.id AND b.content = a.text"
        " WHERE CAST(a.text AS TEXT) GLOB '*[a-z]*' LIMIT 1",
    )
    seq = entry_of(db, "attempt", aid)
    [(schema,)] = sql(db, "SELECT sql FROM sqlite_master WHERE name = 'attempt_blocks'")
    con = sqlite3.connect(db, isolation_level=None)
    try:
        con.execute("PRAGMA writable_schema = ON")
        con.execute(
            "UPDATE sqlite_master SET sql = ? WHERE name = 'attempt_blocks'",
            (schema.replace("content BLOB NOT NULL", "content BLOB NOT NULL COLLATE NOCASE"),),
        )
    finally:
        con.close()
    t = bytes(text).decode()
    sql(db, "UPDATE attempts SET text = ? WHERE id = ?", (t, aid))  # the same characters, as TEXT
    sql(db, "UPDATE attempt_blocks SET content = ? WHERE attempt_id = ?", (t.swapcase(), aid))  # as TEXT too
    assert sql(db, "SELECT count(*) FROM attempt_blocks WHERE attempt_id = ? AND content = ?", (aid, t)) == [(1,)]
    assert any(
        line.startswith(f"chain entry {seq} (attempt {aid}): the ledger no longer matches it: blocks")
        for line in asyncio.run(_verify(db))
    )


async def _verify(db: Path) -> list[str]:
    """The chain's own verdicts (the generation made by hand above is not a whole turn)."""
    async with Ledger.open(db) as lg:
        return (await check(lg)).chain_lines


def test_a_record_and_its_entry_rewritten_together_still_fail_the_entry_hash(tmp_path, capsys, monkeypatch):
    """Rewriting a record and its latest entry's body to match (the entry's hash left alone) makes the
    entry exactly what the record gives, but it no longer hashes to itself: `verify` names it, in one
    pass and shared among processes. So does a REAL where an integer was, whatever SQLite renders."""
    db = replayed(tmp_path, capsys)
    script(db, "DROP TRIGGER chain_no_update;")
    [(gid,)] = sql(db, "SELECT id FROM generations WHERE status = 'completed' LIMIT 1")
    seq = entry_of(db, "generation", gid)
    [(body, model)] = sql(
        db, "SELECT body, (SELECT model FROM generations WHERE id = ?) FROM chain WHERE seq = ?", (gid, seq)
    )
    sql(db, "UPDATE generations SET model = 'forged' WHERE id = ?", (gid,))
    sql(db, "UPDATE chain SET body = ? WHERE seq = ?", (body.replace(f'"model":"{model}"', '"model":"forged"'), seq))
    [(aid, aseq)] = sql(
        db,
        "SELECT record, max(seq) FROM chain WHERE kind = 'attempt' AND body LIKE '%\"output_tokens\":1%'"
        " GROUP BY record LIMIT 1",
    )
    [(abody,)] = sql(db, "SELECT body FROM chain WHERE seq = ?", (aseq,))
    tokens = json.loads(abody)["output_tokens"]
    sql(db, "UPDATE attempts SET output_tokens = ? WHERE id = ?", (0.1 + 0.2, aid))  # SQLite writes it 0.3
    sql(
        db,
        "UPDATE chain SET body = ? WHERE seq = ?",
        (abody.replace(f'"output_tokens":{tokens}', '"output_tokens":0.3'), aseq),
    )
    code, one_pass = run_verify(capsys, "--db", str(db))
    assert code == 1
    assert f"chain entry {seq} (generation {gid}): its hash does not match its content" in one_pass
    assert f"chain entry {aseq} (attempt {aid}): its hash does not match its content" in one_pass
    assert any(
        line.startswith(f"chain entry {aseq} (attempt {aid}): the ledger no longer matches it: output_tokens")
        for line in one_pass
    )
    from residents.ledger import verify as verifying

    monkeypatch.setattr(verifying, "PARALLEL_FROM", 0)
    assert run_verify(capsys, "--db", str(db)) == (1, one_pass)


@pytest.mark.parametrize("raw", ["\x7f", "é"])
def test_an_entry_sqlite_would_render_but_canonical_json_would_not_is_named_even_rehashed(tmp_path, capsys, raw):
    """SQLite writes DEL and characters outside ASCII raw; canonical JSON escapes them. A record and its
    entry rewritten with such a character left raw, and every hash after it recomputed (so each link
    and hash holds), is still named: the body is not canonical JSON."""
    db = replayed(tmp_path, capsys)
    script(db, "DROP TRIGGER chain_no_update;")
    [(gid,)] = sql(db, "SELECT id FROM generations WHERE status = 'completed' LIMIT 1")
    seq = entry_of(db, "generation", gid)
    [(model,)] = sql(db, "SELECT model FROM generations WHERE id = ?", (gid,))
    sql(db, "UPDATE generations SET model = ? WHERE id = ?", (model + raw, gid))
    [(body,)] = sql(db, "SELECT body FROM chain WHERE seq = ?", (seq,))
    sql(
        db,
        "UPDATE chain SET body = ? WHERE seq = ?",
        (body.replace(f'"model":"{model}"', f'"model":"{model}{raw}"'), seq),
    )
    [(prev,)] = sql(db, "SELECT prev FROM chain WHERE seq = ?", (seq,))
    for n, body_n in sql(db, "SELECT seq, body FROM chain WHERE seq >= ? ORDER BY seq", (seq,)):
        digest = hashlib.sha256(f'{{"entry":{body_n},"prev":"{prev}","seq":{n}}}'.encode()).hexdigest()
        sql(db, "UPDATE chain SET prev = ?, hash = ? WHERE seq = ?", (prev, digest, n))
        prev = digest
    code, lines = run_verify(capsys, "--db", str(db))
    assert code == 1 and lines == [f"chain entry {seq} (generation {gid}): its body is not canonical JSON"], lines
