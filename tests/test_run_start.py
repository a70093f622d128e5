"""How `residents run` starts, as its operator sees it: every missing variable in one line, a table of who
runs where with each bot's invite URL, each log line once at the level asked, and no false "websocket is
41 s behind" against the local room.

Real parts throughout: `residents run` as a subprocess, discord.py against the local room over real
sockets, the anthropic SDK against the local provider server.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from residents import cli
from residents.discord.startup import invite_url
from residents.localservers.provider import ProviderServer
from residents.localservers.room import gateway

try:
    from roomkit import running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import running_bot, running_room

CAIRN = """name: cairn
model: claude-3-opus-20240229
max_tokens: 1024
discord:
  token_env: RUN_START_CAIRN_TOKEN
  channels: [general]
"""
SILL = """name: sill
model: claude-sonnet-4-6
max_tokens: 1024
policy:
  continuation: {standing: on-request, max_segments: 1, max_output_tokens: 2048, min_progress_chars: 1,
                 similarity_abort: 0.9}
discord:
  token_env: RUN_START_SILL_TOKEN
  channels: [general, dock]
"""


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(CAIRN)
    (tmp_path / "residences" / "sill.yaml").write_text(SILL)
    monkeypatch.chdir(tmp_path)
    for var in ("RUN_START_CAIRN_TOKEN", "RUN_START_SILL_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_every_missing_variable_is_named_at_once_in_one_line(
    base: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli.main(["run", "--db", "ledger.db"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "residents: not set in the environment: "
        "RUN_START_CAIRN_TOKEN (residences/cairn.yaml: discord.token_env), "
        "RUN_START_SILL_TOKEN (residences/sill.yaml: discord.token_env), "
        "ANTHROPIC_API_KEY (the provider key; or set ANTHROPIC_BASE_URL to an Anthropic-compatible server)"
    )
    monkeypatch.setenv("RUN_START_SILL_TOKEN", "t")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    assert cli.main(["run", "--db", "ledger.db"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert (
        line
        == "residents: not set in the environment: RUN_START_CAIRN_TOKEN (residences/cairn.yaml: discord.token_env)"
    )
    assert not (base / "ledger.db").exists()


def test_the_invite_url_asks_for_the_scopes_and_permissions_a_resident_needs() -> None:
    # bot + applications.commands; View Channels (1 << 10) + Send Messages (1 << 11) + Read Message History (1 << 16)
    assert invite_url(1234) == (
        "https://discord.com/oauth2/authorize?client_id=1234&scope=bot+applications.commands&permissions=68608"
    )


async def start_run(base: Path, room_url: str, provider_url: str, *args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(ANTHROPIC_BASE_URL=provider_url, ANTHROPIC_API_KEY="k", PYTHONPATH=str(ROOT))
    return await asyncio.create_subprocess_exec(
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
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_until_table(base: Path, *args: str) -> tuple[list[str], str]:
    """`residents run` against a local room with #general and #dock: the table it prints, then its stderr
    once SIGINT stopped it."""
    provider = ProviderServer()
    await provider.start()
    try:
        async with running_room(["general", "dock"]) as room:
            proc = await start_run(base, room.url, provider.url, *args)
            try:
                assert proc.stdout is not None
                first = (await asyncio.wait_for(proc.stdout.readline(), timeout=40)).decode()
                assert first.startswith("residents run: 2 residents connected"), first
                lines = [first.rstrip("\n")]
                while True:
                    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=5)).decode()
                    lines.append(line.rstrip("\n"))
                    if line.startswith("invites") or not line:
                        break
                proc.send_signal(signal.SIGINT)
                _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0, err.decode()[-2000:]
            return lines, err.decode()
    finally:
        await provider.stop()


async def test_run_shows_who_runs_where_once_ready_and_logs_each_line_once(base: Path) -> None:
    table, err = await run_until_table(base)
    assert table[0] == f"residents run: 2 residents connected; ledger {base / 'ledger.db'}"
    assert re.split(r"\s{2,}", table[1].strip()) == ["resident", "bot user", "model", "channels", "continuation"]
    assert re.split(r"\s{2,}", table[2].strip()) == ["cairn", "cairn", "claude-3-opus-20240229", "#general", "none"]
    assert re.split(r"\s{2,}", table[3].strip()) == [
        "sill",
        "sill",
        "claude-sonnet-4-6",
        "#general, #dock",
        "on-request",
    ]
    assert table[4] == "invites: none needed, the bots are in the local room"
    # each log line once, in one plain format (discord.py's own handler would print it again, coloured)
    assert "\x1b[" not in err and "Traceback" not in err
    connects = [ln for ln in err.splitlines() if "logging in using static token" in ln]
    assert len(connects) == 2 and all(" INFO discord.client: " in ln for ln in connects), err[-3000:]
    assert "Can't keep up" not in err


async def test_log_level_decides_what_run_logs(base: Path) -> None:
    _, err = await run_until_table(base, "--log-level", "warning")
    assert " INFO " not in err and " DEBUG " not in err, err[-2000:]
    _, err = await run_until_table(base, "--log-level", "debug")
    assert " DEBUG discord.gateway: " in err


def test_a_log_level_that_does_not_exist_is_refused(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--log-level", "loud"]) == 2
    assert "'loud' is not one of 'debug', 'info', 'warning', 'error'" in capsys.readouterr().err


async def test_the_local_room_acknowledges_a_heartbeat_after_the_bot_has_noted_sending_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """discord.py measures an ACK against the last heartbeat its thread noted as sent; an ACK read before
    that note (as on loopback) shows as a whole interval behind, which is what "41 s behind" was."""
    interval = 0.4
    monkeypatch.setattr(gateway, "HEARTBEAT_INTERVAL_MS", int(interval * 1000))
    async with running_room() as room:
        async with (
            running_bot(room.url, "local-cairn") as a,
            running_bot(room.url, "local-sill") as b,
            running_bot(room.url, "local-tide") as c,
            running_bot(room.url, "local-fen") as d,
        ):
            bots = [a, b, c, d]
            seen: list[set[float]] = [set() for _ in bots]  # each ACK leaves a new latency figure
            loop = asyncio.get_running_loop()
            end = loop.time() + 6
            while loop.time() < end:
                for figures, bot in zip(seen, bots, strict=False):
                    figures.add(bot.latency)
                await asyncio.sleep(0.005)
    assert all(len(figures) >= 10 for figures in seen), [len(f) for f in seen]
    behind = sorted(f for figures in seen for f in figures if interval / 2 <= f < float("inf"))
    assert not behind, f"ACKs measured against an earlier heartbeat: {behind}"
