"""The ledger at scale: the reads people and start-up make stay on indexes, `verify` streams, and a
request is stored by content so a busy room's ledger grows with what was said."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import re
import sqlite3
import sys
from typing import Any

import pytest
from conftest import Room, residence

from residents.ledger import Ledger, budgets, live, migrations, store, usage
from residents.ledger.connection import Connection
from residents.ledger.verify import check
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.records import Generation, Status

# Every read people and start-up make, as the code runs it (ledger list, ledger stumps and /stumps list
# with each of their filters, crash settlement, resume's undelivered posts, the context compiler's and
# provenance's reads of generations, /continue's latest generation, live messages left in progress).
READS = {
    "ledger list": store.list_generations_sql(False),
    "ledger list --residence": store.list_generations_sql(True),
    **{
        f"stumps residence={r} cause={c} before={b} channels={n}": store.stump_meta_sql(
            residence=r, cause=c, before=b, channels=n
        )
        for r in (False, True)
        for c in (False, True)
        for b in (False, True)
        for n in (None, 3)
    },
    "unsettled generations": store.UNSETTLED,
    "streaming attempts": store.STREAMING,
    "generations without posts": store.WITHOUT_POSTS,
    "undelivered posts": store.UNDELIVERED,
    "posts by message": store.POSTS_BY_MESSAGE.format(marks="$1,$2,$3"),
    "generations": store.GENERATIONS.format(marks="$1,$2,$3"),
    "their blocks": store.GENERATION_BLOCKS.format(marks="$1,$2,$3"),
    "their attempts": store.GENERATION_ATTEMPTS.format(marks="$1,$2,$3"),
    "their segments": store.GENERATION_SEGMENTS.format(marks="$1,$2,$3"),
    "their stumps": store.GENERATION_STUMPS.format(marks="$1,$2,$3"),
    "their posts": store.GENERATION_POSTS.format(marks="$1,$2,$3"),
    "their requests' parts": store.REQUEST_PARTS.format(marks="$1,$2,$3"),
    "messages a resident claimed": store.CLAIMED.format(marks="$1,$2,$3", residence=4),
    "latest generation": store.LATEST_GENERATION.format(channel=""),
    "latest generation in a channel": store.LATEST_GENERATION.format(channel=" AND channel=$2"),
    "live messages in progress": live.IN_PROGRESS,
    "a record's latest entry of a kind": "SELECT max(seq) FROM chain WHERE record = $1 AND kind = $2",
    "a residence's tokens today": budgets.SPENT,
    "a person's tokens today": budgets.SPENT_BY_PERSON,
    "a channel told of a spent budget today": budgets.TOLD,
    **{f"usage by {by}": usage.report_sql(by) for by in usage.BY},
    "usage by channel in a moderator's channels": usage.report_sql("channel", 3),
}
# Listings newest first: the ORDER BY ... LIMIT must be walked on an index, never a sort of every row.
PAGED = ("ledger list", "stumps ")
# The index each of the reads that was a full scan before must use now.
USES = {
    "ledger list": "generations_created",
    "stumps residence=False cause=False before=False channels=None": "stumps_created",
    "stumps residence=False cause=False before=False channels=3": "stumps_created",
    "stumps residence=False cause=True before=False channels=None": "stumps_cause",
    "unsettled generations": "generations_pending",
    "streaming attempts": "attempts_streaming",
    "generations without posts": "generations_unplanned",
    "latest generation in a channel": "generations_channel",
    "live messages in progress": "live_messages_live",
    "messages a resident claimed": "sqlite_autoindex_reply_claims_1",  # its primary key (residence, trigger)
    # covering: the kind is tested in the index, never by reading each entry of the record
    "a record's latest entry of a kind": "COVERING INDEX chain_record_kind",
    "a residence's tokens today": "attempts_started",
    "a person's tokens today": "attempts_started",
    "a channel told of a spent budget today": "budget_refusals_told",
    **{f"usage by {by}": "attempts_started" for by in usage.BY},
    "usage by channel in a moderator's channels": "attempts_started",
}


def settled(path: Any, prefix: str, n: int) -> None:
    """A ledger of `n` completed generations `{prefix}0`, `{prefix}1`, ... with ids ascending and created
    newest first (so the order of ids is not the order of the verdicts)."""

    async def build() -> None:
        async with Ledger.open(path) as lg:
            for i in range(n):
                g = Generation(id=f"{prefix}{i}", residence="cairn", channel="room", model="m", created_at=100.0 - i)
                await lg.create_generation(g)
                g.status, g.text, g.finished_at = "completed", f"text {i}", 100.0
                await lg.finish_generation(g, [])

    asyncio.run(build())


def violations(path: Any) -> list[str]:
    """`verify`'s lines on the ledger at `path`, within a minute (a check that stops fails the test)."""

    async def run() -> list[str]:
        async with Ledger.open(path) as lg:
            return (await check(lg)).violations

    return asyncio.run(asyncio.wait_for(run(), 60))


