"""One provider call: the SDK's raw stream events → text, stop reason, tokens, or a classified failure.

Built on `messages.create(stream=True)` (the SDK's leanest path) with the SDK's own retries off, so
every call is one attempt the generation layer can name, keep and retry itself. Every way a stream
can end is caught here and turned into plain data; nothing escapes as an exception.
"""
from __future__ import annotations

import email.utils
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anthropic
import httpx2

from ..text import outbound_json

log = logging.getLogger(__name__)

# Error types inside a stream (`event: error`) that a later attempt may not meet again.
_RETRYABLE_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
_RETRYABLE_STATUS = frozenset({408, 409, 429})


@dataclass
class Failure:
    kind: str  # e.g. overloaded_error, http-529, connection-cut, read-timeout, malformed-stream
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


class TextSink(Protocol):
    """Where deltas go as they arrive: `add` says cheaply whether a flush is due; `flush` may await."""

    def add(self, text: str) -> bool: ...

    async def flush(self) -> None: ...


@dataclass
class ListSink:
    """A sink that only collects: for callers with no ledger (benchmarks of the bare path, tests)."""
    parts: list[str] = field(default_factory=list)

    def add(self, text: str) -> bool:
        self.parts.append(text)
        return False

    async def flush(self) -> None:
        return None


def make_client(base_url: str | None, api_key: str | None, timeout: float = 600.0) -> anthropic.AsyncAnthropic:
    """The SDK client with its hidden retries off: each provider call must be an attempt we record."""
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key or "local", max_retries=0,
                                    timeout=call_timeout(timeout))


def call_timeout(seconds: float) -> httpx2.Timeout:
    """Silence longer than `seconds` (a read, a write, a wait for the pool) cuts the call; connecting gets ≤ 10 s."""
    return httpx2.Timeout(seconds, connect=min(seconds, 10.0))


async def stream_once(client: anthropic.AsyncAnthropic, request: dict[str, Any], sink: TextSink,
                      timeout: float | None = None) -> StreamEnd:
    """One call; `timeout` (the residence's `retries.timeout_seconds`) overrides the client's for this call."""
    end = StreamEnd()
    try:
        # Sampling settings the installed SDK's signature may not name travel in the body as they are.
        params = outbound_json({k: v for k, v in request.items() if k != "temperature"})[0]  # valid UTF-8 leaves
        extra: dict[str, Any] = {"extra_body": {"temperature": request["temperature"]}} if "temperature" in request else {}
        if timeout is not None:
            extra["timeout"] = call_timeout(timeout)
        stream = await client.messages.create(**params, **extra, stream=True)
    except Exception as e:  # every pre-stream failure becomes data
        end.failure = _classify(e)
        end.request_id = _request_id(e)
        return end
    end.request_id = stream.response.headers.get("request-id")
    stopped = False
    try:
        async for ev in stream:
            t = ev.type
            if t == "content_block_delta":
                d = ev.delta
                if d.type == "text_delta":
                    if sink.add(d.text):
                        await sink.flush()
            elif t == "message_delta":
                end.stop_reason = ev.delta.stop_reason
                details = getattr(ev.delta, "stop_details", None)
                if details is not None:
                    end.stop_details = details if isinstance(details, dict) else _as_dict(details)
                usage = getattr(ev, "usage", None)
                tokens = getattr(usage, "output_tokens", None) if usage is not None else None
                end.output_tokens = tokens if isinstance(tokens, int) else None
            elif t == "message_stop":
                stopped = True
    except Exception as e:
        end.failure = _classify(e)
        # A figure from a message_delta that preceded the failure is still the provider's figure;
        # a stream that never reached one keeps None.
    finally:
        await stream.close()
    if end.failure is None and not stopped and end.stop_reason is not None:
        log.info("stream ended after stop reason %s without message_stop", end.stop_reason)
    return end


def _classify(e: BaseException) -> Failure:
    if isinstance(e, anthropic.APIStatusError):
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error") if isinstance(body.get("error"), dict) else body
        etype = err.get("type") if isinstance(err, dict) else None
        msg = str(err.get("message")) if isinstance(err, dict) and err.get("message") else str(e)
        code = e.status_code
        if code == 200:  # an `event: error` inside the stream
            kind = etype or "stream-error"
            return Failure(kind, kind in _RETRYABLE_TYPES, msg, code)
        retryable = code in _RETRYABLE_STATUS or code >= 500
        return Failure(etype or f"http-{code}", retryable, msg, code, _retry_after(e.response.headers))
    if isinstance(e, anthropic.APITimeoutError):
        return Failure("timeout", True, "no response before the timeout")
    if isinstance(e, anthropic.APIConnectionError):
        return Failure("connection-error", True, str(e.__cause__ or e))
    if isinstance(e, httpx2.TimeoutException):
        return Failure("read-timeout", True, "the stream stalled past the read timeout")
    if isinstance(e, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.NetworkError)):
        return Failure("connection-cut", True, "the connection closed mid-stream")
    if isinstance(e, httpx2.HTTPError):
        return Failure("connection-error", True, type(e).__name__)
    if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
        return Failure("malformed-stream", True, f"{type(e).__name__}: {e}")
    if isinstance(e, anthropic.APIError):
        return Failure("api-error", False, str(e))
    log.exception("unexpected failure while streaming", exc_info=e)
    return Failure(f"unexpected-{type(e).__name__}", False, str(e))


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


def _as_dict(obj: Any) -> dict[str, Any]:
    dump = getattr(obj, "model_dump", None)
    return dump() if callable(dump) else {"value": str(obj)}
