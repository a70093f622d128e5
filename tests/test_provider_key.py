"""The provider at the edges of `residents run` and `residents demo`: a residence's own call timeout,
and a wrong or revoked key (checked once at start-up; during a run an ERROR for the operator and at
most one room notice per channel per window).

Everything is real: `residents run` as a subprocess or its own `run_bots`, discord.py against the
local room, the anthropic SDK against the local provider server, SQLite as the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from pathlib import Path

import discord
import pytest
from conftest import ROOT, specimen
from discordkit import deployed, opts
from test_discord_e2e import BOUNDS, END_TEXT, FIRST, REST, contents, res

from residents import truth
from residents.delivery.keys import KeyRejections
from residents.demo import run as demo_run
from residents.ledger import Ledger
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider import KeyRejected
from residents.provider.anthropic_messages import AnthropicProvider, make_client

try:
    from roomkit import eventually, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import eventually, running_room

MODEL = "claude-3-opus-20240229"
FRAGMENT = "The harbour holds its boats close in winter, and the"
KEY_ENV = "ANTHROPIC_API_KEY"  # where `residents run` reads the Anthropic provider's key
GOOD_KEY, BAD_KEY = "sk-local-good-0123456789", "sk-local-revoked-9876543210"


def stalled(model: str = MODEL, seconds: float = 2.0) -> Call:
    """A stream that sends a fragment, then goes silent for `seconds` before the connection drops."""
    return Call(
        sse=sse.head(model) + b"".join(sse.delta(p) for p in sse.pieces(FRAGMENT)), end="stall", stall_seconds=seconds
    )


async def strict_clean(db: Path) -> None:
    ledger = await Ledger.open(db, read_only=True)
    try:
        assert await verify(ledger, unsettled_as_violations=True) == []
    finally:
        await ledger.close()


# ------------------------------------------------------------------------------ timeouts per residence


async def test_run_cuts_a_stalled_stream_at_each_residences_own_timeout(tmp_path):
    """cairn (0.5 s) cuts the silent stream as read-timeout and retries; sill (30 s) waits out the stall."""
    quick = res("cairn", policy={"retries": {"max_attempts": 2, "backoff_seconds": 0, "timeout_seconds": 0.5}})
    patient = res("sill", policy={"retries": {"max_attempts": 2, "backoff_seconds": 0, "timeout_seconds": 30}})
    async with deployed(tmp_path, [quick, patient], calls=[stalled(), Call(sse=specimen("end-turn.sse"))]) as d:
        d.room.post("general", "alice", "the harbour, @cairn?", mentions=["cairn"])
        [m] = await d.wait_bot_messages(1, timeout=8)
        assert m["author"] == "cairn" and m["content"] == END_TEXT  # the retry's text only
        d.provider.enqueue([stalled(seconds=1.0), Call(sse=sse.stream("Sill says a short thing.", "end_turn", 6))])
        d.room.post("general", "bob", "and you, @sill?", mentions=["sill"])
        await d.wait_bot_messages(2, timeout=8)
        await d.quiet(0.1)
        [g] = await d.generations("cairn")
        assert g.status == "completed" and [a.outcome for a in g.attempts] == ["abandoned", "completed"]
        cut = g.attempts[0]
        assert (cut.error, cut.discard_reason, cut.text) == ("read-timeout", truth.RETRY_ABANDONED, FRAGMENT)
        assert [(s.cause, s.text, s.published) for s in g.stumps] == [(truth.RETRY_ABANDONED, FRAGMENT, False)]
        [h] = await d.generations("sill")
        assert h.status == "completed" and h.attempts[0].error == "connection-cut"  # 1 s of silence is within 30 s
    await strict_clean(tmp_path / "ledger.db")


async def test_demo_residents_take_their_own_timeout(tmp_path):
    """`residents demo` builds its residents the same way: sill's 0.5 s cuts a stalled stream as read-timeout."""
    saved = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
    cast = []
    for r in demo_run.residences("scripted", None):
        if r.name == "sill":
            retries = r.policy.retries.model_copy(update={"timeout_seconds": 0.5})
            r = r.model_copy(update={"policy": r.policy.model_copy(update={"retries": retries})})
        cast.append(r)
    demo = await demo_run.start(str(tmp_path / "demo.db"), port=0, cast=cast)
    try:
        assert demo.provider is not None
        demo.provider.enqueue([stalled("claude-sonnet-4-6")])
        m = demo.room.post("general", "bob", "@sill What did Cairn leave out?")
        g = await demo.ledger.get_generation(await demo_run._settled(demo, str(m["id"]), "sill", timeout=15))
        assert g is not None and g.status == "completed"
        assert (g.attempts[0].error, g.attempts[0].text) == ("read-timeout", FRAGMENT)
        assert any(s.cause == truth.RETRY_ABANDONED and s.text == FRAGMENT for s in g.stumps)
    finally:
        await demo_run.shutdown(demo)
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved
    await strict_clean(tmp_path / "demo.db")


