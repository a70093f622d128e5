"""The provider fault matrix, each case through the real pipeline, and the ledger's own verifier.

Every case runs a full resident turn: the local provider server on 127.0.0.1, the real anthropic
SDK, a real SQLite ledger file, the real attempt runner (with a recording fake sleep), generation,
delivery planning and a collecting room. Each is checked against the promises: the right status,
every emitted text in the ledger byte-exact (read back live and after reopening the file), a
boundary line exactly once where one is due, no speech for anything not completed, provider calls
within the policy's bound, and `residents.ledger.verify` finding nothing wrong.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import specimen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residents import cli, truth
from residents.config import Residence, build_residence
from residents.delivery.outbox import Outbox
from residents.delivery.plan import split_text
from residents.generation.attempts import FLUSH_CHARS, AttemptRunner
from residents.generation.run import Generator
from residents.ledger import Ledger
from residents.ledger.store import stored_bytes
from residents.ledger.verify import check, verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider.anthropic_messages import AnthropicProvider, make_client
from residents.records import Generation
from residents.replay.run import CollectingRoom
from residents.resident import Resident
from residents.text import cover, cover_by_reading
from residents.truth import RECEIPT_PREFIX

ROOT = Path(__file__).resolve().parent.parent
MODEL = "claude-3-opus-20240229"
TURN_TIMEOUT = 20.0  # no case may hang the suite

# Mixed text: ASCII, accents, CJK, a 4-byte emoji and a ZWJ family emoji, so cut points land inside
# multi-code-point graphemes and the wire carries multi-byte UTF-8.
BASE = "Rivers carve valleys — slowly; é, ß, 漢字, 🌊 and 👩\u200d👩\u200d👧 too.\n"
ZWJ_CUT = BASE.index("\u200d") + 1  # a cut right after the first zero-width joiner, inside the emoji
CUTS = [0, 1, 257, 3000, ZWJ_CUT]
RETRY_TEXT = "After the retry, the river again. 🌊 " * 9


def text_of(k: int, salt: str = "") -> str:
    """k code points of deterministic mixed text (salt makes two attempts' texts differ)."""
    src = salt + BASE
    return (src * (k // len(src) + 1))[:k]


def body(text: str) -> bytes:
    """Stream head and text deltas only: what a provider sent before something went wrong."""
    return sse.head(MODEL) + b"".join(sse.delta(p) for p in sse.pieces(text))


def ok(text: str = RETRY_TEXT, stop: str = "end_turn", tokens: int = 77) -> Call:
    """A clean, complete stream, written in 7-byte pieces so UTF-8 characters straddle TCP writes."""
    return Call(sse=sse.stream(text, stop, tokens), chunk_bytes=7)


def raw_delta(text: str) -> bytes:
    """A text delta with ASCII-escaped JSON, so a lone surrogate can travel as `\\ud83d`."""
    d = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
    return f"event: content_block_delta\ndata: {json.dumps(d)}\n\n".encode()


# ---------------------------------------------------------------- the harness


@dataclass
class Turn:
    generation: Generation  # read back through the live ledger
    reopened: Generation  # read back through a fresh Ledger.open of the same file
    posts: list[Any]  # what the room received, in order
    calls: int
    sleeps: list[float]
    violations: list[str]
    max_attempts: int
    db: Path


def make_residence(
    max_attempts: int = 3,
    backoff: float = 0.0,
    timeout: float = 10.0,
    max_backoff: float = 30.0,
    standing: str = "none",
) -> Residence:
    cont: dict[str, Any] = {"standing": standing}
    if standing != "none":
        cont.update(max_segments=3, max_output_tokens=16384, min_progress_chars=16, similarity_abort=0.92)
    data = {
        "name": "cairn",
        "model": MODEL,
        "max_tokens": 4096,
        "system": "You are Cairn.",
        "policy": {
            "continuation": cont,
            "retries": {
                "max_attempts": max_attempts,
                "backoff_seconds": backoff,
                "max_backoff_seconds": max_backoff,
                "timeout_seconds": timeout,
            },
        },
    }
    return build_residence(data, "<test>", None, ROOT)


class Session:
    """The real pipeline on loopback for one residence: several turns over one ledger file."""

    def __init__(self, tmp_path: Path, res: Residence) -> None:
        self.res, self.db = res, tmp_path / "ledger.db"
        self.server = ProviderServer()
        self.sleeps: list[float] = []
        self.room = CollectingRoom(res.name)

    async def __aenter__(self) -> Session:
        await self.server.start()
        self.ledger = await Ledger.open(self.db)
        self.client = make_client(self.server.url, "test-key", timeout=self.res.policy.retries.timeout_seconds)

        async def fake_sleep(seconds: float) -> None:  # records the backoff instead of waiting it out
            self.sleeps.append(seconds)
            await asyncio.sleep(0)

        self.resident = Resident(
            self.res,
            Generator(AttemptRunner(AnthropicProvider(self.client), self.ledger, sleep=fake_sleep)),
            self.ledger,
            Outbox.of_room(self.ledger, self.res.name, self.room),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        await self.ledger.close()
        await self.server.stop()

    async def say(self, calls: list[Call], content: str = "Tell me about rivers.") -> tuple[Any, list[Any], int]:
        """One turn: (reply, posts the room got, provider calls made)."""
        self.server.reset(calls)
        first = len(self.room.sent)
        m = self.room.say("alice", content)
        reply = await asyncio.wait_for(
            self.resident.respond(self.room, "faults", list(self.room.history), trigger=m.id), TURN_TIMEOUT
        )
        return reply, self.room.sent[first:], len(self.server.requests)

    async def continue_(self, calls: list[Call]) -> tuple[Any, list[Any], int]:
        """A moderator's /continue of the latest generation."""
        self.server.reset(calls)
        first = len(self.room.sent)
        reply = await asyncio.wait_for(self.resident.continue_generation(self.room, "faults", None), TURN_TIMEOUT)
        return reply, self.room.sent[first:], len(self.server.requests)


async def reopen(db: Path, gid: str) -> Generation:
    """The generation as a fresh connection to the same file reads it: what survives a restart."""
    fresh = await Ledger.open(db)
    try:
        g = await fresh.get_generation(gid)
    finally:
        await fresh.close()
    assert g is not None
    return g


async def run_turn(tmp_path: Path, calls: list[Call], **policy: Any) -> Turn:
    """One resident turn on the real pipeline; returns what the room got and what the ledger holds."""
    async with Session(tmp_path, make_residence(**policy)) as s:
        reply, posts, ncalls = await s.say(calls)
        assert reply.generation is not None
        live = await s.ledger.get_generation(reply.generation.id)
        violations = await verify(s.ledger)
    assert live is not None
    return Turn(
        live,
        await reopen(s.db, live.id),
        list(posts),
        ncalls,
        s.sleeps,
        violations,
        s.res.policy.retries.max_attempts,
        s.db,
    )


@dataclass
class Expect:
    """Everything a case promises, spelled out, so a wrong status or a lost byte names itself."""

    status: str
    text: str
    attempts: list[tuple[str, str]]  # (outcome, exact text) of every provider call, in order
    stumps: list[tuple[str, str]]  # (cause, exact text), in creation order
    line: str | None  # the boundary line's wording (receipt or notice), None when none is due
    stop_reason: str | None = None
    output_tokens: int | None = None
    sleeps: list[float] = field(default_factory=list)


def check_turn(t: Turn, e: Expect) -> None:
    """The promises of issue 6 for one turn, against both the live ledger and a reopened one."""
    for g in (t.generation, t.reopened):
        assert g.status == e.status
        assert g.stop_reason == e.stop_reason
        assert stored_bytes(g.text) == stored_bytes(e.text), "canonical text not byte-exact"
        assert g.chars == len(e.text)
        assert g.output_tokens == e.output_tokens  # the provider's own figure, or None: never an estimate
        assert [(a.outcome, a.text) for a in g.attempts] == e.attempts
        assert [stored_bytes(a.text) for a in g.attempts] == [stored_bytes(x) for _, x in e.attempts]
        assert [(s.cause, s.text) for s in g.stumps] == e.stumps
        for s in g.stumps:
            assert s.published == (s.scope == "output" and bool(s.text.strip()) and e.status != "refused")
    assert t.generation.as_json() == t.reopened.as_json()
    # provider calls: exactly the expected attempts, never beyond the policy's bound
    assert t.calls == len(e.attempts) <= t.max_attempts
    assert t.sleeps == e.sleeps
    # posts: what the room saw is what the ledger recorded, all delivered
    assert [(p.kind, p.content) for p in t.posts] == [(p.kind, p.content) for p in t.reopened.posts]
    assert all(p.message_id for p in t.reopened.posts)
    kinds = [p.kind for p in t.posts]
    text_kind = truth.text_kind(e.status) if e.text.strip() else None
    text_posts = [p.content for p in t.posts if p.kind in ("speech", "partial")]
    assert {p.kind for p in t.posts if p.kind in ("speech", "partial")} <= ({text_kind} if text_kind else set())
    if e.status != "completed":
        assert "speech" not in kinds
    if text_kind:
        assert " ".join(text_posts).split() == e.text.split()
    lines = [p for p in t.posts if p.kind in ("receipt", "notice")]
    if e.line is None:
        assert lines == []
    else:
        assert len(lines) == 1, kinds  # exactly once
        want = "receipt" if text_kind else truth.no_text_line_kind(e.status)
        assert lines[0].kind == want and lines[0].content == RECEIPT_PREFIX + e.line
        assert t.posts[-1] is lines[0]  # the boundary comes last
    assert t.violations == []


# ---------------------------------------------------------------- HTTP errors before the stream


@pytest.mark.parametrize(
    "status,headers,wait,kind",
    [
        (529, {"retry-after": "7"}, 7.0, "overloaded_error"),
        (500, {"retry-after": "2"}, 2.0, "api_error"),
        (503, {"retry-after": "45"}, 45.0, "api_error"),  # above max_backoff_seconds: the provider's ask wins
        (429, {"retry-after": "3"}, 3.0, "rate_limit_error"),
        (429, {"retry-after-ms": "1500"}, 1.5, "rate_limit_error"),
    ],
)
@pytest.mark.parametrize("k", [1, 3000])
async def test_http_error_before_stream_is_retried_after_retry_after(
    tmp_path: Path, status: int, headers: dict[str, str], wait: float, kind: str, k: int
) -> None:
    text = text_of(k, "ok ")
    t = await run_turn(tmp_path, [Call(status=status, headers=headers), ok(text)])
    check_turn(
        t,
        Expect(
            "completed",
            text,
            [("abandoned", ""), ("completed", text)],
            [],
            None,
            stop_reason="end_turn",
            output_tokens=77,
            sleeps=[wait],
        ),
    )
    assert t.generation.attempts[0].error == kind
    assert t.generation.attempts[0].discard_reason == truth.RETRY_ABANDONED
    assert t.generation.attempts[0].replaced_by == t.generation.attempts[1].id


async def test_bad_request_is_not_retried(tmp_path: Path) -> None:
    t = await run_turn(tmp_path, [Call(status=400), ok()])
    check_turn(
        t,
        Expect(
            "failed",
            "",
            [("failed", "")],
            [],
            "Provider error (invalid_request_error) after 1 attempt; no text was generated.",
        ),
    )


@pytest.mark.parametrize(
    "error",
    [{"type": 5, "message": "x"}, {"type": None}, {"type": ["api_error"]}, {"type": "internal-TypeError"}],
    ids=["number", "null", "array", "of-this-process"],
)
@pytest.mark.parametrize("status", [500, 400])
async def test_an_http_error_body_whose_type_is_not_a_usable_string_is_named_by_status(
    tmp_path: Path, error: dict[str, Any], status: int
) -> None:
    """The body's `error.type` is the provider's word only when it is a string: else the kind is
    `http-CODE`, retried or not by the status, and never an internal error of this process."""
    body = {"type": "error", "error": error}
    t = await run_turn(tmp_path, [Call(status=status, body=body), ok()])
    if status == 500:
        check_turn(
            t,
            Expect(
                "completed",
                RETRY_TEXT,
                [("abandoned", ""), ("completed", RETRY_TEXT)],
                [],
                None,
                stop_reason="end_turn",
                output_tokens=77,
            ),
        )
    else:
        check_turn(
            t,
            Expect(
                "failed", "", [("failed", "")], [], "Provider error (http-400) after 1 attempt; no text was generated."
            ),
        )
    assert t.generation.attempts[0].error == f"http-{status}"


async def test_overload_on_every_attempt_fails_within_max_attempts(tmp_path: Path) -> None:
    calls = [Call(status=529, headers={"retry-after": "0"}) for _ in range(5)] + [ok()]
    t = await run_turn(tmp_path, calls)
    check_turn(
        t,
        Expect(
            "failed",
            "",
            [("abandoned", ""), ("abandoned", ""), ("failed", "")],
            [],
            "Provider error (overloaded_error) after 3 attempts; no text was generated.",
        ),
    )


# ---------------------------------------------------------------- faults after k characters


def _abandoned_then_retry(frag: str, calls_first: list[Call]) -> tuple[list[Call], Expect]:
    """The first attempt fails after `frag`; the retry completes with RETRY_TEXT, never spliced onto it."""
    stumps = [(truth.RETRY_ABANDONED, frag)] if frag else []
    return (
        calls_first + [ok()],
        Expect(
            "completed",
            RETRY_TEXT,
            [("abandoned", frag), ("completed", RETRY_TEXT)],
            stumps,
            None,
            stop_reason="end_turn",
            output_tokens=77,
        ),
    )


@pytest.mark.parametrize("k", CUTS)
async def test_error_event_after_k_chars(tmp_path: Path, k: int) -> None:
    frag = text_of(k)
    calls, e = _abandoned_then_retry(frag, [Call(sse=body(frag) + sse.error("overloaded_error"))])
    t = await run_turn(tmp_path, calls, backoff=0.5)
    assert len(t.sleeps) == 1 and 0.5 <= t.sleeps[0] <= 0.55  # base backoff plus at most 10% jitter
    t.sleeps = []
    check_turn(t, e)
    assert t.generation.attempts[0].error == "overloaded_error"


@pytest.mark.parametrize("k", CUTS)
async def test_connection_cut_after_k_chars(tmp_path: Path, k: int) -> None:
    frag = text_of(k)
    calls, e = _abandoned_then_retry(frag, [Call(sse=body(frag), end="drop")])
    t = await run_turn(tmp_path, calls)
    check_turn(t, e)
    assert t.generation.attempts[0].error == "connection-cut"


@pytest.mark.parametrize("k", [1, 257, ZWJ_CUT])
async def test_connection_cut_inside_a_multibyte_character(tmp_path: Path, k: int) -> None:
    """The cut falls inside the UTF-8 bytes of an emoji: the half event is never taken as text."""
    frag = text_of(k)
    half = sse.delta("more 🌊 text")
    cut = half.index("🌊".encode()) + 2
    calls, e = _abandoned_then_retry(frag, [Call(sse=body(frag) + half[:cut], end="drop", chunk_bytes=5)])
    check_turn(await run_turn(tmp_path, calls), e)


async def test_lone_surrogate_halves_are_kept_byte_exact(tmp_path: Path) -> None:
    """A pair split across deltas (JSON escapes) arrives as two lone surrogates; the ledger keeps them."""
    frag = "ab\ud83d"
    calls, e = _abandoned_then_retry(
        frag, [Call(sse=sse.head(MODEL) + raw_delta("ab") + raw_delta("\ud83d"), end="drop")]
    )
    check_turn(await run_turn(tmp_path, calls), e)
    # and a stream whose completed text holds the two halves from separate deltas
    text = "x\ud83d\ude00y"
    stream = sse.head(MODEL) + raw_delta("x\ud83d") + raw_delta("\ude00y") + sse.tail("max_tokens", 4096)
    t = await run_turn(tmp_path / "b", [Call(sse=stream)])
    check_turn(
        t,
        Expect(
            "truncated",
            text,
            [("truncated", text)],
            [("max_tokens", text)],
            truth.ceiling_sentence(4096),
            stop_reason="max_tokens",
            output_tokens=4096,
        ),
    )


@pytest.mark.parametrize("k", CUTS)
async def test_read_timeout_mid_stream(tmp_path: Path, k: int) -> None:
    frag = text_of(k)
    calls, e = _abandoned_then_retry(frag, [Call(sse=body(frag), end="stall", stall_seconds=0.5)])
    t = await run_turn(tmp_path, calls, timeout=0.15)
    check_turn(t, e)
    assert t.generation.attempts[0].error == "read-timeout"


@pytest.mark.parametrize("k", CUTS)
async def test_malformed_data_line(tmp_path: Path, k: int) -> None:
    frag = text_of(k)
    bad = b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta\n\n'
    calls, e = _abandoned_then_retry(frag, [Call(sse=body(frag) + bad + sse.delta("never seen"))])
    t = await run_turn(tmp_path, calls)
    check_turn(t, e)
    assert t.generation.attempts[0].error == "malformed-stream"


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


@pytest.mark.parametrize(
    "bad",
    [
        _event("content_block_delta", "a bare string"),
        _event("content_block_delta", [1, 2]),
        _event("content_block_delta", None),
        _event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 7}},
        ),
        _event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 5,
                "delta": {"type": "text_delta", "text": "a block that never started"},
            },
        ),
        _event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        _event("message_delta", {"type": "message_delta", "delta": "end_turn", "usage": {"output_tokens": 3}}),
        _event("error", 42),
        _event("error", None),
        b"event: error\ndata: not json at all\n\n",
        _event("error", {}),
        _event("error", {"type": "error", "error": "overloaded_error"}),
        _event("error", {"type": "error", "error": {"type": 5, "message": "x"}}),
        _event("error", {"type": "error", "error": {"type": "", "message": "x"}}),
        _event("error", {"type": "error", "error": {"type": "internal-TypeError", "message": "x"}}),
        _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": "0", "delta": {"type": "text_delta", "text": "a string index"}},
        ),
        b"data: not json at all\n\n",
        b'data: "a bare string"\n\n',
    ],
    ids=[
        "string",
        "array",
        "null",
        "no-text",
        "text-not-a-string",
        "unstarted-block",
        "restarted-block",
        "delta-not-an-object",
        "error-number",
        "error-null",
        "error-not-json",
        "error-empty-object",
        "error-not-an-object",
        "error-type-a-number",
        "error-type-empty",
        "error-type-of-this-process",
        "index-a-string",
        "data-only-not-json",
        "data-only-not-an-object",
    ],
)
async def test_an_event_of_the_wrong_shape_is_a_malformed_stream(tmp_path: Path, bad: bytes) -> None:
    """Data that is not an object, or not the protocol's shape, fails the attempt as `malformed-stream`
    (retryable), never as an internal error, and never lets text of an unstarted block through."""
    frag = text_of(257)
    calls, e = _abandoned_then_retry(frag, [Call(sse=body(frag) + bad + sse.tail("end_turn", 9))])
    t = await run_turn(tmp_path, calls)
    check_turn(t, e)
    assert t.generation.attempts[0].error == "malformed-stream"


