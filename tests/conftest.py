"""Shared fixtures: the real pipeline on loopback (local provider server + real SDK + real SQLite).

Any error logged by a background task, or left unretrieved on the loop, fails the test that caused it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import hypothesis.configuration
import pgkit
import pytest
from ledgerkit import BACKENDS, Backend

from residents.config import Residence, build_residence
from residents.context import RoomMessage
from residents.delivery.outbox import NO_BACKOFF, Outbox
from residents.delivery.resume import Seen
from residents.generation.attempts import AttemptRunner
from residents.generation.run import Generator
from residents.ledger import Ledger
from residents.localservers.provider import Call, ProviderServer
from residents.provider.anthropic_messages import AnthropicProvider, make_client
from residents.records import Post
from residents.resident import Resident

ROOT = Path(__file__).resolve().parent.parent
SPECIMENS = ROOT / "scenarios" / "specimens"

# pytest's and hypothesis's caches go under the system's temporary folder, one per checkout, never
# beside the code: pytest reads `cache_dir = "$RESIDENTS_TEST_CACHE/pytest"` (pyproject.toml) after
# this module is imported, and hypothesis keeps its example database under the folder set here.
CACHE = Path(tempfile.gettempdir()) / f"residents-tests-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
os.environ.setdefault("RESIDENTS_TEST_CACHE", str(CACHE))
hypothesis.configuration.set_hypothesis_home_dir(Path(os.environ["RESIDENTS_TEST_CACHE"]) / "hypothesis")


def specimen(name: str) -> bytes:
    return (SPECIMENS / name).read_bytes()


def residence(**overrides) -> Residence:
    data = {
        "name": "cairn",
        "model": "claude-3-opus-20240229",
        "max_tokens": 4096,
        "system": "You are Cairn, a resident of this room.",
        "policy": {"retries": {"max_attempts": 3, "backoff_seconds": 0}},
    }
    policy = overrides.pop("policy", None)
    data.update(overrides)
    if policy is not None:
        data["policy"] = policy
    return build_residence(data, "<test>", None, ROOT)


_message_ids = itertools.count(1)


def next_message_id() -> str:
    """A message id no other room of this test run has used, as Discord's are unique: a ledger holds one
    reply per (resident, trigger message), so rooms sharing a ledger must not reuse ids."""
    return f"m{next(_message_ids)}"


class Room:
    """A room that collects posts, as replay's does, and keeps the history later turns read."""

    def __init__(self, name: str = "cairn") -> None:
        self.name = name
        self.history: list[RoomMessage] = []
        self.sent: list[Post] = []

    def say(self, author: str, content: str) -> RoomMessage:
        m = RoomMessage(next_message_id(), author, False, content)
        self.history.append(m)
        return m

    async def send(self, post: Post) -> str:
        mid = next_message_id()
        self.history.append(RoomMessage(mid, self.name, True, post.content))
        self.sent.append(post)
        return mid

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        """What the outbox reads before sending a post again after a failure: the resident's messages."""
        ids = [m.id for m in self.history]
        start = ids.index(after_id) + 1 if after_id in ids else 0
        return [Seen(m.id, m.content) for m in self.history[start:] if m.is_self]


class Pipeline:
    def __init__(self, server: ProviderServer, ledger: Ledger, sleeps: list[float]) -> None:
        self.server, self.ledger, self.sleeps = server, ledger, sleeps
        self.client = make_client(server.url, "test-key", timeout=5)

    def resident(self, res: Residence, room: Room | None = None) -> Resident:
        """A resident delivering through an outbox of its own with no backoff, to `room` (or to the room
        `turn` is given: registered there)."""

        async def fake_sleep(s: float) -> None:
            self.sleeps.append(s)

        outbox = Outbox(self.ledger, NO_BACKOFF)
        if room is not None:
            outbox.register(res.name, room)
        return Resident(
            res,
            Generator(AttemptRunner(AnthropicProvider(self.client), self.ledger, sleep=fake_sleep)),
            self.ledger,
            outbox,
        )

    async def turn(self, res: Resident, room: Room, content: str, calls: list[Call], author: str = "alice"):
        res.outbox.register(res.name, room)
        self.server.reset(calls)
        m = room.say(author, content)
        before = len(room.sent)
        reply = await res.respond(room, "room", list(room.history), trigger=m.id)
        return reply, room.sent[before:]


