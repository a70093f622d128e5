"""Usage and budgets through the real parts: the provider's token counts on every attempt, `residents usage`
(a real process) summing them to exactly what the local provider reported, /usage for moderators only, and
a spent daily budget making no provider call and telling its channel once a day, across a restart of the
real `residents run`.

The anthropic SDK and the openai SDK read streams from the local provider server over real sockets; the
bots are discord.py against the local room; the ledger is a real SQLite file there; what the ledger alone does with counts (a count edited, a ledger from
before m045, a day's budget) runs on both backends (`backend`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Room, residence
from discordkit import deployed, opts
from ledgerkit import Backend, is_pg
from roomkit import eventually, running_room
from test_cli import run_residents
from test_crash import Process, connected, db_rows
from test_discord_e2e import res

from residents import cli
from residents.config import Budgets
from residents.generation import budgets
from residents.ledger import Ledger, migrations, postgres, views
from residents.ledger.connection import Connection
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider import ListSink
from residents.provider.anthropic_messages import make_client, stream_once
from residents.provider.openai_compatible import make_openai_client, openai_stream_once

MODEL = "claude-3-opus-20240229"  # $15 input, $75 output, so $18.75 a cache write and $1.50 a read (per MTok)
ROOT = Path(__file__).resolve().parent.parent


def reply(text: str, output: int, inp: int = 10, write: int | None = None, read: int | None = None) -> bytes:
    """A completed Anthropic stream reporting these counts (cache fields only where given)."""
    body = sse.head(MODEL, inp, cache_write_tokens=write, cache_read_tokens=read)
    return body + b"".join(sse.delta(p) for p in sse.pieces(text)) + sse.tail("end_turn", output)


def chat(text: str, prompt: int, cached: int | None, completion: int) -> bytes:
    """A chat-completions stream whose last chunk reports usage, with `cached_tokens` where given."""
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o-mini", "choices": [c]}
        for c in (
            {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": "stop"},
        )
    ] + [{"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o-mini", "choices": [], "usage": usage}]
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


# ---------------------------------------------------------------- one call: the counts as the SDK reads them


async def test_each_provider_call_keeps_the_input_and_cache_counts_it_was_given():
    server = ProviderServer()
    await server.start()
    try:
        # Anthropic: message_start's usage, then message_delta's cumulative counts over it.
        delta = sse.event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 7, "input_tokens": 12, "cache_read_input_tokens": 2048},
            },
        )
        server.enqueue(
            [
                Call(
                    sse=sse.head(MODEL, 11, cache_write_tokens=300, cache_read_tokens=2000) + sse.delta("Hi.") + delta,
                    usage_as_recorded=True,
                ),
                Call(sse=sse.stream("No cache fields.", "end_turn", 4), usage_as_recorded=True),
            ]
        )
        client = make_client(server.url, "k")
        try:
            request = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
            got = [await stream_once(client, request, ListSink()) for _ in range(2)]
        finally:
            await client.close()
        counts = [(e.input_tokens, e.cache_write_tokens, e.cache_read_tokens, e.output_tokens) for e in got]
        assert counts == [(12, 300, 2048, 7), (10, None, None, 4)]
        assert server.usage[0] == {
            "input_tokens": 12,
            "cache_creation_input_tokens": 300,
            "cache_read_input_tokens": 2048,
            "output_tokens": 7,
        }

        # Chat completions: prompt_tokens counts the cached ones; they are cache reads, the rest input.
        server.enqueue([Call(sse=chat("Hi.", 900, 512, 20)), Call(sse=chat("Hi.", 40, None, 3))])
        oclient = make_openai_client(server.url + "/v1", "k")
        try:
            request = {"model": "gpt-4o-mini", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
            got = [await openai_stream_once(oclient, request, ListSink()) for _ in range(2)]
        finally:
            await oclient.close()
        counts = [(e.input_tokens, e.cache_write_tokens, e.cache_read_tokens, e.output_tokens) for e in got]
        assert counts == [(388, None, 512, 20), (40, None, None, 3)]
    finally:
        await server.stop()


# ---------------------------------------------------------------- residents usage and /usage


def reported(usages: list[dict[str, int]]) -> dict[str, int]:
    """What the provider reported, in the ledger's columns' meaning (a chat prompt counts its cached tokens)."""
    out = dict.fromkeys(("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens"), 0)
    for u in usages:
        cached = u.get("cached_tokens", 0)
        out["input_tokens"] += u.get("input_tokens", 0) + u.get("prompt_tokens", 0) - cached
        out["cache_write_tokens"] += u.get("cache_creation_input_tokens", 0)
        out["cache_read_tokens"] += u.get("cache_read_input_tokens", 0) + cached
        out["output_tokens"] += u.get("output_tokens", 0) + u.get("completion_tokens", 0)
    return out


def usage_json(cwd: Path, db: Path, *args: str) -> dict[str, Any]:
    done = run_residents("usage", "--db", str(db), "--json", *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def sums(row: dict[str, Any]) -> dict[str, int]:
    return {k: row[k] or 0 for k in ("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens")}


async def test_residents_usage_sums_exactly_what_the_provider_reported(tmp_path):
    lumen_server = ProviderServer()
    await lumen_server.start()
    lumen_server.enqueue([Call(sse=chat("Lumen's answer.", 900, 512, 20))])
    calls = [
        # cairn in #general: a stream cut after message_start (input counted, no output count), an HTTP 529
        # (no counts at all), then a reply that writes the cache
        Call(sse=sse.head(MODEL, 700) + sse.delta("set aside ") + sse.error(), usage_as_recorded=True),
        Call(status=529),
        Call(sse=reply("Cairn's first answer.", 40, inp=1500, write=1200, read=0), usage_as_recorded=True),
        # cairn in #second: a reply that reads it
        Call(sse=reply("Cairn's second answer.", 25, inp=30, write=0, read=1200), usage_as_recorded=True),
    ]
    cairn = res("cairn", discord={"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general", "second"]})
    lumen = res(
        "lumen",
        model="gpt-4o-mini",
        max_tokens=1024,
        provider="openai-compatible",
        base_url=lumen_server.url + "/v1",
        api_key_env="LUMEN_TEST_KEY",
    )
    try:
        async with deployed(
            tmp_path, [cairn, lumen], calls=calls, channels=("general", "second"), env={"LUMEN_TEST_KEY": "k"}
        ) as d:
            d.room.post("general", "alice", "first, @cairn?", mentions=["cairn"])
            await d.wait_bot_messages(1)
            d.room.post("second", "alice", "second, @cairn?", mentions=["cairn"])
            await d.wait_bot_messages(1, channel="second")
            d.room.post("general", "bob", "and @lumen?", mentions=["lumen"])
            await d.wait_bot_messages(2)
            await d.quiet(0.2)
            assert len(d.provider.requests) == 4 and len(d.provider.usage) == 3  # (the 529 reported nothing)
            assert len(lumen_server.usage) == 1
            cairn_said, lumen_said = reported(d.provider.usage), reported(lumen_server.usage)
            general, second = (str(d.room.state.channel_by_ref(c).id) for c in ("general", "second"))

            # /usage: answered to a moderator, in the channels they moderate, named as they see them
            out = await d.command("mo", "usage", opts(by="channel"))
            [answer] = out["responses"]
            assert answer["ephemeral"] and "cost (estimate)" in answer["content"], answer
            assert "#general" in answer["content"] and "#second" in answer["content"]
            assert f"{cairn_said['cache_read_tokens'] + lumen_said['cache_read_tokens']:,}" in answer["content"]
            assert "Costs are estimates" in answer["content"]
            out = await d.command("mo", "usage", opts(since="last week"))
            assert out["responses"][0]["content"].startswith("since: 'last week' is not a date"), out
            # ... and refused to anyone else, with nothing read
            out = await d.command("eve", "usage", moderator=False)
            assert [r["content"] for r in out["responses"]] == ["This command needs the Manage Messages permission."]
    finally:
        await lumen_server.stop()

    db = tmp_path / "ledger.db"
    both = {k: cairn_said[k] + lumen_said[k] for k in cairn_said}
    assert both == {"input_tokens": 1500 + 30 + 700 + 388, "cache_write_tokens": 1200, "cache_read_tokens": 1712,
                    "output_tokens": 85}  # fmt: skip
    by_residence = usage_json(tmp_path, db)
    rows = {r["residence"]: r for r in by_residence["rows"]}
    assert sums(rows["cairn"]) == cairn_said and sums(rows["lumen"]) == lumen_said
    assert sums(by_residence["total"]) == both
    # every attempt is counted: the cut stream and the 529 gave no output count, and say so
    assert (rows["cairn"]["attempts"], rows["cairn"]["attempts_without_counts"]) == (4, 2)
    # priced at the table's list prices, marked as an estimate; a model with no price is named, not guessed
    assert rows["cairn"]["estimated_cost_usd"] == pytest.approx((2230 * 15 + 1200 * 18.75 + 1200 * 1.5 + 65 * 75) / 1e6)
    assert rows["lumen"]["estimated_cost_usd"] is None and rows["lumen"]["unpriced_models"] == ["gpt-4o-mini"]
    assert by_residence["cost_is_estimate"] is True and by_residence["total"]["estimated_cost_usd"] is None

    by_channel = {r["channel"]: sums(r) for r in usage_json(tmp_path, db, "--by", "channel")["rows"]}
    assert by_channel == {
        second: reported(d.provider.usage[2:]),
        general: {k: reported(d.provider.usage[:2])[k] + lumen_said[k] for k in both},
    }
    today = dt.datetime.now(dt.UTC).date()
    by_day = usage_json(tmp_path, db, "--by", "day")["rows"]
    assert [(r["day"], sums(r)) for r in by_day] == [(today.isoformat(), both)]
    assert sums(usage_json(tmp_path, db, "--since", today.isoformat())["total"]) == both
    later = usage_json(tmp_path, db, "--since", (today + dt.timedelta(days=1)).isoformat())
    assert later["rows"] == [] and later["total"]["attempts"] == 0

    table = run_residents("usage", "--db", str(db), cwd=tmp_path)
    assert table.returncode == 0 and b"cost (estimate)" in table.stdout and b"Costs are estimates" in table.stdout
    bad = run_residents("usage", "--db", str(db), "--since", "last week", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == b""
    assert bad.stderr.decode().splitlines() == [
        "residents: --since: 'last week' is not a date: write YYYY-MM-DD (a UTC day) or YYYY-MM-DDTHH:MM (UTC"
        " unless an offset is given)"
    ]
    async with Ledger.open(db) as lg:
        assert await verify(lg, unsettled_as_violations=True) == []


# ---------------------------------------------------------------- the counts in the chain


def replayed(location: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["replay", str(ROOT / "scenarios" / "retry.yaml"), "--db", location, "--json"]) == 0
    capsys.readouterr()
    return location


def sql(db: Path, statement: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute(statement, params).fetchall()
        con.commit()
        return rows
    finally:
        con.close()


def verify_lines(capsys: pytest.CaptureFixture[str], db: str) -> tuple[int, list[str]]:
    code = cli.main(["ledger", "verify", "--db", db])
    return code, capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("column", ["input_tokens", "cache_write_tokens", "cache_read_tokens"])
def test_editing_a_recorded_count_makes_verify_name_the_attempts_entry(backend: Backend, capsys, column):
    db = replayed(backend.location, capsys)
    assert verify_lines(capsys, db)[0] == 0
    [(aid, before)] = backend.rows(f"SELECT id, {column} FROM attempts WHERE input_tokens IS NOT NULL LIMIT 1")
    backend.change(f"UPDATE attempts SET {column} = 5 WHERE id = $1", aid)
    [(seq,)] = backend.rows("SELECT max(seq) FROM chain WHERE kind='attempt' AND record=$1", aid)
    code, out = verify_lines(capsys, db)
    was = "null" if before is None else before
    assert code == 1 and out[0] == (
        f"chain entry {seq} (attempt {aid}): the ledger no longer matches it: {column} (entry {was}, ledger 5)"
    ), out


async def before_m045(location: str) -> Connection:
    """A ledger as a residents before m045 left it: a file by its steps, a database by its baseline alone."""
    first = [name for name, _ in migrations.MIGRATIONS].index("m045_usage_budgets")
    db = await (postgres.connect(location) if is_pg(location) else Connection.open(location))
    saved = list(migrations.MIGRATIONS)
    try:
        migrations.MIGRATIONS[:] = saved[:first]
        await migrations.apply(db)
    finally:
        migrations.MIGRATIONS[:] = saved
    return db


async def test_a_ledger_from_before_m045_verifies_and_its_counts_are_held_by_the_chain(backend: Backend):
    """An old ledger's attempts have no counts: migrated, its chain (begun from those records) verifies, its
    attempts' entries state no count, and a count written into an old attempt afterwards is named."""
    path = backend.location
    db = await before_m045(path)
    try:
        for statement, params in [
            (
                "INSERT INTO generations (id, residence, channel, model, status, stop_reason, text, chars,"
                " output_tokens, standing, continuation_ended, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)",
                ("g-old000000001", "cairn", "room", MODEL, "completed", "end_turn", b"Hi.", 3, 2, "none",
                 "not-needed", 1.0),
            ),
            (
                "INSERT INTO attempts (id, generation_id, segment, idx, outcome, stop_reason, text, chars,"
                " output_tokens, started_at, ended_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)",
                ("a-old000000001", "g-old000000001", 1, 1, "completed", "end_turn", b"Hi.", 3, 2, 1.0, 2.0),
            ),
            (
                "INSERT INTO segments (generation_id, idx, attempt_id, stop_reason, chars, output_tokens)"
                " VALUES ($1,$2,$3,$4,$5,$6)",
                ("g-old000000001", 1, "a-old000000001", "end_turn", 3, 2),
            ),
            (
                "INSERT INTO posts (id, generation_id, seq, kind, content, channel, reason) VALUES ($1,$2,$3,$4,$5,$6,$7)",
                ("p-old000000001", "g-old000000001", 1, "speech", b"Hi.", "room", "text"),
            ),
        ]:  # fmt: skip
            await db.execute(statement, params)
    finally:
        await db.close()
    async with Ledger.open(path) as lg:
        assert await verify(lg) == []
        entry = await views.latest(lg.db, "attempt", "a-old000000001")
        assert entry is not None and "tokens" not in entry.body.replace("output_tokens", "")
    await asyncio.to_thread(backend.change, "UPDATE attempts SET cache_read_tokens = 900 WHERE id = 'a-old000000001'")
    async with Ledger.open(path, read_only=True) as lg:
        out = await verify(lg)
    assert out and out[0].endswith(
        "(attempt a-old000000001): the ledger no longer matches it: cache_read_tokens (entry null, ledger 900)"
    ), out