@pytest.mark.parametrize("k", CUTS)
async def test_an_error_event_with_no_event_line_is_still_an_error(tmp_path: Path, k: int) -> None:
    """An event with only a `data:` line is named by its data's `type`: an overload said that way fails
    the attempt as an overload and is retried, never read as a stream that just ended."""
    frag = text_of(k)
    error = b'data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
    calls, e = _abandoned_then_retry(frag, [Call(sse=body(frag) + error + sse.delta("never seen"))])
    t = await run_turn(tmp_path, calls)
    check_turn(t, e)
    assert t.generation.attempts[0].error == "overloaded_error"


@pytest.mark.parametrize("k", CUTS)
async def test_stream_ends_without_stop_reason(tmp_path: Path, k: int) -> None:
    text = text_of(k)
    t = await run_turn(tmp_path, [Call(sse=body(text)), ok()])
    line = (
        "Provider stream ended without a stop reason; the output may be incomplete."
        if text
        else "Provider stream ended without a stop reason; no text was generated."
    )
    check_turn(
        t, Expect("incomplete", text, [("incomplete", text)], [(truth.NO_STOP_REASON, text)] if text else [], line)
    )


@pytest.mark.parametrize("stop", ["weird_reason", "tool_use", "pause_turn"])
@pytest.mark.parametrize("k", CUTS)
async def test_unknown_or_tool_stop_reason_is_incomplete(tmp_path: Path, stop: str, k: int) -> None:
    text = text_of(k)
    t = await run_turn(tmp_path, [Call(sse=sse.stream(text, stop, 321))])
    line = (
        f"Provider stopped with an unhandled reason ({stop}); the output may be incomplete."
        if text
        else f"Provider stopped with an unhandled reason ({stop}); no text was generated."
    )
    check_turn(
        t,
        Expect(
            "incomplete",
            text,
            [("incomplete", text)],
            [(stop, text)] if text else [],
            line,
            stop_reason=stop,
            output_tokens=321,
        ),
    )