class _Nulls(dict[str, None]):
    """Parameters for EXPLAIN QUERY PLAN: NULL for each `$n` a query names."""

    def __missing__(self, key: str) -> None:
        return None


async def test_every_read_people_and_start_up_make_is_an_index_seek(tmp_path):
    """EXPLAIN QUERY PLAN of each read, on a ledger as migrations leave it (no ANALYZE, as in production):
    no table is scanned but along an index, and no listing sorts its whole table to take a page."""
    async with Ledger.open(tmp_path / "l.db") as lg:
        for name, sql in READS.items():
            plan = [r[3] for r in await lg.db.execute_fetchall("EXPLAIN QUERY PLAN " + sql, _Nulls())]
            for line in plan:
                assert not re.match(r"SCAN \w+$", line) and ("SCAN" not in line or "INDEX" in line), (name, plan)
                if name.startswith(PAGED):
                    assert "TEMP B-TREE FOR ORDER BY" not in line, (name, plan)
            if name in USES:
                assert any(USES[name] in line for line in plan), (name, plan)


async def test_start_up_finds_settled_generations_without_posts_through_the_schema(pipeline):
    """`planned` (m032) is kept by the schema: a generation's own post marks it, a stump's publication does not."""
    lg = pipeline.ledger
    await pipeline.turn(pipeline.resident(residence()), Room(), "Hello.", [Call(sse=sse.stream("Hi there."))])
    assert await lg.generations_without_posts() == []
    assert [r[0] for r in await lg.db.execute_fetchall("SELECT planned FROM generations")] == [1]
    g = Generation(id="g-unplanned00", residence="cairn", channel="room", model="m", status="completed")
    await lg.create_generation(g)
    await lg.db.execute("UPDATE generations SET status='completed' WHERE id=$1", (g.id,))
    assert await lg.generations_without_posts() == [g.id]


async def test_a_generation_with_nothing_to_post_is_planned_once_not_at_every_start(pipeline):
    """A settled generation whose plan is empty (completed with no text: no post, no line) is looked at
    by the first start-up after it and marked planned, so start-up does not read it again every time
    (a ledger's count of them only grows)."""
    from residents.delivery.resume import plan_unposted

    lg = pipeline.ledger
    g = Generation(id="g-silent00001", residence="cairn", channel="room", model="m")
    await lg.create_generation(g)
    g.status = Status.COMPLETED
    await lg.finish_generation(g, [])
    assert await lg.generations_without_posts() == [g.id]
    assert await plan_unposted(lg) == []
    assert await lg.generations_without_posts() == []
    assert [p.id for p in (await lg.get_generation(g.id)).posts] == []  # type: ignore[union-attr]


REQUEST = {
    "model": "claude-3-opus-20240229",
    "max_tokens": 4096,
    "system": "You are Cairn.",
    "messages": [
        {"role": "user", "content": "ana: héllo \ud800 lone\n\nben: second line\n\n"},
        {"role": "assistant", "content": "An answer, \u2603."},
        {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "tool_use", "id": "t", "name": "n"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "{}"}]},
        {"content": "keys in another order", "role": "user"},
        {"role": "user", "content": ""},
    ],
    "temperature": 0.7,
    "stop_sequences": ["\n\nHuman:"],
}


