"""Plain records of a generation and its attempts, segments, stumps and posts.

These are what the ledger stores and what replay, delivery and the moderation commands read; they
carry data only, and the rules that give them meaning live in `bot.truth`.
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import truth
from ..text import outbound

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


TEXT_JOIN = "\n\n"  # between two text blocks of one message: a paragraph break, never glued


@dataclass
class Block:
    """One content block of an attempt, exactly as the provider streamed it.

    `content` is the block's own content: the text of a text block, the reasoning of a thinking
    block, a tool call's input JSON as streamed, a redacted block's data as given, a server tool
    result's content (as JSON); for a type this project does not know, the text its deltas carried.
    Only text blocks are ever posted. `start` is the `content_block` object of its start event, as
    given, less its type and the field its content came from (None when nothing else is left);
    `extras` are its other deltas as given (a thinking block's signature, citations, a delta of a
    type not known here).
    """
    index: int
    type: str
    content: str = ""
    start: dict[str, Any] | None = None
    extras: list[dict[str, Any]] = field(default_factory=list)
    offset: int | None = None  # text blocks: where this block's text begins in the attempt's text

    @property
    def chars(self) -> int:
        return len(self.content)

    @property
    def is_text(self) -> bool:
        return self.type == "text"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "type": self.type, "chars": self.chars}
        # the content under the name the protocol gives it: text, a tool call's input JSON, redacted data
        if self.type in ("text", "thinking"):
            out["text"] = self.content
        elif self.type.endswith("tool_use"):
            out["input_json"] = self.content
        elif self.type == "redacted_thinking":
            out["data"] = self.content
        else:
            out["content"] = self.content
        if self.offset is not None:
            out["span"] = [self.offset, self.offset + self.chars]
        if self.start:
            out["start"] = self.start
        if self.extras:
            out["extras"] = self.extras
        return out


def join_text(blocks: list[Block]) -> str:
    """An attempt's text: its text blocks, in order, joined by a paragraph break; sets each one's span.

    Empty text blocks add nothing (no separator for them); each block's exact text is
    `text[b.offset:b.offset + b.chars]`.
    """
    out: list[str] = []
    pos = 0
    for b in blocks:
        if b.type != "text":
            continue
        if b.content and out:
            out.append(TEXT_JOIN)
            pos += len(TEXT_JOIN)
        b.offset = pos
        if b.content:
            out.append(b.content)
            pos += len(b.content)
    return "".join(out)


@dataclass
class Attempt:
    id: str
    generation_id: str
    segment: int
    index: int
    text: str = ""
    outcome: truth.Outcome = "streaming"
    stop_reason: str | None = None
    discard_reason: str | None = None
    error: str | None = None
    output_tokens: int | None = None
    request_id: str | None = None
    replaced_by: str | None = None
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    stop_details: dict[str, Any] | None = None
    blocks: list[Block] = field(default_factory=list)  # every content block, in the order streamed
    request_replacements: int = 0  # lone surrogates replaced by U+FFFD in the request body sent

    @property
    def chars(self) -> int:
        return len(self.text)

    def content_blocks(self) -> list[Block]:
        """The blocks, or for an attempt recorded before blocks were kept, its text as one text block."""
        if self.blocks or not self.text:
            return self.blocks
        return [Block(0, "text", self.text, offset=0)]

    def cut_block(self) -> Block | None:
        """The block the stream stopped in (its last), when that is not text and holds content."""
        last = self.blocks[-1] if self.blocks else None
        return last if last is not None and not last.is_text and last.content else None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "segment": self.segment, "stop_details": self.stop_details, "index": self.index, "outcome": self.outcome,
                "stop_reason": self.stop_reason, "discard_reason": self.discard_reason, "error": self.error,
                "chars": self.chars, "output_tokens": self.output_tokens, "request_id": self.request_id,
                "replaced_by": self.replaced_by, "started_at": self.started_at, "ended_at": self.ended_at,
                "request_replacements": self.request_replacements,
                "text": self.text, "blocks": [b.as_json() for b in self.content_blocks()]}


@dataclass
class Segment:
    index: int
    attempt_id: str
    stop_reason: str | None
    chars: int  # characters this segment added to the canonical text, after overlap removal
    output_tokens: int | None
    overlap_removed: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Stump:
    id: str
    generation_id: str
    attempt_id: str | None
    cause: str
    text: str
    output_tokens: int | None
    scope: str = "attempt"  # "output": the generation's own text; "attempt": a text set aside; "block": see below
    published: bool = False
    replaced_by: str | None = None
    created_at: float = field(default_factory=time.time)
    residence: str = ""
    stored: bool = field(default=False, compare=False)  # already written to the ledger
    known_chars: int | None = field(default=None, compare=False)  # stored chars, when the text was not read
    # scope "block": a non-text content block an output stopped in (reasoning, a tool call's input)
    block: int | None = None
    block_type: str | None = None

    @property
    def chars(self) -> int:
        return self.known_chars if self.known_chars is not None else len(self.text)

    def meta(self) -> dict[str, Any]:
        return {"id": self.id, "generation_id": self.generation_id, "attempt_id": self.attempt_id,
                "scope": self.scope, "cause": self.cause, "chars": self.chars, "output_tokens": self.output_tokens,
                "published": self.published, "replaced_by": self.replaced_by, "created_at": self.created_at,
                "residence": self.residence, "block": self.block, "block_type": self.block_type}


@dataclass
class Post:
    id: str
    generation_id: str | None
    seq: int
    kind: truth.PostKind
    content: str
    channel: str = ""
    message_id: str | None = None
    delivered_at: float | None = None
    # Lone surrogates in `content` that leave the process as U+FFFD (`bot.text.outbound`): counted
    # when the post is planned, since the ledger keeps the content exactly and the room gets it valid.
    replacements: int | None = None
    stump_id: str | None = None  # kind `recovered` and the receipt after it: the stump published at the resident's request

    def __post_init__(self) -> None:
        if self.replacements is None:
            self.replacements = outbound(self.content)[1]

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "seq": self.seq, "kind": self.kind, "content": self.content,
                "message_id": self.message_id, "replacements": self.replacements}


@dataclass
class Generation:
    id: str
    residence: str
    channel: str
    model: str
    status: truth.Status = "pending"
    stop_reason: str | None = None
    text: str = ""
    output_tokens: int | None = None
    standing: str = "none"
    continuation_ended: str = "not-needed"
    trigger: str | None = None
    seen_upto: str | None = None  # the newest room message its request was compiled from
    request: dict[str, Any] | None = None
    attempts: list[Attempt] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    stumps: list[Stump] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    @property
    def chars(self) -> int:
        return len(self.text)

    @property
    def last_segment_tokens(self) -> int | None:
        return self.segments[-1].output_tokens if self.segments else None

    def ending(self) -> truth.Ending:
        last = self.attempts[-1] if self.attempts else None
        # the attempt whose text stands last in the canonical output (a set-aside segment may follow it)
        final = next((a for a in self.attempts if a.id == self.segments[-1].attempt_id), last) \
            if self.segments else last
        blocks = final.blocks if final is not None else []
        return truth.Ending(status=self.status, stop_reason=self.stop_reason,
                            output_tokens=self.last_segment_tokens if self.segments else None,
                            chars=self.chars, segments=max(1, len(self.segments)),
                            continuation_ended=self.continuation_ended,
                            attempts=sum(1 for a in self.attempts if a.segment == (last.segment if last else 1)),
                            error=last.error if last else None,
                            cut_in=blocks[-1].type if blocks else None,
                            other_content=any(b.content for b in blocks if not b.is_text),
                            kept_chars=self.chars, last_outcome=last.outcome if last else None)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "residence": self.residence, "channel": self.channel, "model": self.model,
                "status": self.status, "stop_reason": self.stop_reason,
                "truncated": self.status == "truncated", "text": self.text, "chars": self.chars,
                "output_tokens": self.output_tokens,
                "attempts": [a.as_json() for a in self.attempts],
                "segments": [s.as_json() for s in self.segments],
                "continuation": {"standing": self.standing, "ended": self.continuation_ended},
                "created_at": self.created_at, "finished_at": self.finished_at}


@dataclass
class ToolCall:
    """One tool call of a generation's tool loop: the round (the request whose answer asked for it), its
    position in that round, the attempt that made it, the input as parsed, and the result sent back."""
    round: int
    pos: int
    attempt_id: str
    tool_use_id: str
    name: str
    input: Any  # the parsed input JSON (None when it did not parse; the attempt's block keeps it as streamed)
    result: dict[str, Any]
    is_error: bool
    created_at: float = field(default_factory=time.time)

    def as_json(self) -> dict[str, Any]:
        return {"round": self.round, "name": self.name, "input": self.input, "result": self.result,
                "is_error": self.is_error, "attempt_id": self.attempt_id, "tool_use_id": self.tool_use_id}