@pytest.fixture
async def pipeline(request, tmp_path):
    """The real pipeline on a ledger in tmp_path; a test that asks for `backend` too gets it on that ledger."""
    server = ProviderServer()
    await server.start()
    where = request.getfixturevalue("backend").location if "backend" in request.fixturenames else tmp_path / "ledger.db"
    ledger = await Ledger.open(where)
    p = Pipeline(server, ledger, [])
    try:
        yield p
    finally:
        await p.client.close()
        await ledger.close()
        await server.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgkit.Server]:
    """One real PostgreSQL server for the session, started when a test first asks for it: fails (never
    skips) where none can be started."""
    with pgkit.server() as server:
        yield server


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The test's ledger on each backend in turn (`ledgerkit`): a file in tmp_path, or a fresh database."""
    if request.param == "sqlite":
        names = itertools.count(2)
        return Backend("sqlite", str(tmp_path / "ledger.db"), lambda: str(tmp_path / f"ledger-{next(names)}.db"))
    server: pgkit.Server = request.getfixturevalue("pg_server")
    return Backend("postgresql", server.create(), server.create)


class _ErrorCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def expected_errors() -> list[str]:
    """Substrings of ERROR lines a test provokes on purpose (and asserts itself); any other still fails it."""
    return []


def _peer_hung_up(record: logging.LogRecord) -> bool:
    """The local room's aiohttp server logging a client that closed its socket while being answered (a bot
    process stopped or killed mid-handshake): the client's leaving, not a fault of the room's."""
    error = record.exc_info[1] if record.exc_info else None
    return record.name == "aiohttp.server" and isinstance(error, ConnectionResetError)


@pytest.fixture(autouse=True)
async def fail_on_background_errors(expected_errors):
    """Errors that asyncio or discord.py only log (background tasks) must fail the test."""
    catcher = _ErrorCatcher()
    watched = [logging.getLogger(n) for n in ("asyncio", "discord", "aiohttp", "residents")]
    for lg in watched:
        lg.addHandler(catcher)
    loop = asyncio.get_running_loop()
    seen: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    yield
    loop.set_exception_handler(previous)
    for lg in watched:
        lg.removeHandler(catcher)
    problems = [
        f"{r.name}: {r.getMessage()}"
        for r in catcher.records
        if not any(e in r.getMessage() for e in expected_errors) and not _peer_hung_up(r)
    ] + [str(c.get("message")) + " " + repr(c.get("exception")) for c in seen]
    assert not problems, "errors in background tasks or logs:\n" + "\n".join(problems)


# ------------------------------------------------------------------ the source tree stays as the tests found it

# What git, pip and Python keep beside the code: not the tests' own output. pytest's and hypothesis's
# caches are not among them: they go to a temporary folder (above), and one in the tree fails the run.
_TOOLING = {".git", ".venv", "venv", "__pycache__", "build", "node_modules", ".mypy_cache", ".ruff_cache"}


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` outside the tooling folders: path -> (size, mtime in ns)."""
    out: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _TOOLING and not d.endswith(".egg-info")]
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_TREE] = _tree(ROOT)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests write into temporary folders only: a file they added to or changed in the source tree fails the run.

    docs/demo.png changes only when asked for (RESIDENTS_UPDATE_SCREENSHOT=1, see test_browser.py).
    """
    before = session.config.stash.get(_TREE, None)
    if before is None:
        return
    after = _tree(ROOT)
    asked = {os.path.join("docs", "demo.png")} if os.environ.get("RESIDENTS_UPDATE_SCREENSHOT") == "1" else set()
    written = sorted(p for p, st in after.items() if before.get(p) != st and p not in asked)
    if written:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "tests wrote into the source tree (use tmp_path): " + ", ".join(written[:20])
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TREE = pytest.StashKey[dict[str, tuple[int, int]]]()


# Modules whose tests run whole processes end to end: real discord.py bots on the local room over
# sockets, `residents` subprocesses and console scripts, a browser, a built wheel, the provider fault
# matrix and config fuzzing through the whole CLI. `pytest -m "not e2e"` runs the rest, the fast tests
# of the pipeline's parts (README: "Two commands").
E2E_MODULES = frozenset(
    {
        "test_browser",
        "test_browser_guilds",
        "test_bench_scale",
        "test_caching_discord",
        "test_catch_up",
        "test_checkpoints",
        "test_chain",
        "test_cli",
        "test_commands_once",
        "test_continue_button",
        "test_crash",
        "test_demo",
        "test_discord_e2e",
        "test_reply_claims",
        "test_ledger_reconnect",
        "test_disk_full_process",
        "test_faults_provider",
        "test_flush_load",
        "test_ledger_process",
        "test_leases",
        "test_leases_start",
        "test_leases_handover",
        "test_leases_outage",
        "test_leases_continue",
        "test_memory",
        "test_fuzz_config",
        "test_discord_text",
        "test_faults_discord",
        "test_live",
        "test_load",
        "test_localroom",
        "test_metrics_process",
        "test_moderation",
        "test_openai_run",
        "test_packaging",
        "test_provenance",
        "test_provider_key",
        "test_refused_posts",
        "test_room_input",
        "test_room_buttons",
        "test_room_layout",
        "test_room_shards",
        "test_room_uploads",
        "test_run_start",
        "test_shards",
        "test_tooling",
        "test_usage",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in E2E_MODULES:
            item.add_marker(pytest.mark.e2e)
