"""The metrics count what the ledger settles, each run in a registry of its own; `/readyz` decides from
the outbox and the ledger; JSON log lines carry the ids of the work in hand.

Real parts: the pipeline against the local provider server behind the real SDK, a real ledger, a real
outbox. (`tests/test_metrics_process.py` scrapes `residents run` itself.)
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from pathlib import Path

import prometheus_client
import pytest
from conftest import Room, residence, specimen
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from residents import observe
from residents.delivery.outbox import Backoff, Outbox
from residents.delivery.plan import notice
from residents.delivery.resume import RoomUnavailable, Seen
from residents.ledger import Ledger, LedgerWriteError
from residents.localservers.provider import Call
from residents.metrics import Metrics
from residents.records import Post, PostReason, numbered

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

BOUNDED = {
    "continuation": {
        "standing": "bounded",
        "max_segments": 2,
        "max_output_tokens": 12288,
        "min_progress_chars": 16,
        "similarity_abort": 0.92,
    },
    "retries": {"max_attempts": 3, "backoff_seconds": 0},
}


def scrape(m: Metrics) -> Samples:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def observed(pipeline, res, m: Metrics):  # type: ignore[no-untyped-def]
    """The pipeline's parts tell `m`, as `residents run` wires them."""
    pipeline.ledger.observer = m
    res.generator.runner.observer = m
    res.outbox.observer = m
    res.observer = m
    return res


async def test_a_bounded_continuation_is_counted_as_the_ledger_holds_it(pipeline) -> None:
    m = Metrics(["cairn"])
    res = observed(pipeline, pipeline.resident(residence(max_tokens=600, policy=BOUNDED)), m)
    reply, posts = await pipeline.turn(
        res,
        Room(),
        "Write it all.",
        [Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))],
    )
    g = reply.generation
    assert (g.status, len(g.segments)) == ("completed", 2)
    s = scrape(m)
    assert value(s, "residents_generations_total", residence="cairn", status="completed") == 1
    assert value(s, "residents_continuations_total", residence="cairn", how="bounded") == 1
    assert value(s, "residents_truncations_total", residence="cairn") == 1  # the first segment's stream was cut
    model = {"residence": "cairn", "gen_ai_request_model": g.model}
    tokens = sum(a.output_tokens or 0 for a in g.attempts)
    assert value(s, "gen_ai_client_token_usage_sum", **model, gen_ai_token_type="output") == tokens == g.output_tokens
    assert value(s, "gen_ai_client_token_usage_count", **model, gen_ai_token_type="output") == 2
    assert value(s, "gen_ai_client_operation_duration_seconds_count", **model, error_type="") == 2
    assert value(s, "residents_turn_duration_seconds_count", residence="cairn") == 1
    delivered = {k: sum(1 for p in posts if p.kind == k) for k in {p.kind for p in posts}}
    for kind, n in delivered.items():
        assert value(s, "residents_posts_delivered_total", residence="cairn", kind=kind) == n


async def test_a_continue_on_request_counts_a_continuation_not_a_second_reply(pipeline) -> None:
    m = Metrics(["cairn"])
    policy = {**BOUNDED, "continuation": {**BOUNDED["continuation"], "standing": "on-request"}}
    res = observed(pipeline, pipeline.resident(residence(max_tokens=600, policy=policy)), m)
    room = Room()
    reply, _ = await pipeline.turn(res, room, "Write it all.", [Call(sse=specimen("cont-first.sse"))])
    g = reply.generation
    assert g.status == "truncated"
    s = scrape(m)
    assert value(s, "residents_generations_total", residence="cairn", status="truncated") == 1
    assert value(s, "residents_stumps_total", residence="cairn", cause="max_tokens", scope="output") == 1

    pipeline.server.reset([Call(sse=specimen("cont-rest-with-overlap.sse"))])
    more = await res.continue_generation(room, "room", g.id)
    assert more.generation is not None and more.generation.status == "completed" and more.declined is None
    s = scrape(m)
    assert value(s, "residents_continuations_total", residence="cairn", how="on-request") == 1
    assert value(s, "residents_continuations_total", residence="cairn", how="bounded") == 0
    assert value(s, "residents_generations_total", residence="cairn", status="truncated") == 1
    assert value(s, "residents_generations_total", residence="cairn", status="completed") == 0

    # a /continue of the completed reply is declined with a notice: counted once, by its reason
    declined = await res.continue_generation(room, "room", g.id)
    assert declined.declined is not None
    s = scrape(m)
    assert value(s, "residents_notices_total", residence="cairn", reason="declined-continue") == 1
    assert value(s, "residents_continuations_total", residence="cairn", how="on-request") == 1