async def test_a_request_reads_back_as_the_exact_json_it_was_stored_from(tmp_path):
    async with Ledger.open(tmp_path / "l.db") as lg:
        g = Generation(id="g-request0001", residence="cairn", channel="room", model="m", request=REQUEST)
        await lg.create_generation(g)
        assert await lg.request_json(g.id) == json.dumps(REQUEST).encode("ascii")
        back = await lg.get_generation(g.id)
        assert back is not None and back.request == REQUEST
        [(whole, ref)] = await lg.db.execute_fetchall("SELECT request, request_ref FROM generations")
        assert whole is None and b"ana" not in ref  # the text lives in the parts, once


async def before_m033(path: Any) -> Connection:
    """A new ledger at `path` as the migrations before `m033_request_parts` leave it (requests kept whole)."""
    first = [name for name, _ in migrations.MIGRATIONS].index("m033_request_parts")
    db = await Connection.open(path)
    saved = list(migrations.MIGRATIONS)
    try:
        migrations.MIGRATIONS[:] = saved[:first]
        await migrations.apply(db)
    finally:
        migrations.MIGRATIONS[:] = saved
    return db


async def test_old_ledgers_requests_are_converted_and_read_back_byte_for_byte(tmp_path):
    """A ledger from before m033 keeps its whole request per row; opening it stores them by content
    (m034), every request reading back as the same JSON bytes and the chain still whole."""
    path = tmp_path / "old.db"
    db = await before_m033(path)
    blobs = {}
    for i in range(3):
        req = {**REQUEST, "messages": REQUEST["messages"][: 3 + i]}
        blobs[f"g-old{i:09d}"] = json.dumps(req).encode("utf-8", "surrogatepass")
    blobs["g-oldspaced01"] = json.dumps(REQUEST, indent=1).encode()  # not json.dumps' own form: left whole
    for gid, blob in blobs.items():
        await db.execute(
            "INSERT INTO generations (id, residence, channel, model, status, standing, continuation_ended, request,"
            " created_at) VALUES ($1, 'cairn', 'room', 'm', 'pending', 'none', 'not-needed', $2, 1.0)",
            (gid, blob),
        )
    await db.close()
    async with Ledger.open(path) as lg:
        for gid, blob in blobs.items():
            assert await lg.request_json(gid) == blob
            g = await lg.get_generation(gid)
            assert g is not None and g.request == json.loads(blob)
        kept = [r[0] for r in await lg.db.execute_fetchall("SELECT id FROM generations WHERE request IS NOT NULL")]
        assert kept == ["g-oldspaced01"]
        assert (await check(lg)).ok


async def test_an_old_ledgers_odd_requests_are_kept_as_they_were_and_the_ledger_opens(tmp_path):
    """Rows m034 cannot store by content (not JSON, not UTF-8, a request kept as TEXT) stay in their old
    column byte for byte; the others are converted; the ledger opens and every request reads back."""
    path = tmp_path / "old.db"
    db = await before_m033(path)
    odd: dict[str, Any] = {
        "g-notjson0001": b"{not json",
        "g-notutf80001": b'{"a": "\xff"}',
        "g-deep00000001": b"[" * 100_000 + b"]" * 100_000,
        "g-texttype0001": json.dumps(REQUEST),
    }
    fine = {"g-fine00000001": json.dumps({**REQUEST, "temperature": 0.1, "messages": []}).encode()}
    for gid, blob in {**odd, **fine}.items():
        await db.execute(
            "INSERT INTO generations (id, residence, channel, model, status, standing, continuation_ended, request,"
            " created_at) VALUES ($1, 'cairn', 'room', 'm', 'pending', 'none', 'not-needed', $2, 1.0)",
            (gid, blob),
        )
    await db.close()
    async with Ledger.open(path) as lg:
        for gid, blob in fine.items():
            assert await lg.request_json(gid) == blob
        rows = await lg.db.execute_fetchall("SELECT id, request FROM generations WHERE request IS NOT NULL")
        assert dict((r[0], r[1]) for r in rows) == odd


