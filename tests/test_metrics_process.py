"""`residents run --metrics-port`, as its operator scrapes it: the metrics before and after a turn agree
with the ledger, `/readyz` flips when the room goes away and back when it returns, `--log-format json`
lines carry the ids of the work in hand, and a port in use is one line naming the option.

Real parts throughout: `residents run` as a subprocess, discord.py against the local room over real
sockets, the anthropic SDK against the local provider server, scraped over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from conftest import ROOT
from prometheus_client.parser import text_string_to_metric_families
from roomkit import running_room

from residents.ledger import Ledger
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import RoomServer

MODEL = "claude-3-opus-20240229"
CAIRN = f"""name: cairn
model: {MODEL}
max_tokens: 1024
policy:
  floor: {{cooldown_seconds: 0, reply_to: mentions}}
  retries: {{max_attempts: 2, backoff_seconds: 0}}
discord:
  token_env: METRICS_CAIRN_TOKEN
  channels: [general]
"""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample `name` with exactly these labels; 0 when absent (a counter not yet counted)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def words(n_chars: int) -> str:
    return " ".join(f"harbour{i:05d}" for i in range(n_chars // 13 + 1))[:n_chars]


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(CAIRN)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@contextlib.asynccontextmanager
async def running(
    base: Path, room_url: str, provider_url: str, *args: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[str]]]:
    """`residents run` against the room; on exit SIGINT, and its stderr lines once it stopped (exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(ANTHROPIC_BASE_URL=provider_url, ANTHROPIC_API_KEY="k", PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "residents",
        "run",
        "--discord-api",
        room_url,
        "--db",
        str(base / "ledger.db"),
        *args,
        cwd=base,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    err: list[str] = []
    try:
        yield proc, err
        proc.send_signal(signal.SIGINT)
        _, raw = await asyncio.wait_for(proc.communicate(), timeout=20)
        err += raw.decode().splitlines()
        assert proc.returncode == 0, "\n".join(err[-30:])
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url) as resp:
        return resp.status, await resp.text()


async def until(
    http: aiohttp.ClientSession, url: str, status: int, proc: asyncio.subprocess.Process, timeout: float = 40.0
) -> str:
    """Poll `url` until it answers `status`; its body then. Fails at once if `proc` stopped."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: tuple[int, str] | None = None
    while loop.time() < deadline:
        if proc.returncode is not None:
            assert proc.stderr is not None
            raise AssertionError(f"residents run stopped ({proc.returncode}): {(await proc.stderr.read()).decode()}")
        with contextlib.suppress(aiohttp.ClientConnectionError):
            last = await get(http, url)
            if last[0] == status:
                return last[1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} did not answer {status} within {timeout}s; last: {last}")


async def test_metrics_scraped_before_and_after_a_turn_agree_with_the_ledger(base: Path) -> None:
    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}"
    text = words(4500)
    provider = ProviderServer()
    await provider.start()
    # The first attempt is cut by an overloaded error after some text (a retry-abandoned stump); the
    # second is cut at the output ceiling (a truncation: partial posts and a receipt).
    provider.enqueue(
        [
            Call(sse=sse.stream("The harbour at dawn", finish=False, model=MODEL) + sse.error("overloaded_error")),
            Call(sse=sse.stream(text, "max_tokens", 1024, model=MODEL)),
        ]
    )
    try:
        async with (
            running_room(["general"]) as room,
            aiohttp.ClientSession() as http,
            running(
                base, room.url, provider.url, "--metrics-port", str(port), "--log-format", "json", "--log-level", "info"
            ) as (proc, err),
        ):
            assert await until(http, f"{metrics_url}/healthz", 200, proc) == "ok\n"
            await until(http, f"{metrics_url}/readyz", 200, proc)
            status, body = await get(http, f"{metrics_url}/metrics")
            assert status == 200
            before = parse(body)
            assert value(before, "residents_generations_total", residence="cairn", status="truncated") == 0
            assert (
                "residents_generations_total",
                frozenset({("residence", "cairn"), ("status", "truncated")}),
            ) in before
            assert value(before, "residents_gateway_sessions", residence="cairn") == 1
            assert value(before, "residents_ledger_writable") == 1
            assert value(before, "residents_ready") == 1

            channel = room.channel_id("general")
            room.post("general", "alice", "Describe the harbour, @cairn", mentions=["cairn"])
            await room.wait_for_message(
                lambda m: m["author"] == "cairn" and "Output ceiling" in m["content"], timeout=30
            )
            await asyncio.sleep(0.3)  # the receipt is in the room a moment before the ledger says so
            after = parse((await get(http, f"{metrics_url}/metrics"))[1])
            await until(http, f"{metrics_url}/readyz", 200, proc)

        led = await Ledger.open(base / "ledger.db")
        try:
            [gid] = [r[0] for r in await led.db.execute_fetchall("SELECT id FROM generations")]
            g = await led.get_generation(gid)
        finally:
            await led.close()
        assert g is not None and g.status == "truncated"
        first, second = g.attempts
        assert first.error == "overloaded_error" and second.outcome == "truncated"

        assert value(after, "residents_generations_total", residence="cairn", status="truncated") == 1
        assert value(after, "residents_generations_total", residence="cairn", status="completed") == 0
        assert value(after, "residents_truncations_total", residence="cairn") == 1
        assert value(after, "residents_provider_failures_total", residence="cairn", kind="overloaded_error") == 1
        assert value(after, "residents_attempts_total", residence="cairn", outcome="abandoned") == 1
        stumps = {(s.cause, s.scope) for s in g.stumps}
        assert stumps == {("retry-abandoned", "attempt"), ("max_tokens", "output")}
        for cause, scope in stumps:
            assert value(after, "residents_stumps_total", residence="cairn", cause=cause, scope=scope) == 1
        # tokens as the provider counted them: only the second attempt's stream said how many
        tokens = {"residence": "cairn", "gen_ai_request_model": MODEL, "gen_ai_token_type": "output"}
        assert value(after, "gen_ai_client_token_usage_sum", **tokens) == second.output_tokens == 1024
        assert value(after, "gen_ai_client_token_usage_count", **tokens) == 1
        ttft = {"residence": "cairn", "gen_ai_request_model": MODEL}
        assert value(after, "gen_ai_client_operation_time_to_first_chunk_seconds_count", **ttft) == 2
        assert value(after, "residents_turn_duration_seconds_count", residence="cairn") == 1
        assert value(after, "residents_ledger_commit_duration_seconds_count") > value(
            before, "residents_ledger_commit_duration_seconds_count"
        )
        kinds = [p.kind for p in g.posts]
        assert kinds[-1] == "receipt" and set(kinds[:-1]) == {"partial"}
        assert value(after, "residents_posts_delivered_total", residence="cairn", kind="partial") == len(kinds) - 1
        assert value(after, "residents_posts_delivered_total", residence="cairn", kind="receipt") == 1
        assert value(after, "residents_outbox_posts", channel=channel) == 0
        assert value(after, "residents_outbox_oldest_post_age_seconds", channel=channel) == 0

        # --log-format json: every line one object; the retry's line names the work it belongs to
        lines = [json.loads(line) for line in err]
        [retry] = [e for e in lines if "abandoned after" in e["message"]]
        assert retry["residence"] == "cairn" and retry["channel"] == g.channel == channel
        assert (retry["generation"], retry["attempt"]) == (g.id, first.id)
        assert retry["level"] == "INFO" and retry["logger"] == "residents.generation.attempts"
        assert not any("generation" in e for e in lines if "logging in using static token" in e["message"])
    finally:
        await provider.stop()


async def test_readiness_flips_when_the_room_goes_away_and_back_when_it_returns(base: Path) -> None:
    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}"
    provider = ProviderServer()
    await provider.start()
    try:
        async with (
            running_room(["general"]) as room,
            aiohttp.ClientSession() as http,
            running(base, room.url, provider.url, "--metrics-port", str(port)) as (proc, _),
        ):
            await until(http, f"{metrics_url}/readyz", 200, proc)
            room_port = int(room.url.rpartition(":")[2])
            await room.stop()  # the room goes away: the gateway closes, reconnecting is refused
            assert "not ready: cairn: no gateway session" in await until(http, f"{metrics_url}/readyz", 503, proc)
            assert (await get(http, f"{metrics_url}/healthz"))[0] == 200  # the process still runs
            down = parse((await get(http, f"{metrics_url}/metrics"))[1])
            assert value(down, "residents_gateway_sessions", residence="cairn") == 0
            assert value(down, "residents_ready") == 0
            await room.start(port=room_port)
            assert await until(http, f"{metrics_url}/readyz", 200, proc, timeout=60) == "ready\n"
            up = parse((await get(http, f"{metrics_url}/metrics"))[1])
            assert value(up, "residents_gateway_sessions", residence="cairn") == 1
    finally:
        await provider.stop()


async def test_a_metrics_port_in_use_is_one_line_naming_the_option(base: Path) -> None:
    provider = ProviderServer()
    await provider.start()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        room = RoomServer(["general"])
        await room.start()
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
            env.update(ANTHROPIC_BASE_URL=provider.url, ANTHROPIC_API_KEY="k", PYTHONPATH=str(ROOT))
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "residents", "run", "--discord-api", room.url, "--metrics-port", str(port)),
                cwd=base,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
        finally:
            await room.stop()
    finally:
        taken.close()
        await provider.stop()
    assert proc.returncode == 2, err.decode()
    assert out == b""
    assert err.decode().splitlines() == [
        f"residents: --metrics-port {port}: 127.0.0.1:{port} is already in use; pass another port (0: any free port)"
    ]
    assert not (base / "data" / "ledger.db").exists()  # refused before the ledger or the provider was touched
