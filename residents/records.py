"""Plain records of a generation and its attempts, segments, stumps and posts, and the names of their states.

These are what the ledger stores and what replay, delivery and the moderation commands read; they
carry data only, and the rules that give them meaning live in `residents.truth`. Every layer imports this
module and it imports none of them. The states are `StrEnum`s: each member equals its string, so
the ledger's columns and the JSON written from these records are the same bytes as plain strings.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal


class ModelStatus(StrEnum):
    """A model's lifecycle as its provider publishes it: legacy still answers but gets no updates,
    deprecated answers until its retirement date, retired is refused."""

    ACTIVE = "active"
    LEGACY = "legacy"
    DEPRECATED = "deprecated"
    RETIRED = "retired"


class Status(StrEnum):
    """A generation's status: `pending` until settled, then how its output ended."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    REFUSED = "refused"
    FAILED = "failed"
    INCOMPLETE = "incomplete"


class Outcome(StrEnum):
    """An attempt's outcome: `streaming` until it ends; `abandoned` when set aside for a retry."""

    STREAMING = "streaming"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABANDONED = "abandoned"
    REFUSED = "refused"
    FAILED = "failed"
    INCOMPLETE = "incomplete"


class PostKind(StrEnum):
    """How a post reads in the room: a generation's text (speech, partial) or a boundary line."""

    SPEECH = "speech"
    PARTIAL = "partial"
    RECEIPT = "receipt"
    NOTICE = "notice"
    RECOVERED = "recovered"  # a stump's text published later at its resident's request


class PostReason(StrEnum):
    """Why a post exists: what `ledger verify` checks a post against, never its wording."""

    TEXT = "text"  # a piece of a generation's own text (speech or partial)
    RECEIPT = "receipt"  # the boundary line after a cut, interrupted or assembled output
    REFUSAL = "refusal"  # the notice that the provider declined the reply
    NO_TEXT = "no-text"  # the one line for an output that ended with no text to post
    DECLINED_CONTINUE = "declined-continue"  # a /continue that was not run, and why
    ABANDONED_NOTICE = "abandoned-notice"  # the optional line on attempts set aside for a retry
    KEY_REJECTED = "key-rejected"  # the provider refused the API key (at most one per channel per window)
    RECOVERED = "recovered"  # a stump's text, or the receipt after it, published at the resident's request
    LIVE_SET_ASIDE = "live-set-aside"  # an attempt whose text was shown live was set aside for a retry
    BUDGET_REACHED = "budget-reached"  # a daily token budget was spent: no reply (at most one per channel a day)
    UNKNOWN = "unknown"  # a post recorded before posts said why (see migration m016_post_reason)


class StumpScope(StrEnum):
    """What a stump holds: the output's own text, a text set aside, or a non-text block cut."""

    OUTPUT = "output"
    ATTEMPT = "attempt"
    BLOCK = "block"


class Cause(StrEnum):
    """Stump and discard causes that are not provider stop reasons (a stump's cause may also be one)."""

    MAX_TOKENS = "max_tokens"
    CONTEXT_WINDOW = "model_context_window_exceeded"
    REFUSAL = "refusal"
    RETRY_ABANDONED = "retry-abandoned"
    PROVIDER_ERROR = "provider-error"
    NO_STOP_REASON = "no-stop-reason"
    INTERRUPTED = "interrupted"  # the process stopped while the attempt was streaming
    TAKEN_OVER = "taken-over"  # streamed on by a process after another took its bot over and settled the attempt
    NO_PROGRESS = "no-progress"  # a continuation segment that added too little, set aside
    REPETITION = "repetition"  # a continuation segment that repeated earlier text, set aside


class ContinuationEnd(StrEnum):
    """How continuation of a generation ended (or that it was never needed or allowed)."""

    NOT_NEEDED = "not-needed"
    DISABLED = "disabled"
    COMPLETED = "completed"
    SEGMENT_LIMIT = "segment-limit"
    TOKEN_LIMIT = "token-limit"
    NO_PROGRESS = "no-progress"
    REPETITION = "repetition"
    SUPERSEDED = "superseded"
    ERROR = "error"


