"""One provider call: the stream's events → content blocks, stop reason, tokens, or a classified failure.

The SDK sends the request and owns HTTP, status errors and timeouts (its own retries off, so every
call is one attempt the generation layer can name, keep and retry itself); the body is read through
its raw-response path (`messages.with_streaming_response.create(stream=True)`) and its own SSE
decoder (`AsyncStream.raw_events`), and each event's JSON is read here as plain dicts, only the
fields this module needs. That skips the pydantic object the SDK would build per event (most of the
CPU of reading a long stream) and keeps an event with no `event:` line, which the SDK's typed
stream drops: it is named by its data's own `type`. Every way a stream can end is caught here and
turned into plain data; nothing escapes as an exception.

Every content block is kept, in order, with its declared type: only a block whose start said
`text` is reply text, whatever deltas other blocks carry. What leaves in the request body is valid
UTF-8 (`residents.text.outbound`).
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2

from .. import truth
from ..records import Block, join_text
from ..text import outbound_json

log = logging.getLogger(__name__)

# Error types inside a stream (`event: error`) that a later attempt may not meet again.
_RETRYABLE_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
_RETRYABLE_STATUS = frozenset({408, 409, 429})


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


def _initial(btype: str, start: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """A block's content as its start event gives it, and the rest of the start object (less its type,
    which is a column of its own; None when nothing else is left).

    Text and reasoning may begin in the start event; redacted reasoning's data and a server tool's
    result come whole in it. A tool call's input is its streamed JSON, so its start keeps `input`.
    """
    rest = {k: v for k, v in start.items() if k != "type"}
    key = {"text": "text", "thinking": "thinking", "redacted_thinking": "data"}.get(btype)
    content = ""
    if key is None and btype.endswith("tool_result") and "content" in rest:
        content = json.dumps(rest.pop("content"), ensure_ascii=False, separators=(",", ":"))
    elif key is not None and key in rest:
        value = rest.pop(key)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"a {btype} block whose {key} is not a string")
        content = value or ""
    return content, rest or None


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


def make_client(base_url: str | None, api_key: str | None, timeout: float = 600.0) -> anthropic.AsyncAnthropic:
    """The SDK client with its hidden retries off: each provider call must be an attempt we record."""
    return anthropic.AsyncAnthropic(
        base_url=base_url, api_key=api_key or "local", max_retries=0, timeout=call_timeout(timeout)
    )


def call_timeout(seconds: float) -> httpx2.Timeout:
    """Silence longer than `seconds` (a read, a write, a wait for the pool) cuts the call; connecting gets ≤ 10 s."""
    return httpx2.Timeout(seconds, connect=min(seconds, 10.0))


async def stream_once(
    client: anthropic.AsyncAnthropic, request: dict[str, Any], sink: BlockSink, timeout: float | None = None
) -> StreamEnd:
    """One call; `timeout` (the residence's `retries.timeout_seconds`) overrides the client's for this call."""
    end = StreamEnd()
    opened = contextlib.AsyncExitStack()
    try:
        request, end.request_replacements = outbound_json(request)
        if end.request_replacements:
            log.warning("request body carried %d lone surrogate(s); sent as U+FFFD", end.request_replacements)
        # Sampling settings the installed SDK's signature may not name travel in the body as they are.
        params = {k: v for k, v in request.items() if k != "temperature"}
        extra: dict[str, Any] = (
            {"extra_body": {"temperature": request["temperature"]}} if "temperature" in request else {}
        )
        if timeout is not None:
            extra["timeout"] = call_timeout(timeout)
        raw = await opened.enter_async_context(
            client.messages.with_streaming_response.create(**params, **extra, stream=True)
        )
    except Exception as e:  # every pre-stream failure becomes data
        end.failure = _classify(e)
        end.request_id = _request_id(e)
        return end
    response = raw.http_response
    end.request_id = response.headers.get("request-id")
    try:
        await _read(anthropic.AsyncStream.raw_events(response), response, sink, end)
    except Exception as e:
        end.failure = _classify(e)
        # A figure from a message_delta that preceded the failure is still the provider's figure;
        # a stream that never reached one keeps None.
    finally:
        await opened.aclose()
    return end


async def _read(events: Any, response: httpx2.Response, sink: BlockSink, end: StreamEnd) -> None:
    """The events into `sink` and `end`, as the SDK's typed stream would dispatch them.

    As there: `ping` is skipped, `error` fails the call (the SDK's own status error, so `_classify`
    names it), an event with no data is skipped, and the data's `type` decides what an event is,
    whatever its `event:` line says. An event with no `event:` line is named by its data's `type`.
    """
    stopped = False
    cur: Any = None  # index of the current block, and whether it is a text block
    is_text = False
    loads = json.loads
    async for sse in events:
        name = sse.event
        data = sse.data
        if name == "ping":
            continue
        if name == "error":
            raise _error_event(data, data, response)
        if not data:
            continue
        ev = loads(data)
        if name is None:  # no `event:` line: the data's own type names it
            name = ev.get("type") if ev.__class__ is dict else None
            if name == "ping":
                continue
            if name == "error":
                raise _error_event(ev, data, response)
        try:
            if ev.__class__ is not dict:
                raise TypeError(f"got {type(ev).__name__}")
            t = ev.get("type")
            if t == "content_block_delta":
                i = ev["index"]
                if i != cur:
                    is_text = sink.select(i)
                    cur = i
                d = ev["delta"]
                if d.__class__ is not dict:
                    raise TypeError("a delta that is not an object")
                if is_text and d.get("type") == "text_delta":
                    x = d.get("text")
                    if x.__class__ is not str:
                        raise TypeError("a text_delta without its text")
                    if not sink.add(x):
                        continue
                elif not sink.delta(d):
                    continue
            elif t == "content_block_start":
                cur = ev["index"]
                if cur.__class__ is not int:
                    raise TypeError(f"a content_block_start with index {cur!r}")
                given = ev["content_block"]
                if given.__class__ is not dict:
                    raise TypeError(f"a content block that is not an object: {type(given).__name__}")
                btype = given.get("type")
                if not isinstance(btype, str):
                    raise TypeError("a content block with no type")
                content, rest = _initial(btype, given)
                is_text = btype == "text"
                if not sink.start(cur, btype, content, rest):
                    continue
            elif t == "message_delta":
                dl = ev["delta"]
                if dl.__class__ is not dict:
                    raise TypeError("a delta that is not an object")
                reason = dl.get("stop_reason")
                if reason is not None and reason.__class__ is not str:
                    raise TypeError(f"a stop reason that is not a string: {reason!r}")
                end.stop_reason = reason
                details = dl.get("stop_details")
                if details is not None:
                    end.stop_details = details if isinstance(details, dict) else {"value": str(details)}
                usage = ev.get("usage")
                tokens = usage.get("output_tokens") if usage.__class__ is dict else None
                end.output_tokens = tokens if isinstance(tokens, int) else None
                continue
            elif t == "message_stop":
                stopped = True
                continue
            else:
                continue
        except (AttributeError, TypeError, KeyError, ValueError) as e:
            what = (
                "an event whose data is not a JSON object"
                if ev.__class__ is not dict
                else f"a {ev.get('type', '?')} event of the wrong shape"
            )
            raise MalformedEvent(f"{what}: {e}") from None
        await sink.flush()
    if not stopped and end.stop_reason is not None:
        log.info("stream ended after stop reason %s without message_stop", end.stop_reason)


def _error_event(body: Any, data: str, response: httpx2.Response) -> anthropic.APIStatusError:
    """An `error` event as the SDK's typed stream raises it (a status error with the response's 200),
    so `_classify` names it the same way whichever path read it. `body` is the data, decoded if it can be."""
    if body is data:
        try:
            body = json.loads(data)
            msg = f"{body}"
        except Exception:
            msg = data or f"Error code: {response.status_code}"
    else:
        msg = f"{body}"
    return anthropic.APIStatusError(msg, response=response, body=body)


def _classify(e: BaseException) -> Failure:
    if isinstance(e, anthropic.APIStatusError):
        code = e.status_code
        body = e.body if isinstance(e.body, dict) else {}
        inner = body.get("error")
        err: dict[str, Any] = inner if isinstance(inner, dict) else body
        etype = _error_type(err)
        msg = str(err.get("message")) if err.get("message") else str(e)
        if code == 200:  # an `event: error` inside the stream
            if etype is None or err is body:
                # Not `{"type": "error", "error": {"type": "<string>", …}}`: nothing says what failed.
                return Failure("malformed-stream", True, f"an error event of the wrong shape: {str(e)[:200]}", code)
            return Failure(etype, etype in _RETRYABLE_TYPES, msg, code)
        retryable = code in _RETRYABLE_STATUS or code >= 500
        return Failure(etype or f"http-{code}", retryable, msg, code, _retry_after(e.response.headers))
    if isinstance(e, anthropic.APITimeoutError):
        return Failure("timeout", True, "no response before the timeout")
    if isinstance(e, anthropic.APIConnectionError):
        return Failure("connection-error", True, str(e.__cause__ or e))
    if isinstance(e, anthropic.APIError):
        return Failure("api-error", False, str(e))
    return transport_failure(e) or internal_failure(e)


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


def _error_type(err: dict[str, Any]) -> str | None:
    """The error object's `type` when it is a non-empty string the project can use as a failure kind.

    It comes from the provider's body, so anything else (a number, an object, a name this process
    uses for its own failures) is not taken as a kind.
    """
    etype = err.get("type")
    if not isinstance(etype, str) or not etype or truth.is_internal(etype):
        return None
    return etype


def _retry_after(headers: Any) -> float | None:
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


def _request_id(e: BaseException) -> str | None:
    resp = getattr(e, "response", None)
    return resp.headers.get("request-id") if resp is not None else None


def _as_given(obj: Any) -> dict[str, Any]:
    """An SDK object as the provider sent it: only the keys it gave, under their API names."""
    to_dict = getattr(obj, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(f"expected an object, got {type(obj).__name__}")
    return to_dict(mode="json", warnings=False)
