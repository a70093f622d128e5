"""Section 1: what the truthful pipeline costs beside the bare SDK reading the same stream.

Both paths read the same bytes from the same loopback server (in its own process, so its CPU time is
not billed to either), alternately, in one process: the bare path is the SDK's leanest consumption
(`messages.create(stream=True)`, text deltas joined); the pipeline is a whole `Resident.respond` on a
real WAL ledger: the request compiled from the room's history, `Generator.generate` (attempts, ledger
chunks every 2,048 chars, settlement), `plan`, the posts recorded, and each post delivered to a
collecting room and marked delivered in the ledger.

The whole-process comparison runs `residents replay` against a script that starts the same local
server and reads the stream with the bare SDK, both with the same `gc.freeze()`. What is compared is
the cost per stream: each side runs on the big stream and on a tiny one, and the tiny run's CPU
(interpreter start-up, imports, the ledger's creation) is taken off the big one's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic

from residents.config import Residence
from residents.delivery import plan
from residents.delivery.outbox import NO_BACKOFF, Outbox
from residents.generation.attempts import AttemptRunner, LedgerSink
from residents.generation.run import Generator
from residents.ledger import Ledger
from residents.provider import ListSink
from residents.provider.anthropic_messages import AnthropicProvider, make_client, stream_once
from residents.records import Attempt, Generation, Post, new_id
from residents.replay.run import CollectingRoom
from residents.resident import Resident

from . import streams
from .common import ROOT, Sample, measure, median, scratch, spread
from .server import ServerProcess

log = logging.getLogger(__name__)

MODEL = "claude-sonnet-4-6"


def request(tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": tokens, "messages": [{"role": "user", "content": "Write at length."}]}


async def bare(client: anthropic.AsyncAnthropic, req: dict[str, Any]) -> str:
    """The SDK's leanest path: raw events, text deltas joined, nothing else."""
    stream = await client.messages.create(**req, stream=True)
    parts: list[str] = []
    async for ev in stream:
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            parts.append(ev.delta.text)
    return "".join(parts)


async def pipeline(resident: Resident) -> str:
    """One whole resident turn, the room a collecting one: compile the request from the room's
    history, generate, plan, record the posts, deliver each and mark it delivered."""
    room = CollectingRoom(resident.name)
    resident.outbox.register(resident.name, room)  # each run's posts to its own room
    room.say("ana", "Write at length.")
    reply = await resident.respond(room, "bench", list(room.history))
    assert reply.generation is not None and len(room.sent) == len(reply.posts)
    return reply.generation.text


async def generate_and_record(gen: Generator, res: Residence, req: dict[str, Any]) -> str:
    """The pipeline short of the request builder and the room: generate, plan, record the posts."""
    g = await gen.generate(res, "bench", req)
    planned = plan(g.ending(), g.text)
    posts = [
        Post(id=new_id("p-"), generation_id=g.id, seq=i + 1, kind=p.kind, content=p.content, channel="bench")
        for i, p in enumerate(planned)
    ]
    await gen.ledger.add_posts(posts)
    return g.text


class _NoLedger:
    """A ledger that takes chunks and does nothing: the sink's own bookkeeping, alone."""

    async def add_chunks(self, attempt_id: str, rows: list[Any]) -> None:
        return None


class _PauseLedger:
    """A ledger whose chunk write is only a short wait: what stopping the stream costs, with no write."""

    async def add_chunks(self, attempt_id: str, rows: list[Any]) -> None:
        await asyncio.sleep(0.0002)


def _variants(
    sdk: anthropic.AsyncAnthropic,
    client: anthropic.AsyncAnthropic,
    resident: Resident,
    req: dict[str, Any],
    g: Generation,
    breakdown: bool,
) -> dict[str, Callable[[], Awaitable[str]]]:
    """The two paths, and with `breakdown` the layers between them, each adding one step to the last."""

    async def provider() -> str:
        sink = ListSink()
        await stream_once(client, req, sink)
        return sink.text()

    def sink_on(ledger: Any) -> Callable[[], Awaitable[str]]:
        async def run() -> str:
            a = Attempt(id=new_id("a-"), generation_id=g.id, segment=1, index=1)
            if isinstance(ledger, Ledger):
                await ledger.start_attempt(a)
            sink = LedgerSink(ledger, a.id)
            try:
                await stream_once(client, req, sink)
            finally:
                await sink.close()
            return sink.text()

        return run

    gen, res = resident.generator, resident.residence

    async def generate() -> str:
        return (await gen.generate(res, "bench", req)).text

    out: dict[str, Callable[[], Awaitable[str]]] = {"bare": lambda: bare(sdk, req)}
    if breakdown:
        out |= {
            "stream_once+ListSink": provider,
            "+LedgerSink, no ledger": sink_on(_NoLedger()),
            "+LedgerSink, 0.2 ms pause per chunk": sink_on(_PauseLedger()),
            "+LedgerSink, real ledger": sink_on(gen.ledger),
            "Generator.generate": generate,
            "+plan, posts recorded": lambda: generate_and_record(gen, res, req),
        }
    out["pipeline"] = lambda: pipeline(resident)
    return out