async def test_a_busy_rooms_requests_grow_with_what_was_said_not_history_times_turns(pipeline):
    """Forty turns in one channel, each request carrying the room's last 50 lines: what the ledger keeps
    of the requests stays within a small multiple of what was said, not the ~20× of whole requests."""
    rng = random.Random(7)
    words = "river mill heron reeds light water cold morning weather quiet stone".split()

    def line() -> str:
        return " ".join(rng.choice(words) for _ in range(70))

    res, room = pipeline.resident(residence()), Room()
    said = 0
    for _ in range(40):
        content, reply = line(), line()
        said += len(content) + len(reply)
        await pipeline.turn(res, room, content, [Call(sse=sse.stream(reply))])
    db = pipeline.ledger.db
    [(rows,)] = await db.execute_fetchall(
        "SELECT sum(coalesce(length(request), 0) + coalesce(length(request_ref), 0)) FROM generations"
    )
    [(parts,)] = await db.execute_fetchall("SELECT coalesce(sum(length(body)), 0) FROM request_parts")
    whole = 0
    for (gid,) in await db.execute_fetchall("SELECT id FROM generations"):
        whole += len(await pipeline.ledger.request_json(gid) or b"")
    assert whole > 15 * said  # what storing each request whole costs: history × turns
    assert rows + parts < 2 * said, (rows, parts, said)
    assert (await check(pipeline.ledger)).ok


def test_verify_reads_a_batch_at_a_time_with_the_same_verdicts_in_the_same_order(tmp_path, monkeypatch):
    """`verify` streams (generations, their records and the chain a batch at a time): with batches of 2
    it names the same violations, in the same order (the first broken chain entry first, then the
    generations oldest first), as with every row at once."""
    from residents.ledger import chain, verify

    settled(tmp_path / "l.db", "g-batch", 7)
    with sqlite3.connect(tmp_path / "l.db") as raw:
        raw.execute("UPDATE generations SET model = 'other' WHERE id IN ('g-batch1', 'g-batch5')")
    whole = violations(tmp_path / "l.db")
    assert whole[0].startswith("chain entry 2 (generation g-batch1): the ledger no longer matches it: model")
    assert whole[1].startswith("chain entry 6 (generation g-batch5)")
    named = [line.split()[1].rstrip(":") for line in whole if line.startswith("generation ")]
    assert list(dict.fromkeys(named)) == [f"g-batch{i}" for i in range(6, -1, -1)]
    monkeypatch.setattr(verify, "BATCH", 2)
    monkeypatch.setattr(chain, "BATCH", 2)  # the walk's
    assert violations(tmp_path / "l.db") == whole


def test_two_parts_of_one_request_sharing_a_key_are_refused_not_merged(monkeypatch):
    """Two different parts of one request whose keys (the SHA-256's first 8 bytes) are equal: the schema's
    trigger cannot see it (only one row would be written), so packing refuses it rather than storing a
    request that reads back with one part in place of the other. Keys of 1 byte here, to meet one."""
    from residents.ledger import requests

    real = requests.part_of
    monkeypatch.setattr(requests, "part_of", lambda body: requests.Part(real(body).id % 2, real(body).sha256, body))
    req = {"messages": [{"role": "user", "content": "one\n\ntwo\n\nthree\n\nfour"}]}
    try:
        packed = requests.pack(req)
    except ValueError as e:
        assert "SHA-256" in str(e)
    else:
        parts = {p.id: p.body for p in packed.parts}
        assert requests.unpack_bytes(packed.ref, parts) == json.dumps(req).encode(), "a part replaced another"