@pytest.mark.parametrize("k", CUTS)
async def test_refusal_with_stop_details(tmp_path: Path, k: int) -> None:
    text = text_of(k)
    stream = body(text) + sse.tail("refusal", 12, {"type": "refusal", "category": "cyber", "explanation": None})
    t = await run_turn(tmp_path, [Call(sse=stream)])
    held = "its text is held as a stump" if text else "no text was generated"  # only what is true
    check_turn(
        t,
        Expect(
            "refused",
            text,
            [("refused", text)],
            [("refusal", text)] if text else [],
            f"Provider declined this reply (stop reason: refusal); {held}.",
            stop_reason="refusal",
            output_tokens=12,
        ),
    )
    assert not [p for p in t.posts if p.kind in ("speech", "partial")]


@pytest.mark.parametrize("k", CUTS)
async def test_max_tokens_partial_and_one_receipt(tmp_path: Path, k: int) -> None:
    text = text_of(k)
    t = await run_turn(tmp_path, [Call(sse=sse.stream(text, "max_tokens", 4096)), ok()])
    line = (
        "Output ceiling reached at 4,096 tokens; the remainder was not generated."
        if text
        else "Output ceiling reached at 4,096 tokens; no text was generated."
    )
    check_turn(
        t,
        Expect(
            "truncated",
            text,
            [("truncated", text)],
            [("max_tokens", text)] if text else [],
            line,
            stop_reason="max_tokens",
            output_tokens=4096,
        ),
    )