# A residence's continuation standing (a Literal, as the validated configuration carries it).
Standing = Literal["none", "on-request", "bounded"]


@dataclass(frozen=True)
class Ending:
    """Plain facts about how a generation ended, as the wording below needs them."""

    status: Status
    stop_reason: str | None
    output_tokens: int | None  # the provider's figure for the last segment, None when it gave none
    chars: int
    segments: int = 1
    continuation_ended: ContinuationEnd = ContinuationEnd.NOT_NEEDED
    attempts: int = 1
    error: str | None = None  # the last failure's kind, for failed generations
    cut_in: str | None = None  # declared type of the last content block of the output's final attempt
    other_content: bool = False  # that attempt produced content outside text blocks (reasoning, tool input)
    kept_chars: int | None = None  # characters of text kept (a stump), where `chars` counts only visible text
    last_outcome: str | None = None  # the outcome of the generation's last attempt (a set-aside segment's own)


def provider_tokens(counts: Iterable[int | None]) -> int | None:
    """A sum of the provider's own token counts; None when there are none or any is missing, never an estimate."""
    values = list(counts)
    return sum(t for t in values if t is not None) if values and None not in values else None


_last_id = [0]  # the previous id's 80 bits (milliseconds, then a counter): ids of one process only grow
_id_lock = threading.Lock()


def new_id(prefix: str) -> str:
    """A record id that sorts by creation time: 44 bits of milliseconds since the epoch, then 36 bits
    that start random each millisecond and count up within it (20 hex digits in all).

    Why time first: the ledger's indexes are keyed by these ids, so records made together sit
    together, and reading a ledger in id order (`ledger verify`, a turn's records) walks its pages
    in order instead of seeking across the whole file. Why 36 more bits: two processes writing one
    ledger in the same millisecond still draw different ids (one chance in billions of a clash)."""
    with _id_lock:
        now = (time.time_ns() // 1_000_000) << 36
        value = max(now | secrets.randbits(35), _last_id[0] + 1)
        _last_id[0] = value
    return f"{prefix}{value:020x}"


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
    outcome: Outcome = Outcome.STREAMING
    stop_reason: str | None = None
    discard_reason: str | None = None
    error: str | None = None
    output_tokens: int | None = None
    # The rest of the provider's own count of the call (None where it gave none): input not read from
    # or written to its prompt cache, input written to it, input read from it.
    input_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
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
        return {
            "id": self.id,
            "segment": self.segment,
            "stop_details": self.stop_details,
            "index": self.index,
            "outcome": self.outcome,
            "stop_reason": self.stop_reason,
            "discard_reason": self.discard_reason,
            "error": self.error,
            "chars": self.chars,
            "output_tokens": self.output_tokens,
            "input_tokens": self.input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "request_id": self.request_id,
            "replaced_by": self.replaced_by,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "request_replacements": self.request_replacements,
            "text": self.text,
            "blocks": [b.as_json() for b in self.content_blocks()],
        }


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
    cause: Cause | str  # one of this project's causes, or a provider stop reason as given
    text: str
    output_tokens: int | None
    scope: StumpScope = (
        StumpScope.ATTEMPT
    )  # "output": the generation's own text; "attempt": a text set aside; "block": see below
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
        return {
            "id": self.id,
            "generation_id": self.generation_id,
            "attempt_id": self.attempt_id,
            "scope": self.scope,
            "cause": self.cause,
            "chars": self.chars,
            "output_tokens": self.output_tokens,
            "published": self.published,
            "replaced_by": self.replaced_by,
            "created_at": self.created_at,
            "residence": self.residence,
            "block": self.block,
            "block_type": self.block_type,
        }


@dataclass
class Post:
    id: str
    generation_id: str | None
    seq: int
    kind: PostKind
    content: str
    channel: str = ""
    message_id: str | None = None
    delivered_at: float | None = None
    # Lone surrogates in `content` that leave the process as U+FFFD (`residents.text.outbound`): counted
    # when the ledger records the post, since it keeps the content exactly and the room gets it valid.
    replacements: int | None = None
    stump_id: str | None = (
        None  # kind `recovered` and the receipt after it: the stump published at the resident's request
    )
    # Why the post exists. A text post or a receipt says so by its kind; a notice must be told why.
    reason: PostReason | None = None
    # The room refused it (400, 403, 404) try after try: set aside, never delivered (`Refusal.text`).
    refused: str | None = None
    refused_at: float | None = None

    def __post_init__(self) -> None:
        if self.reason is None:
            self.reason = (
                PostReason.RECOVERED
                if self.stump_id is not None
                else _REASON_OF_KIND.get(self.kind, PostReason.UNKNOWN)
            )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "seq": self.seq,
            "kind": self.kind,
            "content": self.content,
            "message_id": self.message_id,
            "replacements": self.replacements,
            **({"refused": self.refused} if self.refused is not None else {}),
        }


