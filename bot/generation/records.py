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

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


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

    @property
    def chars(self) -> int:
        return len(self.text)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "segment": self.segment, "stop_details": self.stop_details, "index": self.index, "outcome": self.outcome,
                "stop_reason": self.stop_reason, "discard_reason": self.discard_reason, "error": self.error,
                "chars": self.chars, "output_tokens": self.output_tokens, "request_id": self.request_id,
                "replaced_by": self.replaced_by, "started_at": self.started_at, "ended_at": self.ended_at,
                "text": self.text}


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
    scope: str = "attempt"  # "output": the generation's own text; "attempt": a text set aside
    published: bool = False
    replaced_by: str | None = None
    created_at: float = field(default_factory=time.time)
    residence: str = ""
    stored: bool = field(default=False, compare=False)  # already written to the ledger
    # Stored, not derived: a metadata-only read (`Ledger.list_stump_meta`) leaves `text` empty and keeps the count.
    chars: int = -1

    def __post_init__(self) -> None:
        if self.chars < 0:
            self.chars = len(self.text)

    def meta(self) -> dict[str, Any]:
        return {"id": self.id, "generation_id": self.generation_id, "attempt_id": self.attempt_id,
                "scope": self.scope, "cause": self.cause, "chars": self.chars, "output_tokens": self.output_tokens,
                "published": self.published, "replaced_by": self.replaced_by, "created_at": self.created_at,
                "residence": self.residence}


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

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "seq": self.seq, "kind": self.kind, "content": self.content,
                "message_id": self.message_id}


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
        return truth.Ending(status=self.status, stop_reason=self.stop_reason,
                            output_tokens=self.last_segment_tokens if self.segments else None,
                            chars=self.chars, segments=max(1, len(self.segments)),
                            continuation_ended=self.continuation_ended,
                            attempts=sum(1 for a in self.attempts if a.segment == (last.segment if last else 1)),
                            error=last.error if last else None)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "residence": self.residence, "channel": self.channel, "model": self.model,
                "status": self.status, "stop_reason": self.stop_reason,
                "truncated": self.status == "truncated", "text": self.text, "chars": self.chars,
                "output_tokens": self.output_tokens,
                "attempts": [a.as_json() for a in self.attempts],
                "segments": [s.as_json() for s in self.segments],
                "continuation": {"standing": self.standing, "ended": self.continuation_ended},
                "created_at": self.created_at, "finished_at": self.finished_at}
