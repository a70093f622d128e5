"""The lease table's rules on a real PostgreSQL server, without bots: the fair share, renewal only by the
same holder at the same epoch, an expired or stopped holder's units taken with a new epoch, and what a
process holds beyond its share named for giving up. Expiry is set in the table, not waited for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from residents import cli, truth
from residents.discord.forward import Forwarder
from residents.ledger import continue_requests, leases, postgres
from residents.ledger.leases import Leases, Terms, Unit
from residents.records import Generation

try:
    import pgkit
except ImportError:  # tests/ collected as a package
    from tests import pgkit

UNITS = [Unit("cairn"), Unit("moss"), Unit("reed"), Unit("sill")]
TERMS = Terms(length=60.0, renew=20.0)  # long: nothing expires unless a test says so


@pytest.fixture
async def url(pg_server: pgkit.Server) -> AsyncIterator[str]:
    url = pg_server.create()
    assert await asyncio.to_thread(cli.main, ["ledger", "migrate", "--db", url]) == 0
    yield url


async def process(url: str, units: list[Unit] = UNITS) -> Leases:
    keeper = Leases(await postgres.connect(url), units, TERMS)
    await keeper.start()
    return keeper


def expire(url: str, unit: str) -> None:
    pgkit.execute(url, f"UPDATE leases SET expires_at = 0 WHERE unit = '{unit}'")


async def test_two_processes_share_four_units_two_each_and_a_third_unit_holder_gives_up_its_surplus(url: str) -> None:
    one = await process(url)
    first = await one.tick()  # alone: it takes every unit
    assert sorted(first.gained) == ["cairn", "moss", "reed", "sill"] and set(first.gained.values()) == {1}
    two = await process(url)
    assert (await two.tick()).gained == {}  # nothing free, all leases run
    again = await one.tick()  # two live processes now: one holds two more than its share
    assert sorted(again.kept) == ["cairn", "moss", "reed", "sill"] and again.excess == ["reed", "sill"]
    await one.release(again.excess)
    assert sorted(one.held) == ["cairn", "moss"] and not one.may_post("reed") and one.may_post("cairn")
    took = await two.tick()
    assert took.gained == {"reed": 2, "sill": 2}  # each take bumps the epoch
    assert (await one.tick()).excess == [] and (await two.tick()).excess == []
    got = await _status(url)
    assert {p.id: sorted(u for u, _ in p.units) for p in got.processes} == {
        one.process: ["cairn", "moss"],
        two.process: ["reed", "sill"],
    }
    for keeper in (one, two):
        await keeper.stop()
        await keeper.conn.close()


async def _status(url: str) -> leases.Status:
    conn = await postgres.connect(url)
    try:
        return await conn.run(leases.status)
    finally:
        await conn.close()


async def test_a_lease_taken_after_it_expired_cannot_be_renewed_by_its_old_holder(url: str) -> None:
    old = await process(url, [Unit("cairn")])
    assert (await old.tick()).gained == {"cairn": 1}
    new = await process(url, [Unit("cairn")])
    expire(url, "cairn")  # the old holder froze past its lease
    assert (await new.tick()).gained == {"cairn": 2}
    back = await old.tick()  # thawed: its renewal at epoch 1 fails, and nothing is free to take
    assert back.lost == ["cairn"] and back.kept == {} and back.gained == {}
    assert not old.may_post("cairn") and new.may_post("cairn") and old.held == {}
    for keeper in (old, new):
        await keeper.conn.close()


async def test_a_stopped_process_leaves_its_units_free_at_once(url: str) -> None:
    one = await process(url, [Unit("cairn")])
    await one.tick()
    two = await process(url, [Unit("cairn")])
    assert (await two.tick()).gained == {}
    await one.stop()  # a clean stop: leases given up, the process marked stopped
    assert (await two.tick()).gained == {"cairn": 2}
    [(stopped,)] = pgkit.fetch(url, "SELECT stopped_at IS NOT NULL FROM processes WHERE id = $1", one.process)
    assert stopped is True
    for keeper in (one, two):
        await keeper.conn.close()


async def test_a_sharded_bot_is_shared_shard_by_shard(url: str) -> None:
    shards = leases.as_units([("cairn", 4)])
    one, two = await process(url, shards), await process(url, shards)
    first, second = await one.tick(), await two.tick()
    assert sorted(first.gained) == ["cairn#0", "cairn#1"] and sorted(second.gained) == ["cairn#2", "cairn#3"]
    for keeper in (one, two):
        await keeper.conn.close()


async def test_a_handover_is_told_to_the_others_and_the_taker_learns_since_when_the_unit_was_driven(url: str) -> None:
    one = await process(url)
    first = await one.tick()
    assert first.driven_since == {}  # nobody drove them before: nothing since then was anyone's to miss
    [(taken_at,)] = pgkit.fetch(url, "SELECT acquired_at FROM leases WHERE unit = 'reed'")
    heard = leases.Listener(url, one.process)
    await heard.ensure()
    two = await process(url)  # registering tells the others their share shrank
    await asyncio.wait_for(heard.woken.wait(), timeout=10)
    again = await one.tick()
    waking = leases.Listener(url, two.process)
    await waking.ensure()
    heard.woken.clear()
    await one.release(again.excess)  # told to the other; not to the teller itself
    await asyncio.wait_for(waking.woken.wait(), timeout=10)
    took = await two.tick()
    assert sorted(took.gained) == ["reed", "sill"]
    assert took.driven_since == {"reed": taken_at, "sill": pytest.approx(taken_at, abs=1.0)}
    assert two.driven_since == took.driven_since
    assert heard._conn is not None
    await heard._conn.fetchval("SELECT 1")  # a notification committed before this is delivered before its answer
    assert not heard.woken.is_set()
    waking.woken.clear()
    await one.stop()  # a clean stop is told too
    await asyncio.wait_for(waking.woken.wait(), timeout=10)
    for listener in (heard, waking):
        await listener.close()
    for keeper in (one, two):
        await keeper.conn.close()


# Continue requests (`continue_requests`): a /continue carried to the process that drives the resident's bot.


async def _asked(url: str, within: float = 60.0) -> tuple[Leases, Leases, int]:
    """Two registered processes, and a request the first asked for one more segment of g-1 (1 segment seen)."""
    asker, holder = await process(url, [Unit("cairn")]), await process(url, [Unit("cairn")])
    rid = await asker.conn.run(continue_requests.ask, "g-1", "cairn", "42", 1, asker.process, within)
    return asker, holder, rid


async def _close(*keepers: Leases) -> None:
    for keeper in keepers:
        await keeper.conn.close()


async def test_a_continue_request_is_taken_once_answered_by_its_taker_and_told_both_ways(url: str) -> None:
    asked, answered = Heard(), Heard()
    ears = leases.Listener(url, 0, also={continue_requests.ASKED: asked})
    await ears.ensure()
    asker, holder, rid = await _asked(url)
    back = leases.Listener(url, asker.process, also={continue_requests.ANSWERED: answered})
    await back.ensure()
    await asked.until(str(rid))
    assert asked.payloads == [str(rid)]
    assert await holder.conn.run(continue_requests.pending, ["cairn"]) == [rid]
    assert await holder.conn.run(continue_requests.pending, ["moss"]) == []
    assert await holder.conn.run(continue_requests.pending_one, rid) == continue_requests.Request(
        rid, "g-1", "cairn", "42", 1
    )
    before = await asker.conn.run(continue_requests.state, rid)
    assert before == continue_requests.State(None, None, False, None)
    taken = await holder.conn.run(continue_requests.take, rid, holder.process)
    assert taken == continue_requests.Request(rid, "g-1", "cairn", "42", 1)
    # Taken once: neither another process nor the same one takes it again, and it is no longer pending.
    assert await asker.conn.run(continue_requests.take, rid, asker.process) is None
    assert await holder.conn.run(continue_requests.take, rid, holder.process) is None
    assert await holder.conn.run(continue_requests.pending, ["cairn"]) == []
    assert await holder.conn.run(continue_requests.pending_one, rid) is None
    # The asker can no longer withdraw it: it is running.
    assert await asker.conn.run(continue_requests.give_up, rid) is False
    assert await asker.conn.run(continue_requests.state, rid) == continue_requests.State(
        holder.process, None, False, True
    )
    # Only its taker answers it.
    await asker.conn.run(continue_requests.answer, rid, asker.process, "not mine to say")
    assert (await asker.conn.run(continue_requests.state, rid)).answer is None
    await holder.conn.run(continue_requests.answer, rid, holder.process, "Continued g-1: now truncated.")
    await answered.until(str(rid))
    got = await asker.conn.run(continue_requests.state, rid)
    assert got == continue_requests.State(holder.process, "Continued g-1: now truncated.", False, True)
    # Its taker stopping is seen by the asker (it waits no longer for an answer that will not come).
    await holder.stop()
    assert (await asker.conn.run(continue_requests.state, rid)).taker_alive is False
    for listener in (ears, back):
        await listener.close()
    await _close(asker, holder)


class Heard:
    """The payloads a listener's channel was told, and an event set at each."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.told = asyncio.Event()

    def __call__(self, payload: str) -> None:
        self.payloads.append(payload)
        self.told.set()

    async def until(self, payload: str) -> None:
        async with asyncio.timeout(10):
            while payload not in self.payloads:
                self.told.clear()
                await self.told.wait()