# ------------------------------------------------------------------------------ the key at start-up


RESIDENCE_YAML = f"""name: cairn
model: {MODEL}
max_tokens: 1024
discord:
  token_env: RESIDENTS_KEY_TEST_TOKEN
  channels: [general]
"""


async def start_run(tmp_path: Path, room_url: str, provider_url: str, key: str | None) -> asyncio.subprocess.Process:
    """`residents run --discord-api ROOM` as an operator starts it, with the provider and key given."""
    (tmp_path / "residences").mkdir(exist_ok=True)
    (tmp_path / "residences" / "cairn.yaml").write_text(RESIDENCE_YAML)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["ANTHROPIC_BASE_URL"] = provider_url
    if key is not None:
        env[KEY_ENV] = key
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "residents",
        "run",
        "--discord-api",
        room_url,
        "--db",
        str(tmp_path / "ledger.db"),
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_stops_start_up_with_one_line_naming_the_variable(tmp_path, status):
    provider = ProviderServer(api_keys={GOOD_KEY}, reject_status=status)
    await provider.start()
    try:
        async with running_room(["general"]) as room:
            proc = await start_run(tmp_path, room.url, provider.url, BAD_KEY)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            lines = [ln for ln in err.decode().splitlines() if ln.strip()]
            assert proc.returncode == 2 and len(lines) == 1, err.decode()[-2000:]
            assert lines[0].startswith(f"residents: {KEY_ENV}: ") and f"HTTP {status}" in lines[0]
            assert BAD_KEY not in lines[0] and BAD_KEY[-8:] not in lines[0] and "Traceback" not in err.decode()
            assert not room.snapshot()["bots"] or not any(b.get("connected") for b in room.snapshot()["bots"])
            assert provider.requests == []  # no conversation was attempted with the refused key
            assert not (tmp_path / "ledger.db").exists()
    finally:
        await provider.stop()


async def test_a_provider_without_the_models_endpoint_starts_fine(tmp_path):
    """A 404 from `GET /v1/models` is not an error: the check is asked once, and the bot connects."""
    provider = ProviderServer(models=False, api_keys={GOOD_KEY})
    await provider.start()
    try:
        async with running_room(["general"]) as room:
            proc = await start_run(tmp_path, room.url, provider.url, GOOD_KEY)
            try:
                await eventually(
                    lambda: (
                        proc.returncode is not None
                        or any(b.get("connected") and b.get("commands") for b in room.snapshot()["bots"])
                    ),
                    timeout=30,
                )
                assert proc.returncode is None, (await proc.stderr.read()).decode()[-2000:]
                assert provider.model_requests == 1
                proc.send_signal(signal.SIGINT)
                out, err = await asyncio.wait_for(proc.communicate(), timeout=20)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0, err.decode()[-2000:]
            assert "Traceback" not in err.decode() and " ERROR " not in err.decode()
    finally:
        await provider.stop()


