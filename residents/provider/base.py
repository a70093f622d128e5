"""What every provider shares: the sink a stream's content blocks go into, how a call ends (`StreamEnd`,
`Failure`), the failures beneath any SDK, and `Provider`, the one interface the rest of the project
calls. A provider is one module implementing `Provider` plus one line in `REGISTRY`
(`residents/provider/__init__.py`); nothing else knows which SDK a residence speaks.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2

from .. import truth
from ..records import Block, join_text

log = logging.getLogger(__name__)

KEY_CHECK_SECONDS = 10.0  # the start-up key check waits no longer than this for the provider


@dataclass
class Failure:
    kind: str  # e.g. overloaded_error, http-529, connection-cut, read-timeout, malformed-stream, internal-…
    retryable: bool
    message: str
    status_code: int | None = None
    retry_after: float | None = None


@dataclass
class StreamEnd:
    stop_reason: str | None = None
    stop_details: dict[str, Any] | None = None
    output_tokens: int | None = None
    # The provider's own input counts, None where it gave none (never an estimate): input neither read
    # from nor written to its prompt cache, input written to the cache, input read from it.
    input_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
    request_id: str | None = None
    failure: Failure | None = None
    request_replacements: int = 0  # lone surrogates replaced by U+FFFD in the body sent


class MalformedEvent(Exception):
    """An event the provider sent whose data is not the shape the protocol gives it."""


# The delta type that carries a block's content, and the delta's field holding it.
_DELTA_FIELD = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


_ANY_CONTENT = frozenset(_DELTA_FIELD)


def _feeds(btype: str) -> frozenset[str]:
    """Which deltas are a block's content. Only a declared text block takes text; a type not known
    here keeps whatever content its deltas carry, as its own (never as reply text)."""
    if btype == "text":
        return frozenset({"text_delta"})
    if btype == "thinking":
        return frozenset({"thinking_delta"})
    if btype.endswith("tool_use"):
        return frozenset({"input_json_delta"})
    if btype == "redacted_thinking" or btype.endswith("tool_result"):
        return frozenset()
    return _ANY_CONTENT


class _Open:
    """A content block while it streams: its content in the pieces it arrived in."""

    __slots__ = ("index", "type", "start", "parts", "extras", "feeds", "written", "on_disk")

    def __init__(self, index: int, btype: str, start: dict[str, Any] | None) -> None:
        self.index, self.type, self.start = index, btype, start
        self.parts: list[str] = []
        self.extras: list[dict[str, Any]] = []
        self.feeds = _feeds(btype)
        self.written = 0  # pieces already handed to a ledger write
        self.on_disk = False  # its first piece (with its type and start) handed to a write


class BlockSink:
    """Where a stream's content blocks go as they arrive.

    `start` opens a block, `select` makes a started block current, `add` appends text to the
    current (text) block and `delta` takes any other delta; each says cheaply whether a flush is
    due, and `flush` may await. This base only collects; the ledger's sink also writes.
    """

    def __init__(self) -> None:
        self._open: list[_Open] = []
        self._at: dict[int, _Open] = {}
        self._cur: _Open | None = None

    def start(self, index: int, btype: str, content: str, start: dict[str, Any] | None) -> bool:
        if index in self._at:
            raise ValueError(f"content block {index} started twice")
        b = _Open(index, btype, start)
        self._open.append(b)
        self._at[index] = b
        self._cur = b
        return self.add(content) if content else False

    def select(self, index: int) -> bool:
        """Make block `index` current; True when it is a text block."""
        b = self._at.get(index)
        if b is None:
            raise KeyError(f"a delta for content block {index!r}, which never started")
        self._cur = b
        return b.type == "text"

    def add(self, text: str) -> bool:
        self._cur.parts.append(text)  # type: ignore[union-attr]
        return False

    def delta(self, d: Any) -> bool:
        """Any delta but text to a text block: the block's content if its type takes it, else kept as given.

        `d` is the delta's JSON object; an SDK object is taken too, as the provider sent it."""
        b = self._cur
        assert b is not None
        if d.__class__ is not dict:
            d = _as_given(d)
        dt = d.get("type")
        if dt in b.feeds:
            x = d.get(_DELTA_FIELD[dt])
            if x.__class__ is not str:
                raise TypeError(f"a {dt} without its {_DELTA_FIELD[dt]}")
            return self.add(x)
        b.extras.append(d)
        return False

    async def flush(self) -> None:
        return None

    def blocks(self) -> list[Block]:
        out = [Block(b.index, b.type, "".join(b.parts), b.start, list(b.extras)) for b in self._open]
        join_text(out)
        return out

    def text(self) -> str:
        return join_text(self.blocks())