@pytest.mark.parametrize("k", CUTS)
async def test_retries_exhausted_keeps_every_text(tmp_path: Path, k: int) -> None:
    first, last = text_of(k, "first "), text_of(k, "last ")
    calls = [
        Call(sse=body(first), end="drop"),
        Call(status=529, headers={"retry-after": "0"}),
        Call(sse=body(last) + sse.error("overloaded_error")),
        ok(),
    ]
    t = await run_turn(tmp_path, calls)
    stumps = ([(truth.RETRY_ABANDONED, first)] if first else []) + ([(truth.PROVIDER_ERROR, last)] if last else [])
    line = (
        "Provider error (overloaded_error) after 3 attempts; the remainder was not generated."
        if last
        else "Provider error (overloaded_error) after 3 attempts; no text was generated."
    )
    check_turn(t, Expect("failed", last, [("abandoned", first), ("abandoned", ""), ("failed", last)], stumps, line))


@pytest.mark.parametrize("k", [0, 257])
async def test_error_event_that_no_retry_can_fix_fails_at_once(tmp_path: Path, k: int) -> None:
    text = text_of(k)
    t = await run_turn(tmp_path, [Call(sse=body(text) + sse.error("invalid_request_error", "bad")), ok()])
    line = (
        "Provider error (invalid_request_error) after 1 attempt; the remainder was not generated."
        if text
        else "Provider error (invalid_request_error) after 1 attempt; no text was generated."
    )
    check_turn(t, Expect("failed", text, [("failed", text)], [(truth.PROVIDER_ERROR, text)] if text else [], line))


