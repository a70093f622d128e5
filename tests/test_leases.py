"""Several `residents run` processes on one PostgreSQL ledger: each bot driven by exactly one of them under a
lease, a dead process's bots taken over, a frozen one posting nothing once it runs again (starting at once,
and a sharded bot's shards spread over processes: `test_leases_start.py`).

Real parts throughout: `residents run` subprocesses (short test leases: 3 s, renewed every second), a real
PostgreSQL server (`pgkit`), discord.py against the local room over real sockets, the anthropic SDK against
the local provider server. What each process drives is read from the database's `leases` rows and from the
room's own gateway sessions (which bot, which shard, connected or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from residents import cli
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer, Responder
from residents.localservers.room import RoomServer

try:
    import pgkit
    from roomkit import error_guard, running_room
    from test_crash import Process, until
except ImportError:  # tests/ collected as a package
    from tests import pgkit
    from tests.roomkit import error_guard, running_room
    from tests.test_crash import Process, until

MODEL = "claude-3-opus-20240229"
LEASE = ("--lease-seconds", "3", "--renew-seconds", "1", "--log-level", "info")
NAMES = ("cairn", "sill", "moss", "reed")


def answer(body: dict[str, Any]) -> Call:
    return Call(sse=sse.stream("Noted.", "end_turn", 2, model=MODEL))


def write_config(
    base: Path, names: tuple[str, ...], channels: str = "[general]", shards: str = "", policy: str = ""
) -> None:
    """One configuration (each process has its own copy: its own folder for its log files); `policy`: more of
    the residents' one policy, in YAML."""
    (base / "residences").mkdir(parents=True)
    (base / "policies").mkdir()
    (base / "policies" / "quick.yaml").write_text(
        "retries:\n  max_attempts: 1\n  timeout_seconds: 60\nfloor:\n  cooldown_seconds: 0\n  reply_to: mentions\n"
        + policy
    )
    for name in names:
        (base / "residences" / f"{name}.yaml").write_text(
            f"name: {name}\nmodel: {MODEL}\nmax_tokens: 1024\nsystem: You are {name}.\npolicy: quick\n"
            f"discord:\n  token_env: {name.upper()}_DISCORD_TOKEN\n  channels: {channels}\n{shards}"
        )


class Rig:
    def __init__(self, room: RoomServer, url: str, procs: list[Process], provider: ProviderServer) -> None:
        self.room, self.url, self.procs, self.provider = room, url, procs, provider

    def rows(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        return pgkit.fetch(self.url, statement, *params)

    def holders(self) -> dict[str, int]:
        """unit → the pid of the process whose lease on it runs now."""
        return {
            str(unit): int(pid)
            for unit, pid in self.rows(
                "SELECT l.unit, p.pid FROM leases l JOIN processes p ON p.id = l.holder"
                " WHERE l.expires_at > extract(epoch from clock_timestamp())"
            )
        }

    def sessions(self) -> list[tuple[str, int | None]]:
        """(bot, shard) of every connected gateway session in the room."""
        return [
            (s["bot"], s["shard"][0] if s["shard"] else None)
            for s in self.room.snapshot()["gateway"]["sessions"]
            if s["connected"]
        ]

    def pid(self, proc: Process) -> int:
        assert proc.proc is not None
        return proc.proc.pid

    def output(self) -> str:
        return "\n".join(p.output() for p in self.procs)

    async def until(self, check: Any, timeout: float = 30.0) -> None:
        try:
            await until(self.procs[0], check, timeout=timeout, interval=0.05)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.output()}") from None

    def by(self, author: str, channel: str = "general") -> list[dict[str, Any]]:
        return [m for m in self.room.messages(channel) if m["author"] == author]

    async def first_holds_cairn_then_second_joins(self) -> tuple[Process, Process]:
        """Starts the two processes one after the other, so which one holds `cairn` is known."""
        first, second = self.procs
        await first.start()
        await self.until(lambda: self.holders() == {"cairn": self.pid(first)} and self.sessions() == [("cairn", None)])
        await second.start()
        await self.until(lambda: len(self.rows("SELECT id FROM processes WHERE stopped_at IS NULL")) == 2)
        return first, second


@contextlib.asynccontextmanager
async def rig(
    tmp_path: Path,
    pg_server: pgkit.Server,
    names: tuple[str, ...],
    processes: int = 2,
    layout: Any = None,
    channels: str = "[general]",
    shards: str = "",
    responder: Responder = answer,
    lease: tuple[str, ...] = LEASE,
    policy: str = "",
) -> AsyncIterator[Rig]:
    url = pg_server.create()
    assert await asyncio.to_thread(cli.main, ["ledger", "migrate", "--db", url]) == 0
    provider = ProviderServer(responder=responder)
    await provider.start()
    async with error_guard() as guard, running_room(["general"], layout=layout) as room:
        # A killed or frozen process's sockets vanish or stall mid-request: the room logs that, as expected.
        guard.ignore.append(lambda p: "aiohttp" in p and "Error handling request" in p)
        procs = []
        for i in range(processes):
            folder = tmp_path / f"p{i}"
            write_config(folder, names, channels, shards, policy)
            procs.append(Process(folder, room.url, provider.url, url, *lease))
        r = Rig(room, url, procs, provider)
        try:
            yield r
            for p in procs:
                if p.proc is not None and p.proc.returncode is None:
                    assert await p.stop() == 0, r.output()
            for p in procs:
                assert p.tracebacks() == [], r.output()
        finally:
            for p in procs:
                if p.proc is not None and p.proc.returncode is None:
                    p.proc.kill()
                    await p.proc.wait()
            await provider.stop()
    assert await asyncio.to_thread(cli.main, ["ledger", "verify", "--db", url]) == 0


