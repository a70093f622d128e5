"""Security promises: the ledger is its owner's alone, secrets never reach logs, SQL is parameterised.

Stumps may hold text a room never saw, so the ledger file (and SQLite's side files) must not be
readable by others whatever the umask; an API key or a bot token must not appear in any log line,
error, output or ledger row even at DEBUG; and text from outside (channel names, ids, causes,
residence filters) must travel as SQL parameters, never as SQL.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from residents import cli
from residents.config import build_residence
from residents.delivery.outbox import Outbox
from residents.generation.attempts import AttemptRunner
from residents.generation.run import Generator
from residents.ledger import Ledger
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider.anthropic_messages import AnthropicProvider, make_client
from residents.records import Attempt, Generation, Post, Stump
from residents.replay.run import CollectingRoom
from residents.resident import Resident

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-ant-api03-Zq7TESTKEY-do-not-log-9f3b1c"
BOT_TOKEN = "MTE5TESTTOKEN.GhXyZ.do-not-log-7a2c"
EVIL = "x'; DROP TABLE generations; --\" ) OR 1=1 /* \\"
TABLES = ("generations", "attempts", "attempt_chunks", "segments", "stumps", "posts", "_migrations")


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: the ledger's mode must not depend on the caller's."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ---------------------------------------------------------------- the ledger file's mode


async def test_ledger_file_is_created_owner_only(tmp_path: Path, open_umask: None) -> None:
    db = tmp_path / "nested" / "ledger.db"
    ledger = await Ledger.open(db)
    try:
        g = Generation(id="g-mode", residence="cairn", channel="c", model="m")
        await ledger.create_generation(g)  # a write, so the WAL and its index exist
        assert _mode(db) == 0o600
        for side in (Path(f"{db}-wal"), Path(f"{db}-shm")):
            if side.exists():
                assert _mode(side) & 0o077 == 0, f"{side.name} is readable by others: {oct(_mode(side))}"
    finally:
        await ledger.close()
    assert _mode(db) == 0o600


def test_replay_db_is_created_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], open_umask: None
) -> None:
    monkeypatch.chdir(tmp_path)
    scenario = _scenario(tmp_path)
    assert cli.main(["replay", str(scenario), "--json", "--db", "out/ledger.db"]) == 0
    capsys.readouterr()
    assert _mode(tmp_path / "out" / "ledger.db") == 0o600


# ---------------------------------------------------------------- secrets never logged


def _scenario(tmp_path: Path) -> Path:
    (tmp_path / "cut.sse").write_bytes(sse.stream("Rivers run long. " * 40, "max_tokens", 4096))
    (tmp_path / "frag.sse").write_bytes(sse.head("claude-3-opus-20240229") + sse.delta("A fragment"))
    doc = {
        "residence": {
            "name": "cairn",
            "model": "claude-3-opus-20240229",
            "max_tokens": 4096,
            "discord": {"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general"]},
            "policy": {"retries": {"max_attempts": 3, "backoff_seconds": 0}},
        },
        "turns": [
            {
                "say": {"author": "alice", "content": "Rivers?"},
                "calls": [
                    {"status": 401},
                ],
            },
            {
                "say": {"author": "alice", "content": "Again?"},
                "calls": [
                    {"sse": "frag.sse", "end": "drop"},
                    {"status": 529, "headers": {"retry-after": "0"}},
                    {"sse": "cut.sse"},
                ],
            },
        ],
    }
    p = tmp_path / "scenario.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _assert_absent(where: str, text: str | bytes) -> None:
    for secret in (API_KEY, BOT_TOKEN):
        needle = secret.encode() if isinstance(text, bytes) else secret
        assert needle not in text, f"a secret appears in {where}"
        part = secret[-12:].encode() if isinstance(text, bytes) else secret[-12:]
        assert part not in text, f"part of a secret appears in {where}"


def test_replay_at_debug_logs_no_key_or_token(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Even with the key and the bot token in the environment and every logger at DEBUG."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    monkeypatch.setenv("CAIRN_DISCORD_TOKEN", BOT_TOKEN)
    caplog.set_level(logging.DEBUG)
    scenario = _scenario(tmp_path)
    for argv in (
        ["-vv", "replay", str(scenario), "--json", "--db", "l.db"],
        ["-vv", "replay", str(scenario)],
        ["-vv", "check", str(scenario)],
        ["-vv", "ledger", "list", "--db", "l.db"],
        ["-vv", "ledger", "stumps", "--db", "l.db", "--json"],
    ):
        assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert caplog.records, "DEBUG logging did not reach the capture"
    _assert_absent("logs", "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records))
    _assert_absent("stdout", out)
    _assert_absent("stderr", err)
    for f in tmp_path.iterdir():
        if f.is_file():
            _assert_absent(f.name, f.read_bytes())


async def test_pipeline_with_a_real_key_logs_it_nowhere(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The key the SDK sends on every call (errors, retries, a stream) is in no log, error or ledger row."""
    caplog.set_level(logging.DEBUG)
    server = ProviderServer()
    await server.start()
    server.reset(
        [
            Call(status=529, headers={"retry-after": "0"}),
            Call(sse=sse.stream("Hi. " * 10), end="drop"),
            Call(sse=sse.stream("Hello there.", "end_turn", 3)),
        ]
    )
    ledger = await Ledger.open(tmp_path / "l.db")
    client = make_client(server.url, API_KEY, timeout=5)
    assert client.api_key == API_KEY  # the key is really in play
    try:
        res = build_residence(
            {
                "name": "cairn",
                "model": "claude-3-opus-20240229",
                "max_tokens": 4096,
                "policy": {"retries": {"max_attempts": 3, "backoff_seconds": 0}},
            },
            "<t>",
            None,
            ROOT,
        )
        room = CollectingRoom("cairn")
        resident = Resident(
            res,
            Generator(AttemptRunner(AnthropicProvider(client), ledger)),
            ledger,
            Outbox.of_room(ledger, "cairn", room),
        )
        m = room.say("alice", "hi")
        reply = await asyncio.wait_for(resident.respond(room, "c", list(room.history), trigger=m.id), 20)
        assert reply.generation is not None and reply.generation.status == "completed"
        server.reset([Call(status=401)])
        m = room.say("alice", "again")
        reply = await asyncio.wait_for(resident.respond(room, "c", list(room.history), trigger=m.id), 20)
        assert reply.generation is not None and reply.generation.status == "failed"
    finally:
        await client.close()
        await ledger.close()
        await server.stop()
    _assert_absent("logs", "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records))
    for f in tmp_path.iterdir():
        _assert_absent(f.name, f.read_bytes())


# ---------------------------------------------------------------- SQL is parameterised


def _tables(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert set(TABLES) <= names, f"tables lost: {set(TABLES) - names}"
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        con.close()


async def test_hostile_strings_round_trip_through_every_write_and_read(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    ledger = await Ledger.open(db)
    try:
        gid, aid, sid, pid = "g-" + EVIL, "a-" + EVIL, "s-" + EVIL, "p-" + EVIL
        g = Generation(
            id=gid,
            residence=EVIL,
            channel=EVIL,
            model=EVIL,
            trigger=EVIL,
            request={"model": EVIL, "messages": [{"role": "user", "content": EVIL}]},
        )
        await ledger.create_generation(g)
        a = Attempt(id=aid, generation_id=gid, segment=1, index=1)
        await ledger.start_attempt(a)
        await ledger.add_chunk(aid, 0, EVIL)
        assert await ledger.streamed_text(aid) == EVIL
        a.text, a.outcome, a.stop_reason, a.error, a.request_id = EVIL, "incomplete", EVIL, EVIL, EVIL
        s = Stump(
            id=sid,
            generation_id=gid,
            attempt_id=aid,
            cause=EVIL,
            text=EVIL,
            output_tokens=None,
            scope="output",
            residence=EVIL,
        )
        await ledger.finish_attempt(a, [s])
        g.status, g.stop_reason, g.text = "incomplete", EVIL, EVIL
        await ledger.finish_generation(g, [])
        post = Post(id=pid, generation_id=gid, seq=1, kind="partial", content=EVIL, channel=EVIL)
        await ledger.add_posts([post])
        await ledger.mark_delivered(post, EVIL)

        back = await ledger.get_generation(gid)
        assert back is not None and (back.residence, back.channel, back.text, back.stop_reason) == (EVIL,) * 4
        assert back.request == g.request and back.attempts[0].error == EVIL
        assert [st.cause for st in await ledger.list_stumps(residence=EVIL, cause=EVIL)] == [EVIL]
        assert await ledger.list_stumps(residence="' OR '1'='1") == []
        assert (await ledger.get_stump(sid)).text == EVIL  # type: ignore[union-attr]
        assert [r["id"] for r in await ledger.list_generations(residence=EVIL)] == [gid]
        assert await ledger.list_generations(residence="' OR 1=1 --") == []
        assert (await ledger.latest_generation(EVIL, EVIL)).id == gid  # type: ignore[union-attr]
        assert list(await ledger.posts_by_message([EVIL, "' OR 1=1 --"])) == [EVIL]
        assert list(await ledger.generations_brief([gid, "x' OR '1'='1"])) == [gid]
        assert await ledger.get_generation("' OR '1'='1") is None
        assert await ledger.get_stump("' OR '1'='1") is None
    finally:
        await ledger.close()
    counts = _tables(db)
    assert counts["generations"] == 1 and counts["stumps"] == 1 and counts["posts"] == 1


async def test_hostile_channel_and_trigger_through_the_pipeline(tmp_path: Path) -> None:
    """Room-supplied text (channel, message ids, content) reaches SQL only as parameters."""
    db = tmp_path / "l.db"
    server = ProviderServer()
    await server.start()
    server.reset([Call(sse=sse.stream("Rivers, " * 300, "max_tokens", 4096))])
    ledger = await Ledger.open(db)
    client = make_client(server.url, "k", timeout=5)
    try:
        res = build_residence(
            {"name": "cairn", "model": "claude-3-opus-20240229", "max_tokens": 4096}, "<t>", None, ROOT
        )
        room = CollectingRoom("cairn")
        resident = Resident(
            res,
            Generator(AttemptRunner(AnthropicProvider(client), ledger)),
            ledger,
            Outbox.of_room(ledger, "cairn", room),
        )
        m = room.say(EVIL, EVIL)
        reply = await asyncio.wait_for(resident.respond(room, EVIL, list(room.history), trigger=EVIL), 20)
        assert reply.generation is not None
        g = await ledger.latest_generation("cairn", EVIL)
        assert g is not None and g.trigger == EVIL and g.channel == EVIL and {p.channel for p in g.posts} == {EVIL}
        assert m.content in server.requests[0]["messages"][0]["content"]
        assert await verify(ledger) == []
    finally:
        await client.close()
        await ledger.close()
        await server.stop()
    assert _tables(db)["generations"] == 1


def test_cli_ledger_reads_take_hostile_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["replay", str(_scenario(tmp_path)), "--json", "--db", "l.db"]) == 0
    before = _tables(tmp_path / "l.db")
    assert cli.main(["ledger", "list", "--db", "l.db", "--residence", EVIL, "--json"]) == 0
    assert cli.main(["ledger", "stumps", "--db", "l.db", "--residence", EVIL, "--cause", EVIL, "--json"]) == 0
    assert cli.main(["ledger", "show", "g-" + EVIL, "--db", "l.db"]) == 2
    assert cli.main(["ledger", "show", "s-" + EVIL, "--db", "l.db"]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[-2:] == ["[]", "[]"]
    assert "Traceback" not in err
    assert _tables(tmp_path / "l.db") == before


def _quoting(expression: ast.expr) -> bool:
    """An interpolation that can only be quoted identifiers or `$n` placeholders, whatever its arguments."""
    return (
        isinstance(expression, ast.Call)
        and isinstance(expression.func, ast.Name)
        and expression.func.id in {"quoted", "identifiers", "placeholders"}
    )


def test_ledger_sql_is_static_text() -> None:
    """No SQL in the ledger is built from values: an f-string that is SQL interpolates only placeholders,
    table names from constant tuples, the migrations' own step names, or identifiers made safe by the
    functions that quote them (`copy.py` names the tables and columns it reads from the schema)."""
    verbs = ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "CREATE ", "BEGIN", "PRAGMA ")
    allowed = {"marks", "table", "order", "name", "sql", "time"}
    seen = 0
    for path in sorted((ROOT / "residents" / "ledger").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.JoinedStr) or not node.values:
                continue
            head = node.values[0]
            if not (isinstance(head, ast.Constant) and str(head.value).lstrip().upper().startswith(verbs)):
                continue
            seen += 1
            names = {
                n.id
                for v in node.values
                if isinstance(v, ast.FormattedValue) and not _quoting(v.value)
                for n in ast.walk(v.value)
                if isinstance(n, ast.Name)
            }
            assert names <= allowed, f"{path.name}:{node.lineno} builds SQL from {sorted(names - allowed)}"
    assert seen, "the check found no SQL f-strings at all: it is looking in the wrong place"