# ---------------------------------------------------------------- budgets


def budget_residence(**budgets: Any) -> Any:
    return res("cairn", policy={"budgets": budgets, "floor": {"cooldown_seconds": 0, "reply_to": "mentions"}})


async def refusals_in(d: Any, n: int) -> list[tuple]:
    """Wait until `n` refusals are recorded; returns them (scope, tokens, budget, spent, person, post_id)."""
    query = "SELECT scope, tokens, budget, spent, person, post_id FROM budget_refusals ORDER BY created_at, rowid"
    await eventually(lambda: len(db_rows(d.db, query)) >= n, timeout=10)
    return db_rows(d.db, query)


async def test_a_persons_budget_refuses_only_that_persons_mentions(tmp_path):
    def answer(body: dict[str, Any]) -> Call:
        return Call(sse=reply("An answer.", 60))

    async with deployed(tmp_path, [budget_residence(per_person={"daily_output_tokens": 50})], responder=answer) as d:
        d.room.post("general", "alice", "one, @cairn?", mentions=["cairn"])
        await d.wait_bot_messages(1)
        d.room.post("general", "alice", "two, @cairn?", mentions=["cairn"])
        notice = await d.wait_receipt()
        assert notice["content"] == "-# Daily output budget per person of 50 tokens reached; no reply was generated."
        d.room.post("general", "bob", "three, @cairn?", mentions=["cairn"])
        await d.wait_bot_messages(3)
        await d.quiet(0.2)
        assert len(d.provider.requests) == 2  # alice's first and bob's: none for alice's second
        alice = str(d.room.state.user_by_name("alice").id)
        [(scope, tokens, budget, spent, person, post)] = await refusals_in(d, 1)
        assert (scope, tokens, budget, spent, person) == ("person", "output", 50, 60, alice) and post is not None
        gens = await d.generations()
        assert [g.person for g in gens] == [alice, str(d.room.state.user_by_name("bob").id)]
    db = tmp_path / "ledger.db"
    async with Ledger.open(db) as lg:
        assert await verify(lg, unsettled_as_violations=True) == []
    # the refusal is in the chain: an edit of what it counted is named
    [(rid,)] = sql(db, "SELECT id FROM budget_refusals")
    [(seq,)] = sql(db, "SELECT max(seq) FROM chain WHERE kind='budget-refusal' AND record=?", (rid,))
    sql(db, "UPDATE budget_refusals SET spent = 10")
    async with Ledger.open(db) as lg:
        assert await verify(lg) == [
            f"chain entry {seq} (budget-refusal {rid}): the ledger no longer matches it: spent (entry 60, ledger 10)"
        ]
    sql(db, "UPDATE budget_refusals SET spent = 60")
    # a budget's notice stands for a recorded refusal, and only it may say a budget was reached
    sql(db, "UPDATE budget_refusals SET post_id = NULL")
    refusal_edited = f"chain entry {seq} (budget-refusal {rid}): the ledger no longer matches it: post_id"
    async with Ledger.open(db) as lg:
        edited, *rest = await verify(lg)
    assert edited.startswith(refusal_edited) and rest == [
        f"post {post}: a notice of a spent budget that no refusal records"
    ]
    sql(db, "UPDATE budget_refusals SET post_id = 'p-made-up'")
    async with Ledger.open(db) as lg:
        edited, *rest = await verify(lg)
    assert edited.startswith(refusal_edited) and rest == [
        f"post {post}: a notice of a spent budget that no refusal records",
        "post p-made-up: named by a refusal of a spent budget, but no notice of no generation has that id",
    ]