async def test_a_continue_request_withdrawn_or_past_its_deadline_is_never_taken(url: str) -> None:
    asker, holder, rid = await _asked(url)
    assert await asker.conn.run(continue_requests.give_up, rid) is True
    assert await holder.conn.run(continue_requests.take, rid, holder.process) is None
    assert await holder.conn.run(continue_requests.pending, ["cairn"]) == []
    assert await asker.conn.run(continue_requests.state, rid) == continue_requests.State(None, None, True, None)
    # Past its deadline (an asker that died before withdrawing it): nobody takes it either.
    _, _, late = await _asked(url)
    assert await holder.conn.run(continue_requests.pending, ["cairn"]) == [late]
    pgkit.execute(url, f"UPDATE continue_requests SET deadline = 0 WHERE id = {late}")
    assert await holder.conn.run(continue_requests.pending, ["cairn"]) == []
    assert await holder.conn.run(continue_requests.take, late, holder.process) is None
    await _close(asker, holder)


async def test_two_processes_racing_to_take_one_continue_request_take_it_once(url: str) -> None:
    asker, holder, rid = await _asked(url)
    third = await process(url, [Unit("cairn")])
    got = await asyncio.gather(
        *(k.conn.run(continue_requests.take, rid, k.process) for k in (asker, holder, third) for _ in range(3))
    )
    assert sum(g is not None for g in got) == 1
    await _close(asker, holder, third)


