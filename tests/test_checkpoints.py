"""Checkpoints and the head, where witnesses are: `ledger.checkpoints` posts the chain's head as one subtext
line at start and every `every`; /provenance with no message answers the head; a channel the posting bot
cannot find or post in stops start-up with one line.

Real parts: `run_bots` (what `residents run` runs) with real discord.py bots on the local room over real
sockets, the local provider behind the real SDK, a real ledger read back with the database's own client: a
SQLite file, and for the head posted and answered, a PostgreSQL database too (`backend`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import residence, specimen
from discordkit import Deployed, deployed
from ledgerkit import Backend, rows

from residents import truth
from residents.config import Checkpoints
from residents.discord.run import Deployment, StartupError, run_bots
from residents.localservers.provider import Call, ProviderServer
from residents.localservers.room import load_layout

ROOT = Path(__file__).resolve().parent.parent

try:
    from roomkit import running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import running_room

CHECKPOINT = re.compile(
    r"-# Ledger checkpoint at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC: head `(\d+):([0-9a-f]{64})` "
    r"\(entry:SHA-256; `residents ledger verify --head` checks it later\)"
)
EMPTY = re.compile(
    r"-# Ledger checkpoint at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC: the chain is empty \(no entry yet\)\."
)


def resident(name: str, *channels: str, commands: bool = False) -> Any:
    return residence(
        name=name,
        max_tokens=1024,
        policy={"retries": {"max_attempts": 3, "backoff_seconds": 0}, "floor": {"cooldown_seconds": 0}},
        discord={"token_env": f"{name.upper()}_TOKEN", "channels": list(channels or ["general"]), "commands": commands},
    )


def every(duration: str, channel: str = "witness") -> Checkpoints:
    return Checkpoints.model_validate({"channel": channel, "every": duration})


def chain(db: Path | str) -> dict[int, str]:
    """Every entry's hash by seq, read straight from the file or the database."""
    return {int(seq): str(digest) for seq, digest in rows(str(db), "SELECT seq, hash FROM chain")}


def heads(d: Deployed, channel: str = "witness") -> list[tuple[int, str] | None]:
    """The head each checkpoint line names, oldest first (None: the chain was empty)."""
    out: list[tuple[int, str] | None] = []
    for m in d.messages(channel):
        if EMPTY.fullmatch(m["content"]):
            out.append(None)
        else:
            found = CHECKPOINT.fullmatch(m["content"])
            assert found, m["content"]
            out.append((int(found[2]), found[3]))
    return out