def write_config(base: Path, budgets: str) -> None:
    (base / "policies").mkdir()
    (base / "residences").mkdir()
    (base / "policies" / "budget.yaml").write_text(
        "retries:\n  max_attempts: 1\nfloor:\n  cooldown_seconds: 0\n  reply_to: mentions\n" + budgets
    )
    (base / "residences" / "cairn.yaml").write_text(
        f"name: cairn\nmodel: {MODEL}\nmax_tokens: 1024\nsystem: You are Cairn.\npolicy: budget\n"
        "discord:\n  token_env: CAIRN_DISCORD_TOKEN\n  channels: [general]\n"
    )


async def test_a_spent_budget_makes_no_provider_call_and_tells_the_channel_once_a_day_across_a_restart(tmp_path):
    write_config(tmp_path, "budgets:\n  daily_output_tokens: 50\n")
    provider = ProviderServer(lambda body: Call(sse=reply("Cairn answers.", 60)))
    await provider.start()
    db = tmp_path / "ledger.db"
    refused = "SELECT trigger, post_id FROM budget_refusals ORDER BY created_at, rowid"
    try:
        async with running_room(["general"]) as room:
            proc = Process(tmp_path, room.url, provider.url, db, "--log-level", "info")

            def cairn() -> list[str]:
                return [m["content"] for m in room.messages("general") if m["author"] == "cairn"]

            async def refusals(n: int) -> list[tuple]:
                await eventually(lambda: len(db_rows(db, refused)) >= n, timeout=20)
                return db_rows(db, refused)

            try:
                await proc.start()
                await connected(room, proc, 0)
                room.post("general", "alice", "one, @cairn?", mentions=["cairn"])
                await room.wait_until(lambda: cairn() or None, timeout=20)
                second = room.post("general", "alice", "two, @cairn?", mentions=["cairn"])
                await refusals(1)
                third = room.post("general", "bob", "three, @cairn?", mentions=["cairn"])
                await refusals(2)
                await proc.stop()
                identifies = room.gateway.identifies
                await proc.start()
                await connected(room, proc, identifies)
                # the restarted process catches up on mentions made since its last reply: refused ones were handled
                await eventually(lambda: "cairn caught up in #general" in proc.log.read_text(), timeout=20)
                fourth = room.post("general", "alice", "four, @cairn?", mentions=["cairn"])
                got = await refusals(3)
                await asyncio.sleep(0.5)  # anything more would come now
                notice = "-# Daily output budget of 50 tokens reached; no reply was generated."
                assert cairn() == ["Cairn answers.", notice], proc.output()
                assert len(provider.requests) == 1  # only the first mention reached the provider
                # each refused mention recorded once (none caught up again after the restart), one notice
                assert [t for t, _ in got] == [second["id"], third["id"], fourth["id"]], got
                assert [p is not None for _, p in got] == [True, False, False]
                assert await proc.stop() == 0, proc.output()
                assert proc.tracebacks() == [], proc.output()
            finally:
                if proc.proc is not None and proc.proc.returncode is None:
                    proc.proc.kill()
                    await proc.proc.wait()
    finally:
        await provider.stop()
    done = run_residents("ledger", "verify", "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "budgets,line",
    [
        ("budgets:\n  daily_output_tokens: lots\n", "7: budgets.daily_output_tokens: Input should be a valid integer (got 'lots')"),
        ("budgets:\n  daily_input_tokens: -1\n", "7: budgets.daily_input_tokens: Input should be greater than or equal to 0 (got -1)"),
        ("budgets:\n  per_person:\n    daily_output_token: 5\n", "8: budgets.per_person.daily_output_token: unknown key (did you mean daily_output_tokens?)"),
    ],
)  # fmt: skip
def test_check_names_a_bad_budget_its_key_and_its_line(tmp_path, budgets, line):
    write_config(tmp_path, budgets)
    done = run_residents("check", cwd=tmp_path)
    said = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 2 and f"{tmp_path / 'policies' / 'budget.yaml'}:{line}" in said, said


async def test_a_budget_is_of_the_utc_day_and_counts_input_with_the_cache(backend: Backend, pipeline):
    """Spent is what the provider counted today (input with cache writes and reads); tomorrow starts at none."""
    await pipeline.turn(
        pipeline.resident(residence()),
        Room(),
        "Hello.",
        [Call(sse=reply("Hi.", 9, inp=100, write=50, read=25), usage_as_recorded=True)],
    )
    now = time.time()
    b = Budgets(daily_input_tokens=175, daily_output_tokens=10)
    assert await budgets.reached(pipeline.ledger, "cairn", b, None, now) == budgets.Reached(
        "residence", "input", 175, 175
    )
    b = Budgets(daily_input_tokens=176, daily_output_tokens=9)
    assert await budgets.reached(pipeline.ledger, "cairn", b, None, now) == budgets.Reached("residence", "output", 9, 9)
    assert await budgets.reached(pipeline.ledger, "cairn", b, None, budgets.utc_day(now)[1] + 86_400) is None
    assert await budgets.reached(pipeline.ledger, "sill", b, None, now) is None  # another residence's own day
