"""The provider for the benchmarks, in its own process: `python -m bench.server [--pace N] TOKENS...`.

Serving from a separate process keeps the server's CPU time out of the figures of the process
under test, so a ratio compares the client paths alone. A request's `max_tokens` picks the stream: an
output of exactly that many tokens, cut at the ceiling (stop reason `max_tokens`), the costlier ending
for the pipeline (a stump is written besides the generation). Unpaced, a stream is written as fast as
the socket takes it (the local ProviderServer as is); with --pace, deltas go out at about N tokens a
second per stream, in 50 ms batches, like a provider's steady output; with --stall S as well, every
paced stream goes silent once, at a point and for a time (S/4 to S seconds) drawn from a seeded RNG
per request, as a provider stalls mid-stream.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import uuid
from functools import lru_cache
from typing import Any

from aiohttp import web

from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer

from . import streams

TICK = 0.05


@lru_cache(maxsize=8)
def body(tokens: int) -> bytes:
    return streams.for_tokens(tokens, "max_tokens")[1]


def respond(request: dict[str, Any]) -> Call:
    return Call(sse=body(int(request["max_tokens"])))


def paced_handler(rate: float, stall: float = 0.0) -> Any:
    served = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        rng = random.Random(served)  # the n-th request stalls the same way in every run
        tokens = int((await request.json())["max_tokens"])
        text = streams.text(tokens * streams.CHARS_PER_TOKEN)
        parts = streams.deltas(text)
        resp = web.StreamResponse(
            status=200,
            headers={"content-type": "text/event-stream", "request-id": f"req_bench_{uuid.uuid4().hex[:12]}"},
        )
        await resp.prepare(request)
        await resp.write(sse.head("claude-sonnet-4-6"))
        per_tick = max(1, round(rate * TICK))
        loop = asyncio.get_running_loop()
        start = loop.time()
        ticks = -(-len(parts) // per_tick)
        stall_at = rng.randrange(1, ticks) if stall and ticks > 1 else -1
        for i in range(0, len(parts), per_tick):
            await resp.write(b"".join(sse.delta(p) for p in parts[i : i + per_tick]))
            if i // per_tick == stall_at:
                gap = stall * rng.uniform(0.25, 1.0)
                await asyncio.sleep(gap)
                start += gap
            delay = start + (i // per_tick + 1) * TICK - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        await resp.write(sse.tail("max_tokens", tokens))
        await resp.write_eof()
        return resp

    return handle


async def serve(preload: list[int], pace: float | None, stall: float = 0.0) -> None:
    if pace:
        app = web.Application()
        app.router.add_post("/v1/messages", paced_handler(pace, stall))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"http://127.0.0.1:{port}", flush=True)
        stop = runner.cleanup
    else:
        for t in preload:
            body(t)
        server = ProviderServer(responder=respond)
        print(await server.start(), flush=True)
        stop = server.stop
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await stop()


class ServerProcess:
    """A `bench.server` child; its URL is read from its first line of output."""

    def __init__(self, preload: list[int], pace: float | None = None, stall: float = 0.0) -> None:
        cmd = [sys.executable, "-m", "bench.server", *map(str, preload)] + (["--pace", str(pace)] if pace else [])
        cmd += ["--stall", str(stall)] if stall else []
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.proc.kill()
            raise RuntimeError("the bench provider server did not start")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("tokens", nargs="*", type=int)
    p.add_argument("--pace", type=float, default=None)
    p.add_argument("--stall", type=float, default=0.0, help="with --pace: each stream stalls once, up to this long")
    a = p.parse_args()
    asyncio.run(serve(a.tokens, a.pace, a.stall))