async def test_single_attempt_policy_makes_one_call(tmp_path: Path) -> None:
    frag = text_of(257)
    t = await run_turn(tmp_path, [Call(sse=body(frag), end="drop"), ok()], max_attempts=1)
    check_turn(
        t,
        Expect(
            "failed",
            frag,
            [("failed", frag)],
            [(truth.PROVIDER_ERROR, frag)],
            "Provider error (connection-cut) after 1 attempt; the remainder was not generated.",
        ),
    )


@pytest.mark.parametrize(
    "stop,phrase",
    [("max_tokens", "Output ceiling reached at 2 tokens"), (None, "Provider stream ended without a stop reason")],
)
async def test_whitespace_only_cut_is_still_surfaced_once(tmp_path: Path, stop: str | None, phrase: str) -> None:
    """A cut output of only whitespace cannot be posted as text, but the cut must still reach the room once."""
    text = "  \n\n "
    stream = sse.stream(text, stop, 2) if stop else body(text)
    t = await run_turn(tmp_path, [Call(sse=stream)])
    g = t.reopened
    assert g.status == ("truncated" if stop else "incomplete") and stored_bytes(g.text) == stored_bytes(text)
    assert [(s.cause, s.text) for s in g.stumps] == [(stop or truth.NO_STOP_REASON, text)]
    lines = [p for p in t.posts if p.kind in ("receipt", "notice")]
    assert len(lines) == 1 and phrase in lines[0].content, [(p.kind, p.content) for p in t.posts]
    assert t.violations == []


@pytest.mark.parametrize("k", [1, 3000])
async def test_context_window_stop_is_truncated_with_its_own_receipt(tmp_path: Path, k: int) -> None:
    text = text_of(k)
    t = await run_turn(tmp_path, [Call(sse=sse.stream(text, "model_context_window_exceeded", 900))])
    check_turn(
        t,
        Expect(
            "truncated",
            text,
            [("truncated", text)],
            [("model_context_window_exceeded", text)],
            "Model context window filled; the remainder was not generated.",
            stop_reason="model_context_window_exceeded",
            output_tokens=900,
        ),
    )


@pytest.mark.parametrize("stop", ["end_turn", "stop_sequence"])
async def test_completed_stops_post_speech_only(tmp_path: Path, stop: str) -> None:
    text = text_of(3000)
    t = await run_turn(tmp_path, [Call(sse=sse.stream(text, stop, 800))])
    check_turn(t, Expect("completed", text, [("completed", text)], [], None, stop_reason=stop, output_tokens=800))
    assert {p.kind for p in t.posts} == {"speech"}


async def test_residence_temperature_reaches_the_provider(tmp_path: Path) -> None:
    """`temperature` is a residence key the config accepts; a call carrying it must still reach the provider."""
    data = {
        "name": "cairn",
        "model": MODEL,
        "max_tokens": 4096,
        "temperature": 0.5,
        "policy": {"retries": {"max_attempts": 3, "backoff_seconds": 0}},
    }
    res = build_residence(data, "<test>", None, ROOT)
    async with Session(tmp_path, res) as s:
        reply, posts, calls = await s.say([ok()])
        assert reply.generation is not None
        assert reply.generation.attempts[0].error is None, reply.generation.attempts[0].error
        assert calls == 1 and s.server.requests[0].get("temperature") == 0.5
        assert reply.generation.status == "completed" and [p.kind for p in posts] == ["speech"]


# ---------------------------------------------------------------- faults during a continuation


async def test_fault_during_on_request_continuation(tmp_path: Path) -> None:
    """A /continue whose attempts all fail leaves the output truncated, its fragments kept, one receipt;
    the next /continue completes it. Attempts read back in the order the calls were made."""
    first = "The river begins high in the hills, where snow melts into thin streams. " * 12
    frag1, frag2 = "and then the wa", "and then the water r"
    rest = "and then the water runs to the sea, wide and slow, past towns and fields."
    async with Session(tmp_path, make_residence(max_attempts=2, standing="on-request")) as s:
        reply, posts, calls = await s.say([Call(sse=sse.stream(first, "max_tokens", 4096))])
        gid = reply.generation.id
        assert calls == 1 and [p.kind for p in posts][-1] == "receipt"

        reply, posts, calls = await s.continue_(
            [Call(sse=body(frag1), end="drop"), Call(sse=body(frag2) + sse.error()), ok(rest)]
        )
        assert calls == 2  # the policy's max_attempts for the one segment
        assert [p.kind for p in posts] == ["receipt"]
        assert "Continuation stopped on a provider error." in posts[0].content
        g = await s.ledger.get_generation(gid)
        assert g is not None and g.status == "truncated" and g.text == first
        assert [(st.cause, st.text) for st in g.stumps] == [
            ("max_tokens", first),
            (truth.RETRY_ABANDONED, frag1),
            (truth.PROVIDER_ERROR, frag2),
        ]

        reply, posts, calls = await s.continue_([ok(rest, "end_turn", 30)])
        assert calls == 1 and [p.kind for p in posts] == ["speech", "receipt"]
        assert await verify(s.ledger) == []
    g = await reopen(s.db, gid)
    assert g.status == "completed" and g.text == first + rest
    calls_in_order = sorted(g.attempts, key=lambda a: a.started_at)
    assert [a.id for a in g.attempts] == [a.id for a in calls_in_order], [
        (a.segment, a.index, a.outcome) for a in g.attempts
    ]
    assert [a.text for a in calls_in_order] == [first, frag1, frag2, rest]