async def in_process(sizes: dict[str, tuple[int, int, bool]]) -> dict[str, Any]:
    """`sizes`: label → (output tokens, measured rounds, with the layer breakdown).

    One warm-up round each, then rounds in alternating order, so drift favours neither path.
    """
    server = ServerProcess([t for t, _, _ in sizes.values()])
    folder = scratch("overhead")
    async with Ledger.open(os.path.join(folder, "ledger.db")) as ledger:
        sdk = anthropic.AsyncAnthropic(base_url=server.url, api_key="bench", max_retries=0)
        client = make_client(server.url, "bench")
        out: dict[str, Any] = {}
        try:
            gen = Generator(AttemptRunner(AnthropicProvider(client), ledger))
            holder = Generation(id=new_id("g-"), residence="bench", channel="bench", model=MODEL)
            await ledger.create_generation(holder)  # the attempts of the sink-only layers hang off this one
            for label, (tokens, rounds, breakdown) in sizes.items():
                # The resident's request asks for `tokens`, which is what picks the server's stream.
                resident = Resident(
                    Residence(name="bench", model=MODEL, max_tokens=tokens), gen, ledger, Outbox(ledger, NO_BACKOFF)
                )
                req = request(tokens)
                expect = streams.text(tokens * streams.CHARS_PER_TOKEN)
                paths = list(_variants(sdk, client, resident, req, holder, breakdown).items())
                runs: dict[str, list[Sample]] = {name: [] for name, _ in paths}
                for r in range(rounds + 1):
                    for name, fn in paths if r % 2 else paths[::-1]:
                        s, text = await measure(fn)
                        if text != expect:
                            raise AssertionError(f"{name} read {len(text)} chars, expected {len(expect)}")
                        if r:  # round 0 warms caches and connections
                            runs[name].append(s)
                out[label] = {
                    "tokens": tokens,
                    "chars": len(expect),
                    "deltas": len(streams.deltas(expect)),
                    **_summary(runs["bare"], runs["pipeline"], "pipeline"),
                }
                if breakdown:
                    b_cpu = median([x.cpu for x in runs["bare"]])
                    b_min = min(x.cpu for x in runs["bare"])
                    out[label]["layers"] = {
                        name: {
                            "cpu_ms": median([x.cpu for x in v]) * 1000,
                            "cpu_min_ms": min(x.cpu for x in v) * 1000,
                            "wall_ms": median([x.wall for x in v]) * 1000,
                            "cpu_ratio": median([x.cpu for x in v]) / b_cpu,
                            "cpu_ratio_of_minima": min(x.cpu for x in v) / b_min,
                        }
                        for name, v in runs.items()
                    }
                log.info("overhead %s: wall %.3fx cpu %.3fx", label, out[label]["wall_ratio"], out[label]["cpu_ratio"])
        finally:
            await client.close()
            await sdk.close()
            server.close()
    return out


def _summary(bare_runs: list[Sample], other: list[Sample], name: str) -> dict[str, Any]:
    """Medians and their ratios; the paired ratios (round by round) too, which a busy machine disturbs less."""
    b_wall, b_cpu = median([s.wall for s in bare_runs]), median([s.cpu for s in bare_runs])
    o_wall, o_cpu = median([s.wall for s in other]), median([s.cpu for s in other])
    return {
        "rounds": len(bare_runs),
        "bare_wall_s": b_wall,
        "bare_cpu_s": b_cpu,
        f"{name}_wall_s": o_wall,
        f"{name}_cpu_s": o_cpu,
        "wall_ratio": o_wall / b_wall,
        "cpu_ratio": o_cpu / b_cpu,
        "wall_ratio_paired": median([o.wall / b.wall for o, b in zip(other, bare_runs, strict=False)]),
        "cpu_ratio_paired": median([o.cpu / b.cpu for o, b in zip(other, bare_runs, strict=False)]),
        "wall_ratio_of_minima": min(s.wall for s in other) / min(s.wall for s in bare_runs),
        "cpu_ratio_of_minima": min(s.cpu for s in other) / min(s.cpu for s in bare_runs),
        "bare_wall_all": [round(s.wall, 4) for s in bare_runs],
        f"{name}_wall_all": [round(s.wall, 4) for s in other],
        "bare_cpu_all": [round(s.cpu, 4) for s in bare_runs],
        f"{name}_cpu_all": [round(s.cpu, 4) for s in other],
    }


# ---------------------------------------------------------------- whole processes