# The asking side of a carried /continue (`discord.forward.Forwarder.ask`), against a taker with no bot.


async def _asking(url: str) -> tuple[Leases, Leases, Forwarder, leases.Listener, Heard]:
    """An asking process (its Forwarder hearing answers on its lease listener), a taker, and what is asked."""
    asker, taker = await process(url, [Unit("cairn")]), await process(url, [Unit("cairn")])
    fwd = Forwarder(asker.conn, asker.process, {}, {}, _never)
    asked = Heard()
    ears = leases.Listener(url, asker.process, also={**fwd.channels(), continue_requests.ASKED: asked})
    await ears.ensure()
    return asker, taker, fwd, ears, asked


async def _never(residence: str, channel: str) -> bool:
    return False


G = Generation(id="g-7", residence="cairn", channel="42", model="m")


async def test_a_carried_continue_gets_its_takers_answer_or_is_told_its_taker_stopped(url: str) -> None:
    asker, taker, fwd, ears, asked = await _asking(url)
    waiting = asyncio.create_task(fwd.ask(G))
    await asked.until("1")
    assert await taker.conn.run(continue_requests.take, 1, taker.process) is not None
    await taker.conn.run(continue_requests.answer, 1, taker.process, "Continued g-7: now complete.")
    assert await asyncio.wait_for(waiting, timeout=10) == "Continued g-7: now complete."

    waiting = asyncio.create_task(fwd.ask(G))
    await asked.until("2")
    assert await taker.conn.run(continue_requests.take, 2, taker.process) is not None
    await taker.stop()  # taken, then its process stops before answering: the asker waits no longer
    said = await asyncio.wait_for(waiting, timeout=10)
    assert said == truth.continue_not_answered("cairn", "g-7", "stopped before answering")
    await ears.close()
    await _close(asker, taker)


async def test_a_carried_continue_nobody_takes_is_withdrawn_and_told(url: str) -> None:
    asker, taker, fwd, ears, asked = await _asking(url)
    fwd.take_wait = 0.5
    said = await asyncio.wait_for(fwd.ask(G), timeout=10)
    assert said == truth.continue_not_taken("cairn", "g-7", 0.5)
    assert await taker.conn.run(continue_requests.take, 1, taker.process) is None
    assert await asker.conn.run(continue_requests.state, 1) == continue_requests.State(None, None, True, None)
    await ears.close()
    await _close(asker, taker)