async def test_the_check_names_an_unset_key_and_lets_an_unreachable_provider_pass(tmp_path, caplog):
    provider = ProviderServer(api_keys={GOOD_KEY})
    await provider.start()
    client, good = make_client(provider.url, ""), make_client(provider.url, GOOD_KEY)
    try:
        with pytest.raises(KeyRejected) as info:
            await AnthropicProvider(client, key_set=False).check_key()
        assert str(info.value).startswith(f"{KEY_ENV}: ") and "not set" in str(info.value)
        await AnthropicProvider(good).check_key()  # the right key passes
        assert provider.model_requests == 2
    finally:
        await client.close()
        await good.close()
        await provider.stop()
    caplog.set_level(logging.WARNING)
    gone = make_client(provider.url, GOOD_KEY)  # the server has stopped: nothing listens there now
    try:
        await AnthropicProvider(gone).check_key()
    finally:
        await gone.close()
    assert any("could not be checked" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------ a key revoked during a run


def test_the_key_notice_is_a_compact_impersonal_fact():
    line = truth.key_rejected_notice("authentication_error")
    assert len(line) <= truth.MAX_LINE and not re.search(r"\byour?\b", line, re.I)
    assert line.startswith("Provider rejected the API key (authentication_error)") and "10 minutes" in line
    assert [
        truth.key_rejected(k)
        for k in (
            "authentication_error",
            "permission_error",
            "http-401",
            "http-403",
            "overloaded_error",
            "http-404",
            None,
        )
    ] == [True] * 4 + [False] * 3


async def test_a_key_revoked_mid_run_logs_errors_and_tells_each_channel_once_per_window(
    tmp_path, caplog, expected_errors
):
    """Every refused call is an ERROR naming the remedy; a channel hears of it once per ten minutes, from
    whichever resident failed first; after the window, once more."""
    expected_errors.append("rejected the API key")
    caplog.set_level(logging.ERROR, logger="residents")
    now = [1000.0]
    kr = KeyRejections(KEY_ENV, clock=lambda: now[0])
    both = {"token_env": "X", "channels": ["general", "dock"]}
    residents = [
        res("cairn", discord={**both, "token_env": "CAIRN_DISCORD_TOKEN"}),
        res("sill", discord={**both, "token_env": "SILL_DISCORD_TOKEN"}),
    ]
    notice = "-# " + truth.key_rejected_notice("authentication_error")
    async with deployed(
        tmp_path, residents, channels=("general", "dock"), expected_errors=["rejected the API key"], key_rejections=kr
    ) as d:
        d.provider.api_keys = {"sk-the-replacement"}  # the running process's key is revoked

        async def mention(who: str, channel: str, failed_before: int) -> None:
            d.room.post(channel, "alice", f"hello @{who}", mentions=[who])

            async def settled() -> bool:
                gens = await d.generations("cairn") + await d.generations("sill")
                return sum(g.status == "failed" for g in gens) > failed_before

            for _ in range(500):
                if await settled():
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError(f"no failed generation after mentioning {who} in {channel}")
            await d.quiet(0.2)

        await mention("cairn", "general", 0)
        assert [m["content"] for m in d.bot_messages("general")] == [notice]
        await mention("cairn", "general", 1)  # within the window: nothing more in the room
        await mention("sill", "general", 2)  # another resident, same channel, same window: nothing
        assert [m["content"] for m in d.bot_messages("general")] == [notice]
        await mention("sill", "dock", 3)  # another channel is told once too
        assert [(m["author"], m["content"]) for m in d.bot_messages("dock")] == [("sill", notice)]
        now[0] += truth.KEY_NOTICE_SECONDS - 1
        await mention("cairn", "general", 4)
        assert len(d.bot_messages("general")) == 1
        now[0] += 1  # ten minutes after the first notice
        await mention("sill", "general", 5)
        assert [(m["author"], m["content"]) for m in d.bot_messages("general")] == [("cairn", notice), ("sill", notice)]
        assert d.provider.rejected == 6 and len(d.provider.requests) == 6  # one call each: a 401 is not retried
        gens = await d.generations("cairn") + await d.generations("sill")
        assert all(g.status == "failed" and g.attempts[-1].error == "authentication_error" for g in gens)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    remedies = [e for e in errors if "rejected the API key" in e]
    assert len(remedies) == 6 and all(f"valid key in {KEY_ENV}" in e for e in remedies), errors
    await strict_clean(tmp_path / "ledger.db")


async def test_a_key_refused_during_a_continue_is_the_operators_error_and_one_notice(tmp_path, caplog, expected_errors):
    """A /continue whose segment gets a 401 is answered; the operator gets the ERROR with the remedy each time;
    the room gets the key notice once per window, never a receipt blaming a provider error; once the key
    is good again the next /continue completes the output, and the ledger verifies (--strict)."""
    expected_errors.append("rejected the API key")
    caplog.set_level(logging.ERROR, logger="residents")
    now = [1000.0]
    kr = KeyRejections(KEY_ENV, clock=lambda: now[0])
    policy = {"continuation": {"standing": "on-request", **BOUNDS}}
    notice = "-# " + truth.key_rejected_notice("authentication_error")
    async with deployed(
        tmp_path,
        [res(max_tokens=600, policy=policy)],
        calls=[Call(sse=specimen("cont-first.sse"))],
        expected_errors=["rejected the API key"],
        key_rejections=kr,
    ) as d:
        d.room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        first = [m["content"] for m in d.bot_messages()]
        [g] = await d.generations()
        d.provider.api_keys = {"sk-the-replacement"}  # the running process's key is revoked

        for times in (1, 2):  # the second inside the window: answered, logged, nothing in the room
            out = await d.command("moddy", "continue", opts(generation=g.id))
            assert contents(out)[-1] == f"Continued {g.id}: now truncated, 1 segment(s), continuation error."
            await d.quiet(0.1)
            assert [m["content"] for m in d.bot_messages()] == first + [notice]
            assert d.provider.rejected == times
        [g] = await d.generations()
        assert (g.status, g.text, g.continuation_ended) == ("truncated", FIRST, "error")
        assert [a.error for a in g.attempts] == [None, "authentication_error", "authentication_error"]

        d.provider.api_keys = None  # a good key again
        d.provider.enqueue([Call(sse=specimen("cont-rest-with-overlap.sse"))])
        out = await d.command("moddy", "continue", opts(generation=g.id))
        assert contents(out)[-1] == f"Continued {g.id}: now completed, 2 segment(s), continuation completed."
        await d.quiet(0.1)
        [g] = await d.generations()
        assert (g.status, g.text) == ("completed", FIRST + REST[48:])
        assert not any("Provider error" in m["content"] or "provider error" in m["content"] for m in d.bot_messages())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    remedies = [e for e in errors if "rejected the API key" in e]
    assert len(remedies) == 2 and all(f"valid key in {KEY_ENV}" in e and g.id in e for e in remedies), errors
    await strict_clean(tmp_path / "ledger.db")