async def mention(r: Rig, name: str, text: str, channel: str = "general") -> None:
    """A person mentions `name`; returns once exactly one reply of it to this is in the room."""
    before = len(r.by(name, channel))
    r.room.post(channel, "alice", f"{text}, @{name}", mentions=[name])
    await r.until(lambda: len(r.by(name, channel)) > before)


async def status(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`residents status --json` on the ledger: who runs, and what each holds."""
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["status", "--db", url, "--json"]) == 0
    got: dict[str, Any] = json.loads(capsys.readouterr().out)
    return got


def held(got: dict[str, Any]) -> dict[int, list[str]]:
    """pid → the units it holds, for every live process `status` lists."""
    return {p["pid"]: sorted(u["unit"] for u in p["units"]) for p in got["processes"] if p["alive"]}


async def test_two_processes_share_four_residents_and_the_survivor_takes_over_a_killed_ones(
    tmp_path: Path, pg_server: pgkit.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    async with rig(tmp_path, pg_server, NAMES) as r:
        one, two = r.procs
        await one.start()
        await two.start()
        pids = {r.pid(one), r.pid(two)}

        def shared() -> bool:
            held = r.holders()
            return (
                len(held) == 4
                and sorted(list(held.values()).count(p) for p in pids) == [2, 2]
                and sorted(r.sessions()) == sorted((n, None) for n in NAMES)
            )

        await r.until(shared)
        # Each says who it runs once what it took at start is ready (or given up to the other meanwhile).
        await r.until(lambda: all("residents run: " in p.output() for p in r.procs))
        # Beside them, a writer of another kind is refused, naming one of them.
        assert await asyncio.to_thread(cli.main, ["ledger", "migrate", "--db", r.url]) == 2
        refused = capsys.readouterr().err
        assert any(f"in use by process {pid} on " in refused for pid in pids), refused
        listed = held(await status(r.url, capsys))
        assert sorted(listed) == sorted(pids) and sorted(sum(listed.values(), [])) == sorted(NAMES)
        assert {pid: sorted(n for n, p in r.holders().items() if p == pid) for pid in pids} == listed
        for name in NAMES:
            await mention(r, name, "Good morning")
        gens = r.rows("SELECT residence, count(*) FROM generations GROUP BY residence")
        assert sorted(gens) == sorted((n, 1) for n in NAMES)

        # SIGKILL the process holding sill's lease: the other takes its two bots over, well within 30 s.
        victim = one if r.holders()["sill"] == r.pid(one) else two
        survivor = two if victim is one else one
        orphans = sorted(n for n, p in r.holders().items() if p == r.pid(victim))
        killed = time.monotonic()
        await victim.kill()
        await r.until(
            lambda: (
                set(r.holders().values()) == {r.pid(survivor)}
                and len(r.holders()) == 4
                and sorted(r.sessions()) == sorted((n, None) for n in NAMES)
            )
        )
        assert time.monotonic() - killed < 30, r.output()
        for name in orphans:
            await mention(r, name, "Still there")
        for name in NAMES:  # each bot answered each mention once
            assert len(r.by(name)) == (2 if name in orphans else 1), r.output()
        [(live,)] = r.rows("SELECT count(*) FROM processes WHERE stopped_at IS NULL")
        assert live == 2  # the killed process never said it stopped: it simply went silent
        got = await status(r.url, capsys)
        assert held(got) == {r.pid(survivor): sorted(NAMES)}
        [dead] = [p for p in got["processes"] if p["pid"] == r.pid(victim)]
        assert (dead["alive"], dead["stopped_at"], dead["units"]) == (False, None, [])
        assert await asyncio.to_thread(cli.main, ["status", "--db", r.url]) == 0
        text = capsys.readouterr().out.splitlines()
        assert text[0].endswith(": 1 live process") and any(
            f"pid {r.pid(victim)} " in t and "not alive" in t for t in text
        )
        assert [t.split()[0] for t in text if "  since " in t] == sorted(NAMES)


async def test_a_mention_while_its_bot_changes_hands_is_answered_where_the_resident_never_spoke(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    """The holder is killed; a mention comes before the survivor takes the bot over, in a channel where the
    resident has no reply in the ledger to catch up from. The taker catches up from when the dead process
    took the bot (`driven_since`), so the mention is answered, once."""
    async with rig(tmp_path, pg_server, ("cairn",)) as r:
        victim, survivor = await r.first_holds_cairn_then_second_joins()
        await victim.kill()
        r.room.post("general", "alice", "Anyone home, @cairn", mentions=["cairn"])
        [(posted,)] = r.rows("SELECT extract(epoch from clock_timestamp())")
        await r.until(lambda: r.holders() == {"cairn": r.pid(survivor)})
        [(taken,)] = r.rows("SELECT acquired_at FROM leases WHERE unit = 'cairn'")
        assert taken > posted  # the mention came while the bot was nobody's: the gateway told no one of it
        await r.until(lambda: len(r.by("cairn")) == 1)
        assert r.rows("SELECT count(*) FROM generations") == [(1,)]


async def test_a_holder_frozen_past_its_lease_posts_nothing_more_as_that_bot_and_gives_it_up(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    async with rig(tmp_path, pg_server, ("cairn",)) as r:
        frozen, other = await r.first_holds_cairn_then_second_joins()
        assert frozen.proc is not None
        frozen.proc.send_signal(signal.SIGSTOP)
        blocker = await asyncpg.connect(r.url)
        try:
            await r.until(lambda: r.holders() == {"cairn": r.pid(other)} and r.room.gateway.identifies == 2)
            # While it is frozen its session still hears the room: this mention waits in its socket too.
            await mention(r, "cairn", "Who is there")
            # Its first renewal once thawed waits behind this lock, so its lease (the outbox's fence) cannot
            # have told it the bot moved on; the mention's claim in the ledger, taken by the process that
            # answered it, keeps it from taking a turn on it at all: no second reply is even generated.
            block = blocker.transaction()
            await block.start()
            await blocker.execute("LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
            frozen.proc.send_signal(signal.SIGCONT)
            await r.until(lambda: "was taken already; no second reply to it" in frozen.output())
            assert r.rows("SELECT count(*) FROM posts WHERE message_id IS NULL") == [(0,)]
            await block.rollback()
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
            await blocker.close()
        [(resumed_at,)] = r.rows("SELECT extract(epoch from clock_timestamp())")
        await r.until(
            lambda: (
                r.rows("SELECT heartbeat_at FROM processes WHERE pid = $1", r.pid(frozen))[0][0] > resumed_at  # type: ignore[operator]
                and "leases: cairn stopped here: its lease was taken" in frozen.output()
            )
        )
        # Whatever the thawed process made of the mention it heard, none of it reached the room as cairn.
        await mention(r, "cairn", "And now")
        assert [m["content"] for m in r.by("cairn")] == ["Noted.", "Noted."], r.output()
        assert r.holders() == {"cairn": r.pid(other)}
        assert r.sessions() == [("cairn", None)]


async def test_a_holder_frozen_mid_reply_posts_none_of_it_once_thawed(tmp_path: Path, pg_server: pgkit.Server) -> None:
    """Frozen while the provider's answer is on its way: another process takes the bot over and settles the
    reply it left open as interrupted; thawed, the frozen process reads the whole answer, but the ledger
    refuses its writes to an attempt no longer streaming, so its turn is given up: nothing of it is recorded
    over the takeover's settlement (the chain verifies) and nothing of it is posted; its text is kept as a
    `taken-over` stump."""
    first = True
    frozen_now = asyncio.Event()

    def slow_first(body: dict[str, Any]) -> Call:
        nonlocal first
        late, first = first, False
        return Call(sse=sse.stream("Late words.", "end_turn", 3, model=MODEL), held_until=frozen_now if late else None)

    async with rig(tmp_path, pg_server, ("cairn",), responder=slow_first) as r:
        frozen, other = await r.first_holds_cairn_then_second_joins()
        assert frozen.proc is not None
        r.room.post("general", "alice", "Say it slowly, @cairn", mentions=["cairn"])
        await r.until(lambda: len(r.provider.requests) == 1)  # its turn waits on the provider's answer
        frozen.proc.send_signal(signal.SIGSTOP)
        frozen_now.set()  # the answer goes out now, to a process that cannot read it until thawed
        try:
            await r.until(lambda: r.holders() == {"cairn": r.pid(other)} and r.room.gateway.identifies == 2)
            await r.until(lambda: r.rows("SELECT status FROM generations") == [("incomplete",)])
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
        await r.until(lambda: "given up, its bot now driven elsewhere" in frozen.output(), timeout=45)
        await r.until(lambda: "leases: cairn stopped here: its lease was taken" in frozen.output())
        assert [m for m in r.by("cairn") if "Late words" in m["content"]] == [], r.output()
        assert r.rows("SELECT status, stop_reason FROM generations") == [("incomplete", "interrupted")]
        # What it was sent is not lost: kept as a stump of the taken-over attempt, for the resident to decide on.
        kept = r.rows("SELECT s.scope, s.cause, s.text FROM stumps s JOIN attempts a ON a.id = s.attempt_id")
        assert [(scope, cause, bytes(text)) for scope, cause, text in kept] == [
            ("attempt", "taken-over", b"Late words.")
        ]
        await mention(r, "cairn", "And now")
        assert r.holders() == {"cairn": r.pid(other)}
