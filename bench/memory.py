"""Memory of the real `residents run` process: idle, and with 100 generations of 16 KB in flight.

`residents run` is started as the operator starts it (a child process, `--discord-api` pointed at the
local room), with 10 residences on 10 channels; the local room and the local provider run in this
process, so the child's memory is the product's alone. Figures are read from the child's
/proc/PID/status: VmRSS (resident now) and VmHWM (the peak since it started).

- idle: once every bot is connected and the start-up table printed, and 2 s later;
- load: one person's message in each channel mentions all 10 residents, so 100 generations run at once,
  each streamed 16,384 characters (4,096 tokens) over ~6 s; peak VmHWM while they run, and VmRSS once
  every reply is delivered and the process has been idle 2 s again.

`python -m bench.memory` prints JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import RoomServer

from . import streams
from .common import ROOT, scratch

log = logging.getLogger(__name__)

RESIDENTS = 10
CHANNELS = 10
TOKENS = 4096  # 16,384 characters each
STREAM_SECONDS = 6.0
MODEL = "claude-sonnet-4-6"


def residence_yaml(i: int) -> str:
    return (
        f"name: r{i}\nmodel: {MODEL}\nmax_tokens: {TOKENS}\n"
        "policy:\n  floor: {cooldown_seconds: 0, max_resident_run: 100}\n"
        f"discord:\n  token_env: BENCH_R{i}_TOKEN\n  channels: [{', '.join(f'c{c}' for c in range(CHANNELS))}]\n"
    )


def status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of process `pid`, in MiB."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(line.split()[1]) / 1024
    return out


def _call(text: str) -> Call:
    body = sse.stream(text, "end_turn", TOKENS, model=MODEL)
    pieces = 60
    return Call(sse=body, chunk_bytes=-(-len(body) // pieces), chunk_delay=STREAM_SECONDS / pieces)


async def measure(folder: Path) -> dict[str, Any]:
    for i in range(RESIDENTS):
        (folder / "residences").mkdir(exist_ok=True)
        (folder / "residences" / f"r{i}.yaml").write_text(residence_yaml(i))
    text = streams.text(TOKENS * streams.CHARS_PER_TOKEN)
    provider = ProviderServer(lambda _body: _call(text))
    await provider.start()
    room = RoomServer([f"c{c}" for c in range(CHANNELS)])
    await room.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(ANTHROPIC_BASE_URL=provider.url, ANTHROPIC_API_KEY="k", PYTHONPATH=ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "residents", "run", "--discord-api", room.url, "--db", str(folder / "ledger.db"),
        cwd=folder, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out: dict[str, Any] = {"residents": RESIDENTS, "channels": CHANNELS, "chars_each": len(text)}
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
        if not first.startswith("residents run:"):
            raise RuntimeError(f"residents run did not start: {first!r}")
        await asyncio.sleep(2.0)
        out["idle"] = status(proc.pid)
        names = [f"r{i}" for i in range(RESIDENTS)]
        expected = RESIDENTS * CHANNELS * -(-len(text) // 2000)  # posts of at most 2,000 characters
        t0 = time.monotonic()
        for c in range(CHANNELS):
            room.post(
                f"c{c}", "alice", "Tell me about the harbour, " + " ".join(f"@{n}" for n in names), mentions=names
            )
        peak_during, in_flight_max = 0.0, 0
        while True:
            await asyncio.sleep(0.1)
            posted = sum(1 for c in range(CHANNELS) for m in room.messages(f"c{c}") if m["bot"])
            s = status(proc.pid)
            peak_during = max(peak_during, s["VmRSS"])
            in_flight_max = max(in_flight_max, len(provider.requests))
            if posted >= expected or time.monotonic() - t0 > 180:
                break
        out["load_s"] = time.monotonic() - t0
        out["requests"] = len(provider.requests)
        out["posts"] = posted
        out["posts_expected"] = expected
        out["peak"] = status(proc.pid)
        await asyncio.sleep(2.0)
        out["after"] = status(proc.pid)
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await room.stop()
        await provider.stop()
    if out.get("posts", 0) < expected:
        raise RuntimeError(f"only {out.get('posts')} of {expected} posts reached the room")
    return {
        **out,
        "idle_rss_mib": out["idle"]["VmRSS"],
        "load_peak_rss_mib": out["peak"]["VmHWM"],
        "after_rss_mib": out["after"]["VmRSS"],
    }


async def run() -> dict[str, Any]:
    folder = Path(scratch("memory"))
    try:
        return await measure(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # python -m bench.memory
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(asyncio.run(run()), indent=1))