@dataclass(frozen=True)
class Refusal:
    """The room's answer to a post it will not take, whatever the try (HTTP 400, 403 or 404).

    Not an outage: after a few such answers the post is set aside (`Post.refused`), so one post no room
    accepts does not hold its channel's outbox for ever."""

    status: int  # the HTTP status
    code: int | None  # Discord's JSON error code (50013: Missing Permissions), where it gave one
    text: str  # as Discord gave it: "403 Forbidden (error code: 50013): Missing Permissions"


_REASON_OF_KIND = {
    PostKind.SPEECH: PostReason.TEXT,
    PostKind.PARTIAL: PostReason.TEXT,
    PostKind.RECEIPT: PostReason.RECEIPT,
    PostKind.RECOVERED: PostReason.RECOVERED,
}


@dataclass(frozen=True)
class BudgetRefusal:
    """A reply not generated because a daily token budget was spent: no provider call was made.

    `scope`: whose budget (`residence`, or `person`: the trigger's author's); `tokens`: which (`input` or
    `output`); `budget` and `spent` in tokens, `spent` as counted when it was refused; `day` the UTC day;
    `post_id` the notice the channel got, None where it had been told that day already."""

    id: str
    residence: str
    channel: str
    trigger: str | None
    person: str | None
    scope: str
    tokens: str
    budget: int
    spent: int
    day: str
    post_id: str | None = None
    created_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Planned:
    """A post as delivery plans it, before it is numbered and recorded: what it is, says, and why."""

    kind: PostKind
    content: str
    reason: PostReason


def numbered(
    planned: Iterable[Planned], generation_id: str | None, channel: str, start: int, stump_id: str | None = None
) -> list[Post]:
    """The posts for `planned`, numbered on from `start` (the ledger's `next_post_seq` of the generation).

    The one numbering of posts: a live turn, a /continue, a publication, recovery and resume all number
    through here. `stump_id`: the stump these posts publish at its resident's request."""
    return [
        Post(
            id=new_id("p-"),
            generation_id=generation_id,
            seq=start + i,
            kind=p.kind,
            content=p.content,
            channel=channel,
            reason=p.reason,
            stump_id=stump_id,
        )
        for i, p in enumerate(planned)
    ]


@dataclass
class Generation:
    id: str
    residence: str
    channel: str
    model: str
    status: Status = Status.PENDING
    stop_reason: str | None = None
    text: str = ""
    output_tokens: int | None = None
    standing: Standing = "none"
    continuation_ended: ContinuationEnd = ContinuationEnd.NOT_NEEDED
    trigger: str | None = None
    person: str | None = None  # the room user id of the trigger's author: whose daily budget it counts against
    seen_upto: str | None = None  # the newest room message its request was compiled from
    request: dict[str, Any] | None = None
    attempts: list[Attempt] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    stumps: list[Stump] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    attachments: list[SharedFile] = field(default_factory=list)  # the files its request was compiled with

    @property
    def chars(self) -> int:
        return len(self.text)

    def segments_tokens(self) -> int | None:
        """Output tokens over all segments, by the provider's own counts; None if any count is missing."""
        return provider_tokens(s.output_tokens for s in self.segments)

    @property
    def last_segment_tokens(self) -> int | None:
        return self.segments[-1].output_tokens if self.segments else None

    def ending(self) -> Ending:
        last = self.attempts[-1] if self.attempts else None
        # the attempt whose text stands last in the canonical output (a set-aside segment may follow it)
        final = (
            next((a for a in self.attempts if a.id == self.segments[-1].attempt_id), last) if self.segments else last
        )
        blocks = final.blocks if final is not None else []
        return Ending(
            status=self.status,
            stop_reason=self.stop_reason,
            output_tokens=self.last_segment_tokens if self.segments else None,
            chars=self.chars,
            segments=max(1, len(self.segments)),
            continuation_ended=self.continuation_ended,
            attempts=sum(1 for a in self.attempts if a.segment == (last.segment if last else 1)),
            error=last.error if last else None,
            cut_in=blocks[-1].type if blocks else None,
            other_content=any(b.content for b in blocks if not b.is_text),
            kept_chars=self.chars,
            last_outcome=last.outcome if last else None,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "residence": self.residence,
            "channel": self.channel,
            "model": self.model,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "truncated": self.status == "truncated",
            "text": self.text,
            "chars": self.chars,
            "output_tokens": self.output_tokens,
            "attempts": [a.as_json() for a in self.attempts],
            "segments": [s.as_json() for s in self.segments],
            "continuation": {"standing": self.standing, "ended": self.continuation_ended},
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }


