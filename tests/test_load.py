"""Load: 20 residents across 5 rooms at once, with mixed provider faults, for a bounded time.

All residents run in one process through `run_bots` (one ResidentBot each, as production does),
against one local room and one local provider whose answers mix completions, output ceilings,
refusals, 529s and 500s, error events and cut connections mid-stream, and streams with no or an
unknown stop reason; the room rate-limits one post and loses the response to another. People
keep mentioning residents for a few seconds; afterwards every generation must be settled, every
post delivered exactly once, and `verify` must find nothing.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from residents.config import build_residence
from residents.discord.run import Deployment, run_bots
from residents.ledger import Ledger
from residents.ledger.verify import check
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roomkit import error_guard, eventually, running_room  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESIDENTS = 20
CHANNELS = 5
DRIVE_SECONDS = 6.0
MODEL = "claude-3-opus-20240229"
SEED = 20240229


def text_for(rng: random.Random, tag: str, n: int) -> str:
    return " ".join(f"{tag}{rng.randrange(10_000):04d}" for _ in range(max(1, n // 6)))[:n]


class MixedProvider:
    """Answers each request with one of the outcomes a provider produces, drawn from a seeded RNG."""

    KINDS = (
        "end_turn",
        "end_turn",
        "end_turn",
        "max_tokens",
        "refusal",
        "http-529",
        "http-500",
        "error-event",
        "cut",
        "no-stop",
        "unknown-stop",
    )

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.served: Counter[str] = Counter()

    def __call__(self, body: dict[str, Any]) -> Call:
        rng = self.rng
        kind = rng.choice(self.KINDS)
        self.served[kind] += 1
        text = text_for(rng, kind[:2], rng.choice((0, 40, 300, 2600)) if kind != "end_turn" else rng.randint(1, 400))
        model = body.get("model", MODEL)
        if kind == "http-529":
            return Call(status=529)
        if kind == "http-500":
            return Call(status=500)
        if kind == "error-event":
            return Call(sse=sse.stream(text, finish=False, model=model) + sse.error("overloaded_error"))
        if kind == "cut":
            return Call(sse=sse.stream(text, finish=False, model=model), end="drop")
        if kind == "no-stop":
            return Call(
                sse=sse.stream(text, finish=False, model=model) + sse.event("message_stop", {"type": "message_stop"})
            )
        if kind == "unknown-stop":
            return Call(sse=sse.stream(text, "some_new_reason", 50, model=model))
        if kind == "refusal":
            return Call(
                sse=sse.stream(text, finish=False, model=model)
                + sse.tail("refusal", 12, {"type": "refusal", "category": "cyber", "explanation": None})
            )
        if kind == "max_tokens":
            return Call(sse=sse.stream(text, "max_tokens", 1024, model=model))
        return Call(sse=sse.stream(text, "end_turn", model=model))


def residences(names: list[str], channels: list[str]) -> list[Any]:
    out = []
    for i, name in enumerate(names):
        policy: dict[str, Any] = {
            "retries": {"max_attempts": 2 + i % 2, "backoff_seconds": 0},
            "floor": {"cooldown_seconds": 0, "reply_to": "mentions", "max_resident_run": 50, "history_limit": 20},
            "notices": {"retry_abandoned": i % 4 == 0},
        }
        if i % 5 == 0:  # some residents may continue a cut output on their own, within bounds
            policy["continuation"] = {
                "standing": "bounded",
                "max_segments": 1,
                "max_output_tokens": 4096,
                "min_progress_chars": 16,
                "similarity_abort": 0.92,
            }
        out.append(
            build_residence(
                {
                    "name": name,
                    "model": MODEL,
                    "max_tokens": 1024,
                    "system": f"You are {name}.",
                    "policy": policy,
                    "discord": {"token_env": f"{name.upper()}_TOKEN", "channels": channels},
                },
                "<load>",
                None,
                ROOT,
            )
        )
    return out


async def test_twenty_residents_five_rooms_mixed_faults(tmp_path: Path) -> None:
    names = [f"res{i:02d}" for i in range(RESIDENTS)]
    channels = [f"room{i}" for i in range(CHANNELS)]
    mixed = MixedProvider(SEED)
    provider = ProviderServer(responder=mixed)
    await provider.start()
    db = tmp_path / "ledger.db"
    stop = asyncio.Event()
    drive = random.Random(SEED + 1)
    async with error_guard() as guard, running_room(channels) as room:
        # discord.py may note a slow event loop under this much load; that is a warning, not an error.
        guard.ignore.append(lambda p: "heartbeat blocked" in p)
        dep = Deployment(residences(names, channels), {n: f"local-{n}" for n in names})
        task = asyncio.create_task(
            run_bots(
                dep,
                str(db),
                {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "test-key"},
                guild_ready_timeout=0.05,
                stop=stop,
            )
        )
        try:
            await eventually(
                lambda: task.done() or sum(1 for b in room.snapshot()["bots"] if b["synced"]) == RESIDENTS,
                timeout=30,
                interval=0.05,
            )
            assert not task.done(), task.result()
            # And Discord pushes back now and then: a rate limit, and a 500 after storing the message.
            room.fail_message_posts(429, nth=15, retry_after=0.2)
            room.fail_message_posts(500, nth=40, after_create=True)
            posted = 0
            deadline = time.monotonic() + DRIVE_SECONDS
            while time.monotonic() < deadline:
                ch = drive.choice(channels)
                who = drive.sample(names, drive.choice((1, 1, 2)))
                line = f"msg {posted}: " + " ".join(f"@{n}" for n in who)
                room.post(ch, drive.choice(("alice", "bob", "carol")), line, mentions=who)
                posted += 1
                await asyncio.sleep(0.04)

            async def quiet() -> bool:
                led = await Ledger.open(db)
                try:
                    rep = await check(led)
                    return not rep.unsettled and rep.undelivered == 0
                finally:
                    await led.close()

            # Quiet: nothing open, nothing undelivered, and no provider call for a while (a queued turn
            # may still be waiting for its channel's lock).
            deadline = time.monotonic() + 30
            calls, still = -1, 0
            while still < 3:
                assert time.monotonic() < deadline, "generations still open or posts undelivered after 30 s"
                await asyncio.sleep(0.25)
                now = len(provider.requests)
                still = still + 1 if now == calls and await quiet() else 0
                calls = now
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)
            await provider.stop()

    led = await Ledger.open(db)
    try:
        rep = await check(led)
        assert rep.violations == [], "\n".join(rep.violations[:30])
        assert rep.unsettled == [] and rep.undelivered == 0
        statuses = Counter(r[0] for r in await led.db.execute_fetchall("SELECT status FROM generations"))
        causes = Counter(r[0] for r in await led.db.execute_fetchall("SELECT cause FROM stumps"))
        post_ids = [r[0] for r in await led.db.execute_fetchall("SELECT message_id FROM posts")]
        residents_spoke = {r[0] for r in await led.db.execute_fetchall("SELECT DISTINCT residence FROM generations")}
    finally:
        await led.close()
    # The load was real, and the faults were mixed.
    print(
        f"load: {posted} messages, {rep.generations} generations {dict(statuses)}, stumps {dict(causes)}, "
        f"provider answers {dict(mixed.served)}"
    )
    assert rep.generations >= 60, statuses
    assert {"completed", "truncated", "refused", "failed", "incomplete"} <= set(statuses), statuses
    assert {"retry-abandoned", "max_tokens", "refusal", "provider-error"} <= set(causes), causes
    assert len(residents_spoke) == RESIDENTS
    # Exactly the posts the ledger holds reached the rooms: nothing twice, nothing unrecorded.
    bot_ids = [m["id"] for ch in channels for m in room.messages(ch) if m["bot"]]
    assert len(post_ids) == len(set(post_ids))
    assert sorted(bot_ids) == sorted(post_ids)
    assert room.faults.hits == 2