async def test_fault_during_bounded_continuation(tmp_path: Path) -> None:
    """Every attempt of a bounded continuation segment fails: the output stays truncated, fragments kept."""
    first = "The river begins high in the hills, where snow melts into thin streams. " * 12
    frags = [text_of(40, "a "), text_of(300, "b "), text_of(257, "c ")]
    async with Session(tmp_path, make_residence(max_attempts=3, standing="bounded")) as s:
        reply, posts, calls = await s.say(
            [
                Call(sse=sse.stream(first, "max_tokens", 4096)),
                Call(sse=body(frags[0]), end="drop"),
                Call(sse=body(frags[1]) + sse.error("api_error", "Internal")),
                Call(sse=body(frags[2]), end="drop"),
                ok(),
            ]
        )
        assert calls == 4 <= 1 + 3 * 3
        assert [p.kind for p in posts][-1] == "receipt" and "speech" not in [p.kind for p in posts]
        assert sum(p.kind == "receipt" for p in posts) == 1
        assert await verify(s.ledger) == []
    g = await reopen(s.db, reply.generation.id)
    assert g.status == "truncated" and g.text == first and g.continuation_ended == "error"
    assert [(a.outcome, a.text) for a in g.attempts] == [
        ("truncated", first),
        ("abandoned", frags[0]),
        ("abandoned", frags[1]),
        ("failed", frags[2]),
    ]
    assert sorted((st.cause, st.text) for st in g.stumps) == sorted(
        [
            ("max_tokens", first),
            (truth.RETRY_ABANDONED, frags[0]),
            (truth.RETRY_ABANDONED, frags[1]),
            (truth.PROVIDER_ERROR, frags[2]),
        ]
    )


@pytest.mark.parametrize("standing", ["bounded", "on-request"])
@pytest.mark.parametrize(
    "segment, cause, why",
    [
        (specimen("refusal-no-content.sse"), None, "Continuation stopped when the provider declined a segment."),
        (
            body("and then, no.") + sse.tail("refusal", 5),
            "refusal",
            "Continuation stopped when the provider declined a segment.",
        ),
        (
            body("and then the water r") + sse.tail(None, 6),
            truth.NO_STOP_REASON,
            "Continuation stopped when a segment ended without a usable stop reason.",
        ),
    ],
    ids=["refusal-no-content", "refusal-with-text", "no-stop-reason"],
)
async def test_a_continuation_segment_that_was_not_a_provider_error_is_not_called_one(
    tmp_path: Path, standing: str, segment: bytes, cause: str | None, why: str
) -> None:
    """The ledger's ending stays the contract's `error`, but the receipt says what stopped the segment."""
    first = "The river begins high in the hills, where snow melts into thin streams. " * 12
    async with Session(tmp_path, make_residence(max_attempts=2, standing=standing)) as s:
        calls_first = [Call(sse=sse.stream(first, "max_tokens", 4096))]
        if standing == "bounded":
            reply, posts, calls = await s.say(calls_first + [Call(sse=segment), ok()])
            assert calls == 2 and [p.kind for p in posts] == ["partial", "receipt"]
        else:
            reply, _, _ = await s.say(calls_first)
            _, posts, calls = await s.continue_([Call(sse=segment), ok()])
            assert calls == 1 and [p.kind for p in posts] == ["receipt"]
        assert posts[-1].content == RECEIPT_PREFIX + truth.ceiling_sentence(4096) + " " + why
        assert "provider error" not in posts[-1].content
        assert await verify(s.ledger, unsettled_as_violations=True) == []
    g = await reopen(s.db, reply.generation.id)
    assert (g.status, g.text, g.continuation_ended) == ("truncated", first, "error")
    assert sorted((st.cause, st.scope) for st in g.stumps) == sorted(
        [("max_tokens", "output")] + ([(cause, "attempt")] if cause else [])
    )


async def test_retry_notice_policy_is_a_side_line_verify_accepts(tmp_path: Path) -> None:
    """With `notices.retry_abandoned`, the room also learns of the set-aside attempt, once, after the speech."""
    frag = text_of(257)
    data = {
        "name": "cairn",
        "model": MODEL,
        "max_tokens": 4096,
        "policy": {"retries": {"max_attempts": 3, "backoff_seconds": 0}, "notices": {"retry_abandoned": True}},
    }
    async with Session(tmp_path, build_residence(data, "<test>", None, ROOT)) as s:
        reply, posts, calls = await s.say([Call(sse=body(frag), end="drop"), ok()])
        assert calls == 2 and [p.kind for p in posts][-1] == "notice" and "speech" in [p.kind for p in posts]
        assert posts[-1].content == RECEIPT_PREFIX + truth.abandoned_notice(1, len(frag))
        assert frag not in posts[-1].content
        assert await verify(s.ledger) == []


# ---------------------------------------------------------------- the flush bound


async def test_stalled_stream_is_on_disk_within_the_flush_bound(tmp_path: Path) -> None:
    """While a long stream stalls, a second connection already reads all but the last 2,048 characters."""
    text = text_of(20_000)
    db = tmp_path / "ledger.db"
    res = make_residence(max_attempts=1, timeout=10.0)
    server = ProviderServer()
    await server.start()
    server.reset([Call(sse=body(text), end="stall", stall_seconds=2.5)])
    ledger = await Ledger.open(db)
    reader = await Ledger.open(db)
    client = make_client(server.url, "test-key", timeout=res.policy.retries.timeout_seconds)
    try:
        room = CollectingRoom(res.name)
        resident = Resident(
            res,
            Generator(AttemptRunner(AnthropicProvider(client), ledger)),
            ledger,
            Outbox.of_room(ledger, res.name, room),
        )
        m = room.say("alice", "A long one, please.")
        task = asyncio.create_task(resident.respond(room, "faults", list(room.history), trigger=m.id))
        seen, stable, deadline = None, 0, asyncio.get_running_loop().time() + 2.0
        while stable < 3 and asyncio.get_running_loop().time() < deadline:  # until the client has read it all
            await asyncio.sleep(0.1)
            rows = await reader.db.execute_fetchall("SELECT id FROM attempts WHERE outcome='streaming'")
            now = await reader.streamed_text(rows[0][0]) if rows else None
            stable = stable + 1 if now is not None and now == seen else 0
            seen = now
        assert not task.done(), "the stall should still be holding the stream open"
        assert seen is not None and text.startswith(seen)
        assert len(text) - len(seen) <= FLUSH_CHARS, f"{len(text) - len(seen)} characters not yet on disk"
        g = await live_generation(reader)
        assert g.status == "pending" and g.attempts[0].outcome == "streaming" and g.attempts[0].text == seen
        reply = await asyncio.wait_for(task, TURN_TIMEOUT)
        assert reply.generation is not None and reply.generation.status == "failed"
        assert (await reader.get_generation(reply.generation.id)).text == text  # type: ignore[union-attr]
        assert await verify(reader) == []
    finally:
        await client.close()
        await reader.close()
        await ledger.close()
        await server.stop()