class Shown(StrEnum):
    """How an attachment reached the resident's request."""

    IMAGE = "image"  # an image content block
    TEXT = "text"  # its text, inline under its name
    DESCRIBED = "described"  # a one-line description only (`reason` says why)


class NotShown(StrEnum):
    """Why an attachment was described instead of shown (`residents.truth.attachment_line` words each)."""

    UNSUPPORTED = "unsupported"  # neither an image of a supported type nor UTF-8 text
    NOT_UTF8 = "not-utf8"  # declared as text, but its bytes are not UTF-8
    TOO_LARGE = "too-large"  # over the limit for its kind
    TOO_MANY = "too-many"  # an image past the per-message count
    TOO_MANY_PIXELS = "too-many-pixels"  # an image over the pixels a side the provider takes
    NO_IMAGES = "no-images"  # the model's row says it takes no images
    REQUEST_LIMIT = "request-limit"  # past the images one request carries (older messages give way)
    OVER_BUDGET = "over-budget"  # past the request's budget for inline files (older messages give way)
    UNAVAILABLE = "unavailable"  # its bytes could not be fetched


@dataclass(frozen=True)
class SharedFile:
    """One attachment of a request as the ledger keeps it: which message, its name, type, size and
    SHA-256 (None when its bytes were not read), and how it was shown. Never its bytes."""

    message_id: str
    position: int  # its place among the message's attachments, from 0
    name: str
    media_type: str | None  # from its bytes where they were read (magic numbers), else as declared
    size: int
    sha256: str | None
    shown: Shown
    reason: NotShown | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "position": self.position,
            "name": self.name,
            "media_type": self.media_type,
            "size": self.size,
            "sha256": self.sha256,
            "shown": str(self.shown),
            "reason": str(self.reason) if self.reason is not None else None,
        }


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
        return {
            "round": self.round,
            "name": self.name,
            "input": self.input,
            "result": self.result,
            "is_error": self.is_error,
            "attempt_id": self.attempt_id,
            "tool_use_id": self.tool_use_id,
        }


def make_stump(g: Generation, a: Attempt, cause: Cause | str, scope: StumpScope, block: Block | None = None) -> Stump:
    """The one way a stump is made; what it holds follows from its scope.

    `attempt`: the text of attempt `a`, set aside; `output`: the generation's canonical text and
    tokens, standing on `a`, its last segment's attempt; `block`: the content of `block`, a non-text
    block `a` stopped in. Output tokens are the provider's own figure, or None (never an estimate).
    """
    if scope == StumpScope.OUTPUT:
        text, tokens = g.text, g.output_tokens
    elif scope == StumpScope.BLOCK:
        assert block is not None
        text, tokens = block.content, a.output_tokens
    else:
        text, tokens = a.text, a.output_tokens
    return Stump(
        id=new_id("s-"),
        generation_id=g.id,
        attempt_id=a.id,
        cause=cause,
        text=text,
        output_tokens=tokens,
        scope=scope,
        residence=g.residence,
        block=block.index if block is not None else None,
        block_type=block.type if block is not None else None,
    )