class ListSink(BlockSink):
    """A sink that only collects: for callers with no ledger (benchmarks of the bare path, tests)."""


def call_timeout(seconds: float) -> httpx2.Timeout:
    """Silence longer than `seconds` (a read, a write, a wait for the pool) cuts the call; connecting gets ≤ 10 s."""
    return httpx2.Timeout(seconds, connect=min(seconds, 10.0))


def transport_failure(e: BaseException) -> Failure | None:
    """The failures every provider's SDK meets beneath it (the HTTP transport, the stream's bytes, our
    own event decoding), the same kind whichever SDK raised them; None for anything else."""
    if isinstance(e, httpx2.TimeoutException):
        return Failure("read-timeout", True, "the stream stalled past the read timeout")
    if isinstance(e, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.NetworkError)):
        return Failure("connection-cut", True, "the connection closed mid-stream")
    if isinstance(e, httpx2.HTTPError):
        return Failure("connection-error", True, type(e).__name__)
    if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
        return Failure("malformed-stream", True, f"{type(e).__name__}: {e}")
    if isinstance(e, MalformedEvent):
        return Failure("malformed-stream", True, str(e))
    return None


def internal_failure(e: BaseException) -> Failure:
    """Not the provider's: a failure of this process while calling it (building the request, keeping
    the stream). It is named as such, never as a provider error, and not retried."""
    log.error("internal error while calling the provider: %s: %s", type(e).__name__, e, exc_info=e)
    return Failure(truth.internal_error(type(e).__name__), False, str(e))


def retry_after(headers: Any) -> float | None:
    """Seconds the provider asked to wait, from retry-after-ms or retry-after (seconds or a date)."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        ra = headers.get("retry-after")
        if ra is None:
            return None
        try:
            return max(0.0, float(ra))
        except ValueError:
            when = email.utils.parsedate_to_datetime(ra)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _as_given(obj: Any) -> dict[str, Any]:
    """An SDK object as the provider sent it: only the keys it gave, under their API names."""
    to_dict = getattr(obj, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(f"expected an object, got {type(obj).__name__}")
    return to_dict(mode="json", warnings=False)


@dataclass(frozen=True)
class Endpoint:
    """Where a provider is called and with what key; `key_env` names the variable the key came from."""

    base_url: str | None
    key: str
    key_env: str


def key_not_checked(host: str, key_env: str, why: int | str) -> None:
    """A start-up key check that could not tell (`why`: the HTTP status, or the error's name). A server
    without a models endpoint (404, 405) is said at INFO, anything else as a warning; start-up goes on
    either way, since each call meets the key."""
    if why in (404, 405):
        log.info("the provider at %s has no models endpoint (HTTP %d); the key is not checked at start-up", host, why)
    else:
        said = f"HTTP {why}" if isinstance(why, int) else why
        log.warning("the provider key in %s could not be checked at start-up (%s); starting anyway", key_env, said)


class KeyRejected(Exception):
    """The provider refused the key at start-up; the message names the variable and what to do."""


class Provider(Protocol):
    """One provider as the generation layer sees it: stream a request into a sink, say how it ended.

    `stream` never raises: every failure comes back as `StreamEnd.failure`. `prefill`: whether a cut
    output is continued by an assistant-turn prefill (else by a user-turn request). `check_key` is
    one cheap call before any bot connects: it raises `KeyRejected` for a refused key and only logs
    anything else. `close` releases the client's connections.
    """

    name: str
    prefill: bool

    async def stream(self, request: dict[str, Any], sink: BlockSink, timeout: float | None = None) -> StreamEnd: ...

    async def check_key(self) -> None: ...

    async def close(self) -> None: ...