async def test_text_waiting_250_ms_is_on_disk_while_the_provider_stalls(tmp_path: Path) -> None:
    """800 characters arrive at once, then the provider stalls for 3 s: no later delta comes, yet they
    reach disk by the 250 ms timer plus one ledger write. Measured from the moment the server sends
    them: not yet on disk at 0.05 s (the timer, not a write per delta, is what is held), all on disk
    by 0.6 s (a timer of 1 s, or none, fails)."""
    text = text_of(800)
    db = tmp_path / "ledger.db"
    res = make_residence(max_attempts=1, timeout=10.0)
    loop = asyncio.get_running_loop()
    sent: list[float] = []

    def answer(_body: dict[str, Any]) -> Call:  # runs as the request lands; the body is written at once after
        sent.append(loop.time())
        return Call(sse=body(text), end="stall", stall_seconds=3.0)

    server = ProviderServer(answer)
    await server.start()
    ledger, reader = await Ledger.open(db), await Ledger.open(db)
    client = make_client(server.url, "test-key", timeout=res.policy.retries.timeout_seconds)
    try:
        room = CollectingRoom(res.name)
        resident = Resident(
            res,
            Generator(AttemptRunner(AnthropicProvider(client), ledger)),
            ledger,
            Outbox.of_room(ledger, res.name, room),
        )
        m = room.say("alice", "Say a little, then wait.")
        task = asyncio.create_task(resident.respond(room, "faults", list(room.history), trigger=m.id))
        samples: list[tuple[float, int]] = []  # (seconds after the server sent the text, characters on disk)
        seen = ""
        while seen != text and (not sent or loop.time() - sent[0] < 2.0):
            await asyncio.sleep(0.01)
            rows = await reader.db.execute_fetchall("SELECT id FROM attempts WHERE outcome='streaming'")
            seen = await reader.streamed_text(rows[0][0]) if rows else ""
            if sent:
                samples.append((loop.time() - sent[0], len(seen)))
        assert not task.done(), "the stall should still be holding the stream open"
        on_disk = next((t for t, n in samples if n == len(text)), None)
        assert on_disk is not None and on_disk <= 0.6, (
            f"{len(text) - len(seen)} of {len(text)} characters still off disk; samples {samples[-3:]}"
        )
        assert on_disk > 0.05, f"on disk {on_disk:.3f} s after it was sent: sooner than the timer could write it"
        assert seen == text
        reply = await asyncio.wait_for(task, TURN_TIMEOUT)
        assert reply.generation is not None and reply.generation.text == text
        assert await verify(reader) == []
    finally:
        await client.close()
        await reader.close()
        await ledger.close()
        await server.stop()


# ---------------------------------------------------------------- text that cannot leave as it is


@pytest.mark.parametrize(
    "raw, sent, count",
    [
        ("plain é 漢字 🌊", "plain é 漢字 🌊", 0),
        ("half \ud83d of a pair", "half \ufffd of a pair", 1),
        ("x\ud83d\ude00y", "x😀y", 0),  # the two halves of a pair split across deltas: the character they spell
        ("\ude00\ud83d", "\ufffd\ufffd", 2),  # in the wrong order: no pair
        ("kept \ufffd as it was \udfff", "kept \ufffd as it was \ufffd", 1),
    ],
)
def test_outbound_text_is_valid_utf8_and_counts_its_replacements(raw: str, sent: str, count: int) -> None:
    from residents.text import outbound

    out, n = outbound(raw)
    assert (out, n) == (sent, count)
    out.encode("utf-8")


async def test_a_lone_surrogate_never_poisons_the_channel(tmp_path: Path) -> None:
    """A lone surrogate from the provider is kept exactly; the next turn's request carries it as U+FFFD
    (valid UTF-8), counted on the attempt, and the turn completes instead of failing before the call."""
    odd = "Tide at nine \ud83d and the ferry after."
    stream = sse.head(MODEL) + raw_delta(odd[:14]) + raw_delta(odd[14:]) + sse.tail("end_turn", 12)
    async with Session(tmp_path, make_residence()) as s:
        first, _, _ = await s.say([Call(sse=stream)])
        assert first.generation is not None and first.generation.status == "completed"
        reply, posts, calls = await s.say([ok()], "And then?")
        g = reply.generation
        assert g is not None and calls == 1
        assert (g.status, [a.outcome for a in g.attempts]) == ("completed", ["completed"])
        assert g.attempts[0].request_replacements == 1
        sent = json.dumps(s.server.requests[0], ensure_ascii=False)
        assert odd.replace("\ud83d", "\ufffd") in sent
        assert not any("Provider error" in p.content for p in posts)
        kept = await s.ledger.get_generation(first.generation.id)
        assert kept is not None and stored_bytes(kept.text) == stored_bytes(odd)  # the ledger keeps the exact text
        assert (await s.ledger.get_generation(g.id)).attempts[0].request_replacements == 1  # type: ignore[union-attr]
        assert await verify(s.ledger) == []