async def test_the_head_is_posted_at_start_and_after_every_interval_and_is_in_the_chain(backend: Backend, tmp_path):
    """sill is the commands bot, so sill posts; the first line comes as the bots are ready (the chain is
    empty), then one every 2 s; after a reply, a checkpoint names the chain's last entry, and while the
    ledger is idle every checkpoint names that same head: posting one records nothing."""
    calls = [Call(sse=specimen("ceiling-1024.sse"))]
    async with deployed(
        tmp_path,
        [resident("cairn"), resident("sill", commands=True)],
        calls=calls,
        channels=("general", "witness"),
        checkpoints=every("2s"),
        db=backend.location,
    ) as d:
        loop = asyncio.get_running_loop()
        first = await d.room.wait_for_message(lambda m: True, channel="witness", timeout=10)
        started = loop.time()
        assert first["author"] == "sill" and first["bot"]
        assert EMPTY.fullmatch(first["content"]), first["content"]
        assert len(first["content"]) <= truth.MAX_LINE

        d.room.post("general", "alice", "describe the harbour, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        last_seq = max(chain(d.db))

        async def checkpoints(n: int) -> list[dict[str, Any]]:
            return await d.room.wait_until(
                lambda: (lambda ms: ms if len(ms) >= n else None)(d.messages("witness")), timeout=15
            )

        # the first checkpoint naming the reply's last entry, and the one after it: the same head
        await d.room.wait_until(lambda: (last_seq, chain(d.db)[last_seq]) in heads(d) or None, timeout=15)
        named = heads(d).index((last_seq, chain(d.db)[last_seq]))
        await checkpoints(named + 2)
        elapsed = loop.time() - started
        said = heads(d)
        assert said[named + 1] == said[named] == (last_seq, chain(d.db)[last_seq])
        assert max(chain(d.db)) == last_seq  # nothing was recorded for the checkpoint posts
        # on the cadence: n + 1 lines after n intervals, not more (none for the reply, none twice)
        assert len(said) - 1 <= elapsed / 2 + 1, (len(said), elapsed)
        assert all(m["author"] == "sill" for m in d.messages("witness"))
        times = [dt.datetime.fromisoformat(m["timestamp"]) for m in d.messages("witness")]
        gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
        assert min(gaps) >= 1.5, gaps  # one every 2 s, counted from the first
        for h in said[1:]:
            assert h is not None and chain(d.db)[h[0]] == h[1]  # every head named is an entry of the chain
        ids = {m["id"] for m in d.messages("witness")}
        recorded = {r[0] for r in rows(str(d.db), "SELECT message_id FROM posts WHERE message_id IS NOT NULL")}
        assert not ids & recorded
        assert not [m for m in d.bot_messages("general") if m["content"].startswith("-# Ledger checkpoint")]


async def test_provenance_without_a_message_answers_the_head_now(backend: Backend, tmp_path):
    calls = [Call(sse=specimen("ceiling-1024.sse"))]
    async with deployed(tmp_path, [resident("cairn")], calls=calls, db=backend.location) as d:
        out = await d.command("alice", "provenance", moderator=False)
        assert [r["content"] for r in out["responses"]] == ["```\nLedger head: none yet (the chain is empty).\n```"]
        d.room.post("general", "alice", "describe the harbour, @cairn", mentions=["cairn"])
        receipt = await d.wait_receipt()
        await d.quiet(0.1)
        entries = chain(d.db)
        seq = max(entries)
        out = await d.command("alice", "provenance", moderator=False)
        assert [(r["content"], r["ephemeral"]) for r in out["responses"]] == [
            (
                f"```\nLedger head now: {seq}:{entries[seq]} (entry {seq:,}; keep it to check the ledger later)\n```",
                True,
            )
        ]
        # a post's provenance ends with the same head, in the same N:SHA256 form
        out = await d.command("alice", "provenance", [{"name": "message", "value": receipt["id"]}], moderator=False)
        said = "\n".join(r["content"] for r in out["responses"])
        assert f"Ledger head now: {seq}:{entries[seq]} (entry {seq:,}" in said
        assert not [m for m in d.messages() if m["ephemeral"]]


async def test_a_checkpoint_the_room_refuses_is_one_warning_and_the_next_comes_at_its_time(tmp_path, caplog):
    async with deployed(tmp_path, [resident("cairn")], channels=("general", "witness"), checkpoints=every("1s")) as d:
        await d.room.wait_for_message(lambda m: True, channel="witness", timeout=10)
        d.room.faults.add(403)  # the next checkpoint: Missing Permissions, as when Send Messages is taken away
        caplog.set_level(logging.INFO, logger="residents.discord.cogs.checkpoints")
        two = await d.room.wait_until(
            lambda: (lambda ms: ms if len(ms) >= 2 else None)(d.messages("witness")), timeout=10
        )
        assert d.room.faults.hits == 1
        [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning.startswith("checkpoint not posted in residents/witness (Forbidden: 403") and warning.endswith(
            "; the next in 1s"
        ), warning
        first, second = (dt.datetime.fromisoformat(m["timestamp"]) for m in two[:2])
        assert (second - first).total_seconds() >= 1.5  # the refused one was not made up for: the next at its time


async def start_up_problem(tmp_path: Path, checkpoints: Checkpoints, channels: list[str], layout: Any = None) -> str:
    """The one line `run_bots` stops with, for cairn (in #general) posting checkpoints as `checkpoints` says."""
    provider = ProviderServer()
    await provider.start()
    try:
        async with running_room(channels, layout=layout) as server:
            with pytest.raises(StartupError) as info:
                await asyncio.wait_for(
                    run_bots(
                        Deployment([resident("cairn")], {"cairn": "local-cairn"}, checkpoints),
                        str(tmp_path / "l.db"),
                        {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "k"},
                        guild_ready_timeout=0.05,
                    ),
                    timeout=10,
                )
            assert not any(server.messages(c) for c in channels)
    finally:
        await provider.stop()
    line = str(info.value)
    assert "\n" not in line
    return line


async def test_a_checkpoint_channel_not_in_the_bots_guilds_stops_start_up(tmp_path):
    line = await start_up_problem(tmp_path, every("1h", "nowhere"), ["general"])
    assert line == (
        "residents.yaml: ledger.checkpoints.channel: no channel named 'nowhere' in the guilds of cairn's bot, "
        "which posts checkpoints"
    )


async def test_a_checkpoint_channel_the_bot_may_not_post_in_stops_start_up(tmp_path):
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        "guilds:\n  - name: harbour\n    channels: [general, witness]\n"
        "    overwrites: {witness: {'@everyone': {deny: [send_messages]}}}\n"
    )
    line = await start_up_problem(tmp_path, every("1h", "witness"), ["general", "witness"], load_layout(layout))
    assert line == (
        "residents.yaml: ledger.checkpoints.channel: cairn's bot, which posts checkpoints, may not post in "
        "harbour/witness (it needs View Channel and Send Messages there)"
    )


async def test_residents_run_posts_checkpoints_as_residents_yaml_says(tmp_path):
    """`residents run` itself, as a process: residents.yaml's `ledger.checkpoints` read, the head posted at
    start and again a second later, then SIGINT ends it cleanly."""
    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(
        "name: cairn\nmodel: claude-3-opus-20240229\nmax_tokens: 1024\n"
        "discord: {token_env: CKPT_CAIRN_TOKEN, channels: [general]}\n"
    )
    (tmp_path / "residents.yaml").write_text("ledger:\n  checkpoints: {channel: witness, every: 1s}\n")
    provider = ProviderServer()
    await provider.start()
    try:
        async with running_room(["general", "witness"]) as room:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
            env.update(ANTHROPIC_BASE_URL=provider.url, ANTHROPIC_API_KEY="k", PYTHONPATH=str(ROOT))
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "residents",
                "run",
                "--discord-api",
                room.url,
                "--db",
                str(tmp_path / "ledger.db"),
                cwd=tmp_path,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                two = await room.wait_until(
                    lambda: (lambda ms: ms if len(ms) >= 2 else None)(room.messages("witness")), timeout=40
                )
                proc.send_signal(signal.SIGINT)
                _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0, err.decode()[-2000:]
            assert [m["author"] for m in two[:2]] == ["cairn", "cairn"]
            assert all(EMPTY.fullmatch(m["content"]) for m in two[:2]), two
            assert not room.messages("general")
    finally:
        await provider.stop()


@pytest.mark.parametrize("listens", [["general", "witness"], []])
async def test_a_checkpoint_channel_a_resident_listens_in_stops_start_up(tmp_path, listens):
    """A checkpoint is not in the ledger, so a resident reading its channel would take it as room words."""
    provider = ProviderServer()
    await provider.start()
    try:
        async with running_room(["general", "witness"]):
            with pytest.raises(StartupError) as info:
                await asyncio.wait_for(
                    run_bots(
                        Deployment(
                            [
                                resident("cairn"),
                                resident("sill", *listens)
                                if listens
                                else residence(name="sill", discord={"token_env": "SILL_TOKEN"}),
                            ],
                            {"cairn": "local-cairn", "sill": "local-sill"},
                            every("1h"),
                        ),
                        str(tmp_path / "l.db"),
                        {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "k"},
                        guild_ready_timeout=0.05,
                    ),
                    timeout=10,
                )
    finally:
        await provider.stop()
    how = "listens there" if listens else "listens in every channel (it lists no discord.channels)"
    assert str(info.value) == (
        f"residents.yaml: ledger.checkpoints.channel: residents/witness is no channel of their own: sill {how}; "
        "a resident would read each checkpoint as the room's words"
    )