def _scenario(folder: str, chars: int) -> tuple[str, str]:
    """A one-turn replay scenario over a recorded stream of `chars` characters, cut at the ceiling;
    returns (scenario, sse file). The residence asks for as many tokens as the model allows."""
    t = streams.text(chars)
    sse_path = os.path.join(folder, f"out-{chars}.sse")
    with open(sse_path, "wb") as f:
        f.write(streams.stream(t, "max_tokens"))
    sc = os.path.join(folder, f"scenario-{chars}.yaml")
    with open(sc, "w", encoding="utf-8") as f:
        f.write(
            f"residence:\n  name: bench\n  model: {MODEL}\n  max_tokens: {_max_tokens(chars)}\n"
            f"turns:\n  - say: {{author: ana, content: Write at length.}}\n"
            f"    calls:\n      - sse: {os.path.basename(sse_path)}\n"
        )
    return sc, sse_path


def _max_tokens(chars: int) -> int:
    return max(1, min(128_000, chars // streams.CHARS_PER_TOKEN))


def _run(cmd: list[str]) -> Sample:
    """Wall and CPU (user + system, all threads) of one child process, its output discarded."""
    w = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - w
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} exited {proc.returncode}: {err[-2000:]}")
    return Sample(wall, ru.ru_utime + ru.ru_stime)


def processes(big: int, tiny: int, rounds: int) -> dict[str, Any]:
    """Per-stream cost of `residents replay SCENARIO --json` against `python -m bench.bare_process`.

    `big`, `tiny`: the two streams' sizes in characters. Every round runs each side on both streams
    (sides and sizes in alternating order, so drift favours neither) and takes the tiny run's cost
    off the big one's: what is left is what reading, keeping and delivering `big - tiny` characters
    cost that process. A third side, `floor`, is the bare script reading only the response's bytes:
    the in-process server's and the transport's share, which both sides pay. One warm-up round of
    tiny runs comes first (it fills the page cache with the imports) and is dropped.
    """
    folder = scratch("process")
    residents = os.path.join(os.path.dirname(sys.executable), "residents")
    files = {size: _scenario(folder, size) for size in (big, tiny)}

    def cmd(side: str, size: int) -> list[str]:
        sc, sse_path = files[size]
        if side == "replay":
            return [residents, "replay", sc, "--json"]
        extra = ["--floor"] if side == "floor" else []
        return [sys.executable, "-m", "bench.bare_process", sse_path, str(_max_tokens(size)), *extra]

    sides = ["bare", "replay", "floor"]
    for side in sides:
        _run(cmd(side, tiny))
    runs: dict[str, dict[int, list[Sample]]] = {side: {big: [], tiny: []} for side in sides}
    for r in range(rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            for size in (big, tiny) if r % 2 == 0 else (tiny, big):
                runs[side][size].append(_run(cmd(side, size)))
        log.info("process round %d/%d done", r + 1, rounds)
    per = {
        side: [Sample(b.wall - t.wall, b.cpu - t.cpu) for b, t in zip(v[big], v[tiny], strict=True)]
        for side, v in runs.items()
    }
    out: dict[str, Any] = {"big_chars": big, "tiny_chars": tiny, "rounds": rounds}
    for side in sides:
        out[side] = {
            "per_stream_cpu_s": spread([s.cpu for s in per[side]]),
            "per_stream_wall_s": spread([s.wall for s in per[side]]),
            "big_cpu_s": spread([s.cpu for s in runs[side][big]]),
            "tiny_cpu_s": spread([s.cpu for s in runs[side][tiny]]),
            "per_stream_cpu_all": [round(s.cpu, 4) for s in per[side]],
        }
    out["cpu_ratio"] = out["replay"]["per_stream_cpu_s"]["median"] / out["bare"]["per_stream_cpu_s"]["median"]
    out["wall_ratio"] = out["replay"]["per_stream_wall_s"]["median"] / out["bare"]["per_stream_wall_s"]["median"]
    out["cpu_ratio_paired"] = spread([r.cpu / b.cpu for r, b in zip(per["replay"], per["bare"], strict=True)])
    # Without the share both sides pay (the server and the transport): the client paths alone.
    out["cpu_ratio_above_floor_paired"] = spread(
        [(r.cpu - f.cpu) / (b.cpu - f.cpu) for r, b, f in zip(per["replay"], per["bare"], per["floor"], strict=True)]
    )
    log.info(
        "process %d chars: per-stream cpu %.3fx (paired median %.3f, %.3f–%.3f)",
        big,
        out["cpu_ratio"],
        out["cpu_ratio_paired"]["median"],
        out["cpu_ratio_paired"]["min"],
        out["cpu_ratio_paired"]["max"],
    )
    return out


if __name__ == "__main__":
    import json

    logging.basicConfig(level=logging.INFO)
    print(json.dumps(asyncio.run(in_process({"4k": (4096, 9, True), "128k": (128_000, 3, False)})), indent=1))