async def test_a_failure_before_the_provider_call_is_not_a_provider_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request this process cannot send (here: a parameter the SDK does not take) fails as the project's
    own error: named as internal, not retried, no provider call made, and never worded as a provider error."""
    monkeypatch.setattr(logging.getLogger("residents.provider.base"), "disabled", True)  # its ERROR is expected
    async with Session(tmp_path, make_residence()) as s:
        s.server.reset([ok()])
        request = {
            "model": MODEL,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Hi."}],
            "not_a_parameter": True,
        }
        g = await s.resident.generator.generate(s.res, "faults", request)
        assert len(s.server.requests) == 0
        assert (g.status, [(a.outcome, a.error) for a in g.attempts]) == ("failed", [("failed", "internal-TypeError")])
        line = truth.notice(g.ending())
        assert line == "Internal error (TypeError) stopped this output; no text was generated."
        assert "Provider" not in line


async def live_generation(ledger: Ledger) -> Generation:
    rows = await ledger.db.execute_fetchall("SELECT id FROM generations")
    g = await ledger.get_generation(rows[0][0])
    assert g is not None
    return g


# ---------------------------------------------------------------- the verifier itself


async def _cut_ledger(tmp_path: Path) -> Turn:
    return await run_turn(
        tmp_path,
        [Call(sse=body(text_of(500, "x")), end="drop"), Call(sse=sse.stream(text_of(2500), "max_tokens", 4096))],
    )


def _tamper(db: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    con = sqlite3.connect(db)
    try:
        con.execute(sql, params)
        con.commit()
    finally:
        con.close()


async def _violations(db: Path, **kw: bool) -> list[str]:
    ledger = await Ledger.open(db)
    try:
        return await verify(ledger, **kw)
    finally:
        await ledger.close()


@pytest.mark.parametrize(
    "sql,expect",
    [
        ("UPDATE posts SET kind='speech' WHERE kind='partial'", "speech post for a truncated"),
        ("DELETE FROM posts WHERE kind='receipt'", "0 receipt(s) and 0 boundary notice(s)"),
        (
            "INSERT INTO posts (id, generation_id, seq, kind, content, channel) SELECT 'p-x', generation_id, 99, 'receipt',"
            " content, channel FROM posts WHERE kind='receipt'",
            "2 receipt(s)",
        ),
        ("UPDATE stumps SET text=CAST('changed' AS BLOB) WHERE cause='retry-abandoned'", "text differs"),
        ("DELETE FROM stumps WHERE cause='retry-abandoned'", "0 retry-abandoned stumps"),
        ("UPDATE stumps SET published=1 WHERE cause='retry-abandoned'", "marked published"),
        ("UPDATE stumps SET chars=chars+1 WHERE scope='output'", "chars"),
        ("UPDATE generations SET chars=chars-1", "chars"),
        ("UPDATE generations SET status='completed'", "status completed"),
        (
            "INSERT INTO attempt_chunks (attempt_id, seq, text) SELECT id, 0, text FROM attempts WHERE outcome='abandoned'",
            "attempt_chunks",
        ),
        ("UPDATE posts SET content=CAST('something else' AS BLOB) WHERE seq=1", "do not cover"),
        ("DELETE FROM posts WHERE seq=2", "never posted"),
        ("UPDATE posts SET kind='notice' WHERE kind='receipt'", "where a receipt is due"),
        ("UPDATE generations SET text=CAST('other' AS BLOB), chars=5", "segment 1"),
    ],
)
async def test_verify_reports_each_broken_invariant(tmp_path: Path, sql: str, expect: str) -> None:
    t = await _cut_ledger(tmp_path)
    assert t.violations == [] and len([p for p in t.posts if p.kind == "partial"]) >= 2
    _tamper(t.db, sql)
    found = await _violations(t.db)
    assert any(expect in line for line in found), found


async def test_verify_reports_pending_generations_separately(tmp_path: Path) -> None:
    t = await _cut_ledger(tmp_path)
    ledger = await Ledger.open(t.db)
    try:  # a generation begun and not settled (a settled one turned pending by hand breaks its chain entry)
        pending = Generation(id="g-pending00000", residence="faults", channel="faults", model=MODEL)
        await ledger.create_generation(pending)
        report = await check(ledger)
    finally:
        await ledger.close()
    assert await _violations(t.db) == []
    assert report.unsettled == [pending.id] and report.violations == []
    assert [line for line in await _violations(t.db, unsettled_as_violations=True) if "unsettled" in line]


def test_cli_verb_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = asyncio.run(_cut_ledger(tmp_path))
    argv = ["ledger", "verify", "--db", str(t.db)]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.startswith("ledger ok: 1 generation(s) checked")
    _tamper(t.db, "UPDATE posts SET kind='speech'")
    assert cli.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out and all(line.startswith(("generation ", "post ", "stump ", "attempt ", "chain entry ")) for line in out)
    assert cli.main(["ledger", "verify", "--db", str(tmp_path / "none.db")]) == 2
    assert "none.db" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


_CODE_TEXT = st.lists(
    st.sampled_from(
        [
            "word ",
            "longer sentence here. ",
            "\n",
            "\n\n",
            "```py\n",
            "```\n",
            "~~~\n",
            "````\n",
            "   ```\n",
            "```js",
            "x = 1\n",
            "    indented\n",
            "🌊",
            "é",
            "\t",
            "a" * 50,
            "~~~~ x\n",
        ]
    ),
    max_size=600,
).map("".join)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_CODE_TEXT, st.integers(min_value=20, max_value=300))
def test_cover_rule_accepts_every_split_the_planner_makes(text: str, limit: int) -> None:
    """verify's coverage rule and the delivery planner agree on every split, fences included."""
    assert cover(text, split_text(text, limit)) is None


_PIECE = st.lists(
    st.sampled_from(["", "a", " ", "\n", "```", "\n```", "```py\n", "-# ", "\\-# ", "~~~"]), max_size=4
).map("".join)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(_PIECE, max_size=8), st.booleans())
def test_cover_gives_what_the_full_reading_gives(pieces: list[str], end_to_end: bool) -> None:
    """The short way for pieces posted end to end names exactly what following every reading names:
    an empty piece, a fence line that may be an added one and an escaped `-# ` all take the long way."""
    text = "".join(pieces) if end_to_end else "x".join(pieces)
    assert cover(text, pieces) == cover_by_reading(text, pieces)


def test_cover_names_an_empty_piece_and_lines_left_after_many_fences() -> None:
    assert cover("hello", ["hello", ""]) == "text post 2 is not the next piece of the text (at character 5)"
    fences = ["\n```"] * 40
    assert cover("".join(fences), fences) == cover_by_reading("".join(fences), fences) is not None