async def test_each_run_counts_in_a_registry_of_its_own(pipeline) -> None:
    first, second = Metrics(["cairn"]), Metrics(["cairn"])
    res = observed(pipeline, pipeline.resident(residence()), first)
    await pipeline.turn(res, Room(), "Sum it up.", [Call(sse=specimen("end-turn.sse"))])
    assert value(scrape(first), "residents_generations_total", residence="cairn", status="completed") == 1
    assert value(scrape(second), "residents_generations_total", residence="cairn", status="completed") == 0
    assert not [n for n in prometheus_client.REGISTRY._names_to_collectors if n.startswith(("residents_", "gen_ai_"))]


class FailingRoom:
    """A room that refuses every post until `up` is set."""

    def __init__(self) -> None:
        self.up = False
        self.sent: list[Post] = []

    async def send(self, post: Post) -> str:
        if not self.up:
            raise RoomUnavailable("connection refused")
        self.sent.append(post)
        return str(1000 + len(self.sent))

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        if not self.up:
            raise RoomUnavailable("connection refused")
        return []


async def test_readyz_fails_while_a_post_waits_past_the_threshold_and_recovers_once_delivered(tmp_path: Path) -> None:
    m = Metrics(["cairn"], ready_post_age=30)
    async with Ledger.open(tmp_path / "ledger.db") as ledger:
        ledger.observer = m
        outbox = Outbox(ledger, Backoff(base=0.02, cap=0.05))
        outbox.observer = m
        room = FailingRoom()
        outbox.register("cairn", room)
        m.sources.backlog = outbox.backlog
        m.sources.sessions = lambda: {"cairn": True}
        m.sources.ledger_open = lambda: not ledger.db.closed
        assert m.unready() == []
        posts = numbered([notice("Key refused.", PostReason.KEY_REJECTED)], None, "c1", 1)
        await ledger.add_posts(posts)
        queued = outbox.enqueue("cairn", posts)
        await asyncio.sleep(0.1)  # tried and failed at least once
        assert m.unready() == []  # waiting, but not past the threshold
        later = time.time() + 31
        [line] = m.unready(now=later)
        assert line.startswith("outbox c1: 1 post(s) wait, the oldest for 3") and line.endswith("(more than 30s)")
        s = scrape(m)
        assert value(s, "residents_outbox_posts", channel="c1") == 1
        assert value(s, "residents_outbox_oldest_post_age_seconds", channel="c1") > 0
        room.up = True
        assert await outbox.wait(queued, timeout=5)
        assert m.unready(now=later) == []
        s = scrape(m)
        assert value(s, "residents_outbox_posts", channel="c1") == 0
        assert value(s, "residents_notices_total", residence="cairn", reason="key-rejected") == 1
        assert value(s, "residents_ready") == 1
        await outbox.close()


async def test_a_ledger_that_refused_a_write_is_not_ready_until_one_is_written(tmp_path: Path) -> None:
    m = Metrics(["cairn"])
    async with Ledger.open(tmp_path / "ledger.db") as ledger:
        ledger.observer = m
        m.sources.sessions = lambda: {"cairn": True}
        m.sources.ledger_open = lambda: not ledger.db.closed
        pages = int(list(await ledger.db.execute_fetchall("PRAGMA page_count"))[0][0])
        await ledger.db.execute(f"PRAGMA max_page_count = {pages}")  # a full disk, as SQLite reports it
        big = numbered([notice("x" * 20000, PostReason.KEY_REJECTED)], None, "c1", 1)
        with pytest.raises(LedgerWriteError):
            await ledger.add_posts(big)
        assert m.unready() == ["the ledger refused a write at its last commit (disk full or an I/O error)"]
        assert value(scrape(m), "residents_ledger_writable") == 0
        await ledger.db.execute("PRAGMA max_page_count = 1073741823")  # space is back
        await ledger.add_posts(big)
        assert m.unready() == []
        s = scrape(m)
        assert value(s, "residents_ledger_writable") == 1
        assert value(s, "residents_ledger_commit_duration_seconds_count") >= 2
    assert m.unready() == ["the ledger is not open"]


def test_json_lines_carry_the_ids_of_the_work_in_hand() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(observe.JsonLines())
    log = logging.getLogger("residents.test_metrics")
    log.addHandler(handler)
    log.propagate = False
    try:
        with observe.working_on(residence="cairn", channel="c1"):
            observe.set_ids(generation="g-1", attempt="a-1")
            log.warning("abandoned after %d chars: \ud83d", 12)
            log.warning("named here", extra={"attempt": "a-2"})
        log.warning("after the turn")
    finally:
        log.removeHandler(handler)
        log.propagate = True
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: first[k] for k in ("residence", "channel", "generation", "attempt", "level", "logger")} == {
        "residence": "cairn",
        "channel": "c1",
        "generation": "g-1",
        "attempt": "a-1",
        "level": "WARNING",
        "logger": "residents.test_metrics",
    }
    assert first["message"] == "abandoned after 12 chars: \ud83d"  # a lone surrogate, escaped, read back exactly
    assert second["attempt"] == "a-2"
    assert not {"residence", "channel", "generation", "attempt"} & set(third)
