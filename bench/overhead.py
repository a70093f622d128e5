"""Section 1: what the truthful pipeline costs beside the bare SDK reading the same stream.

Both paths read the same bytes from the same loopback server (in its own process, so its CPU time is
not billed to either), alternately, in one process: the bare path is the SDK's leanest consumption
(`messages.create(stream=True)`, text deltas joined); the pipeline is `Generator.generate` (attempts,
ledger chunks every 2,048 chars, settlement) on a real WAL ledger, then `plan` and the posts recorded,
as `Resident.respond` does before a room sends. The whole-process comparison runs `residents replay`
against a script that starts the same local server and reads the stream with the bare SDK.
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

from bot.config import Residence
from bot.delivery import plan
from bot.generation.attempts import AttemptRunner, LedgerSink
from bot.generation.run import Generator
from bot.ledger import Ledger
from bot.provider import ListSink, make_client, stream_once
from bot.records import Attempt, Generation, Post, new_id

from . import streams
from .common import ROOT, Sample, measure, median, scratch
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


async def pipeline(gen: Generator, res: Residence, req: dict[str, Any]) -> str:
    """One resident turn short of the room: generate, plan, record the planned posts."""
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
    gen: Generator,
    res: Residence,
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
        }
    out["pipeline"] = lambda: pipeline(gen, res, req)
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
            gen = Generator(AttemptRunner(client, ledger))
            res = Residence(name="bench", model=MODEL, max_tokens=max(t for t, _, _ in sizes.values()))
            holder = Generation(id=new_id("g-"), residence="bench", channel="bench", model=MODEL)
            await ledger.create_generation(holder)  # the attempts of the sink-only layers hang off this one
            for label, (tokens, rounds, breakdown) in sizes.items():
                req = request(tokens)
                expect = streams.text(tokens * streams.CHARS_PER_TOKEN)
                paths = list(_variants(sdk, client, gen, res, req, holder, breakdown).items())
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


def _scenario(folder: str, tokens: int) -> tuple[str, str]:
    """A one-turn replay scenario over a recorded `tokens`-token stream; returns (scenario, sse file)."""
    _, body = streams.for_tokens(tokens, "max_tokens")
    sse_path = os.path.join(folder, f"out-{tokens}.sse")
    with open(sse_path, "wb") as f:
        f.write(body)
    sc = os.path.join(folder, f"scenario-{tokens}.yaml")
    with open(sc, "w", encoding="utf-8") as f:
        f.write(
            f"residence:\n  name: bench\n  model: {MODEL}\n  max_tokens: {tokens}\n"
            f"turns:\n  - say: {{author: ana, content: Write at length.}}\n"
            f"    calls:\n      - sse: {os.path.basename(sse_path)}\n"
        )
    return sc, sse_path


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


def processes(sizes: dict[str, tuple[int, int, bool]]) -> dict[str, Any]:
    """`residents replay SCENARIO --json` against `python -m bench.bare_process STREAM`, alternately.

    `sizes`: label → (output tokens, rounds, also time replay with gc.freeze() after its imports). The
    frozen variant is an experiment, not the product: it shows what the CLI would save by freezing.
    """
    folder = scratch("process")
    residents = os.path.join(os.path.dirname(sys.executable), "residents")
    out: dict[str, Any] = {}
    for label, (tokens, rounds, frozen) in sizes.items():
        sc, sse_path = _scenario(folder, tokens)
        cmds = {
            "bare": [sys.executable, "-m", "bench.bare_process", sse_path, str(tokens)],
            "replay": [residents, "replay", sc, "--json"],
        }
        if frozen:
            cmds["replay_frozen"] = [sys.executable, "-m", "bench.replay_frozen", "replay", sc, "--json"]
        runs: dict[str, list[Sample]] = {name: [] for name in cmds}
        for r in range(rounds + 1):
            for name in list(cmds) if r % 2 else list(cmds)[::-1]:
                s = _run(cmds[name])
                if r:
                    runs[name].append(s)
        out[label] = {"tokens": tokens, **_summary(runs["bare"], runs["replay"], "replay")}
        if frozen:
            f = _summary(runs["bare"], runs["replay_frozen"], "frozen")
            out[label]["replay_frozen"] = {k: v for k, v in f.items() if not k.startswith("bare_")}
        log.info("process %s: wall %.3fx cpu %.3fx", label, out[label]["wall_ratio"], out[label]["cpu_ratio"])
    return out


if __name__ == "__main__":
    import json

    logging.basicConfig(level=logging.INFO)
    print(json.dumps(asyncio.run(in_process({"4k": (4096, 9, True), "128k": (128_000, 3, False)})), indent=1))