def test_record_ids_sort_by_creation_so_a_ledger_read_in_id_order_walks_its_pages_in_order(monkeypatch):
    """`new_id`: time first, then a counter within the millisecond: ids of one process are unique and
    only grow, through a burst in one millisecond and a wall clock stepped back."""
    import time as real_time

    from residents import records

    burst = [records.new_id("g-") for _ in range(5000)]
    assert len(set(burst)) == len(burst) and burst == sorted(burst)
    assert all(re.fullmatch(r"g-[0-9a-f]{20}", i) for i in burst)
    stamp = int(burst[-1][2:], 16) >> 36  # milliseconds since the epoch
    assert abs(stamp - real_time.time_ns() // 1_000_000) < 60_000
    monkeypatch.setattr(records.time, "time_ns", lambda: 0)  # the clock stepped back to 1970
    after = [records.new_id("g-") for _ in range(3)]
    assert burst[-1] < after[0] < after[1] < after[2]


def test_verify_in_worker_ranges_names_the_same_violations_in_the_same_order(tmp_path, monkeypatch):
    """On a long ledger the generations are checked in worker processes, one range of ids each: the
    verdicts and their order are those of one pass, including records of a missing generation that
    fall between two ranges and at the end, and the counts of generations and undelivered posts."""
    from residents.ledger import verify

    async def run() -> tuple[list[str], int, list[str]]:
        async with Ledger.open(tmp_path / "l.db") as lg:
            r = await check(lg)
            return r.violations, r.generations, r.unsettled

    settled(tmp_path / "l.db", "g-range", 9)
    with sqlite3.connect(tmp_path / "l.db") as raw:
        raw.execute("PRAGMA foreign_keys=OFF")
        raw.execute("UPDATE generations SET chars = 99 WHERE id IN ('g-range2', 'g-range7')")
        raw.execute("UPDATE generations SET status = 'pending' WHERE id = 'g-range5'")
        for gid in ("g-range3x", "g-range9x"):  # between two ranges' ids, and after every id
            raw.execute(
                "INSERT INTO stumps (id, generation_id, residence, scope, cause, text, chars, created_at)"
                " VALUES ($1, $2, 'cairn', 'output', 'max-tokens', x'61', 1, 1.0)",
                (f"s-of-{gid}", gid),
            )
    one_pass = asyncio.run(run())
    assert one_pass[1] == 9 and one_pass[2] == ["g-range5"]
    assert sum("belongs to missing generation" in line for line in one_pass[0]) == 2
    assert sum("chars 99 != 6" in line for line in one_pass[0]) == 2
    monkeypatch.setattr(verify, "PARALLEL_FROM", 0)
    monkeypatch.setattr(verify, "BATCH", 2)
    monkeypatch.setattr(verify, "CHUNK", 2)
    spans: list[tuple[str, str | None]] = []
    pools: list[Any] = []
    make_spans, make_pool = verify._spans, verify._pool
    before, switches = sys.getswitchinterval(), set()

    def spy_spans(bounds: list[str]) -> Any:
        spans.extend(make_spans(bounds))
        switches.add(sys.getswitchinterval())
        return spans

    def spy_pool() -> Any:
        pools.append(make_pool())
        return pools[-1]

    monkeypatch.setattr(verify, "_spans", spy_spans)
    monkeypatch.setattr(verify, "_pool", spy_pool)
    assert asyncio.run(run()) == one_pass
    assert len(pools) == 1  # a pool of worker processes
    assert len(spans) == 5 and spans[0][0] == "" and spans[-1][1] is None  # 9 generations, 2 a range
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # the ranges tile the ids
    # no process-wide switch is touched: the interval is as it was, during the check and after
    assert switches == {before} and sys.getswitchinterval() == before


def test_worker_processes_import_the_package_not_a_module_of_the_working_folder(tmp_path, monkeypatch, capsys):
    """`ledger verify` run from a discord.py project's folder (a `bot.py` beside the configuration, or a
    `residents.py`) checks with its worker processes as anywhere else: nothing there is imported."""
    from residents import cli
    from residents.ledger import verify

    settled(tmp_path / "l.db", "g-cwd", 6)
    argv = ["ledger", "verify", "--db", str(tmp_path / "l.db")]
    one_pass = cli.main(argv), capsys.readouterr()
    project = tmp_path / "project"
    project.mkdir()
    for name in ("bot.py", "residents.py"):
        (project / name).write_text("raise SystemExit('the working folder was imported')\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(verify, "PARALLEL_FROM", 0)
    monkeypatch.setattr(verify, "BATCH", 2)
    monkeypatch.setattr(verify, "CHUNK", 2)
    started: list[Any] = []
    make_pool = verify._pool

    def spy_pool() -> Any:
        started.append(make_pool())
        return started[-1]

    monkeypatch.setattr(verify, "_pool", spy_pool)
    assert (cli.main(argv), capsys.readouterr()) == one_pass  # the same verdicts, a worker's share among them
    assert len(started) == 1 and "working folder" not in one_pass[1].err


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_worker_that_fails_is_named_and_the_check_stops_with_it(tmp_path, monkeypatch, capsys, request, backend):
    """A worker process that dies (here: one that cannot even start Python, its standard library nowhere)
    ends `verify` with one line naming the ledger (a URL without its password) and the failure, exit 1, no
    traceback, and no process or share left running."""
    from residents import cli
    from residents.ledger import verify

    location, named = str(tmp_path / "l.db"), str(tmp_path / "l.db")
    if backend == "postgresql":
        url = request.getfixturevalue("pg_server").create()  # trust auth: the password is not asked for
        location, named = url.replace("ledger@", "ledger:secret@"), url.replace("ledger@", "ledger:***@")

    async def build() -> None:
        async with Ledger.open(location) as lg:
            for i in range(3):
                g = Generation(id=f"g-fail{i}", residence="cairn", channel="room", model="m")
                await lg.create_generation(g)

    asyncio.run(build())
    monkeypatch.setattr(verify, "PARALLEL_FROM", 0)
    monkeypatch.setenv("PYTHONHOME", str(tmp_path / "nowhere"))
    assert cli.main(["ledger", "verify", "--db", location]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"residents: {named}: a worker process checking the ledger failed: it ended before it answered"]
    assert not multiprocessing.active_children()


def test_shared_verify_orders_lines_by_range_and_survives_a_worker_that_says_a_lot(tmp_path, monkeypatch):
    """Records of missing generations in many ranges, checked by two processes taking ranges as they
    free up, come out in the order of one pass; a worker that writes far more than a pipe holds to its
    stderr (every import traced) neither stops nor changes the check."""
    from residents.ledger import verify

    settled(tmp_path / "l.db", "g-order", 8)
    with sqlite3.connect(tmp_path / "l.db") as raw:
        raw.execute("PRAGMA foreign_keys=OFF")
        for i in range(8):  # one record of a missing generation after each generation's id
            raw.execute(
                "INSERT INTO stumps (id, generation_id, residence, scope, cause, text, chars, created_at)"
                " VALUES ($1, $2, 'cairn', 'output', 'max-tokens', x'61', 1, 1.0)",
                (f"s-orphan{i}", f"g-order{i}x"),
            )
    one_pass = violations(tmp_path / "l.db")
    assert [line.split()[1] for line in one_pass if "missing generation" in line] == [f"s-orphan{i}:" for i in range(8)]
    monkeypatch.setattr(verify, "PARALLEL_FROM", 0)
    monkeypatch.setattr(verify, "CHUNK", 1)
    monkeypatch.setenv("PYTHONVERBOSE", "2")  # the worker's stderr: megabytes
    assert violations(tmp_path / "l.db") == one_pass


def test_a_shared_check_starts_one_worker_process_whatever_the_cores(tmp_path, monkeypatch):
    """Each worker is an interpreter with its own batch of rows (about 80 MiB at 1,000,000 generations):
    one worker beside the verifying process, which takes ranges too, uses two cores and keeps the whole
    check under 200 MB, however many cores the machine says it has. The verdicts are one pass's."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from residents.ledger import verify

    settled(tmp_path / "l.db", "g-one", 6)
    with sqlite3.connect(tmp_path / "l.db") as raw:
        raw.execute("UPDATE generations SET chars = 99 WHERE id = 'g-one4'")
    one_pass = violations(tmp_path / "l.db")
    sizes: list[int | None] = []

    class Counted(ProcessPoolExecutor):
        def __init__(self, max_workers: int | None = None, **kw: Any) -> None:
            sizes.append(max_workers)
            super().__init__(max_workers, **kw)

    monkeypatch.setattr(verify, "ProcessPoolExecutor", Counted)
    monkeypatch.setattr(verify, "PARALLEL_FROM", 0)
    monkeypatch.setattr(verify, "CHUNK", 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert any("chars 99 != 6" in line for line in one_pass)
    assert violations(tmp_path / "l.db") == one_pass
    assert sizes == [1]
