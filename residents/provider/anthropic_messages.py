"""`provider: anthropic`: Anthropic's Messages API. One call: the stream's events → content blocks, stop
reason, tokens, or a classified failure.

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
import json
import logging
from typing import Any

import anthropic
import httpx2

from .. import truth
from ..text import outbound_json
from .base import (
    KEY_CHECK_SECONDS,
    BlockSink,
    Endpoint,
    Failure,
    KeyRejected,
    MalformedEvent,
    StreamEnd,
    call_timeout,
    internal_failure,
    key_not_checked,
    retry_after,
    transport_failure,
)

log = logging.getLogger(__name__)

# Error types inside a stream (`event: error`) that a later attempt may not meet again.
_RETRYABLE_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
_RETRYABLE_STATUS = frozenset({408, 409, 429})
# Request keys sent in the body as given, whatever the installed SDK's signature names.
_IN_BODY = ("temperature", "cache_control")


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


def make_client(base_url: str | None, api_key: str | None, timeout: float = 600.0) -> anthropic.AsyncAnthropic:
    """The SDK client with its hidden retries off: each provider call must be an attempt we record."""
    return anthropic.AsyncAnthropic(
        base_url=base_url, api_key=api_key or "local", max_retries=0, timeout=call_timeout(timeout)
    )


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
        # Settings the installed SDK's signature may not name (sampling, the top-level cache mark)
        # travel in the body as they are.
        params = {k: v for k, v in request.items() if k not in _IN_BODY}
        in_body = {k: request[k] for k in _IN_BODY if k in request}
        extra: dict[str, Any] = {"extra_body": in_body} if in_body else {}
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
                if usage.__class__ is dict:  # (the API's counts here are cumulative: they stand over message_start's)
                    _input_usage(usage, end)
                continue
            elif t == "message_start":
                msg = ev.get("message")
                usage = msg.get("usage") if msg.__class__ is dict else None
                if usage.__class__ is dict:
                    _input_usage(usage, end)
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


# Anthropic's usage fields for the input, and where `StreamEnd` keeps each.
_INPUT_USAGE = (
    ("input_tokens", "input_tokens"),
    ("cache_creation_input_tokens", "cache_write_tokens"),
    ("cache_read_input_tokens", "cache_read_tokens"),
)


def _input_usage(usage: dict[str, Any], end: StreamEnd) -> None:
    """The input counts a usage object gives (message_start's, then message_delta's where it repeats
    them): a whole number is taken as the provider's own; a field absent or of another type leaves what was."""
    for field, attr in _INPUT_USAGE:
        value = usage.get(field)
        if value.__class__ is int and value >= 0:
            setattr(end, attr, value)


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
        return Failure(etype or f"http-{code}", retryable, msg, code, retry_after(e.response.headers))
    if isinstance(e, anthropic.APITimeoutError):
        return Failure("timeout", True, "no response before the timeout")
    if isinstance(e, anthropic.APIConnectionError):
        return Failure("connection-error", True, str(e.__cause__ or e))
    if isinstance(e, anthropic.APIError):
        return Failure("api-error", False, str(e))
    return transport_failure(e) or internal_failure(e)


def _error_type(err: dict[str, Any]) -> str | None:
    """The error object's `type` when it is a non-empty string the project can use as a failure kind.

    It comes from the provider's body, so anything else (a number, an object, a name this process
    uses for its own failures) is not taken as a kind.
    """
    etype = err.get("type")
    if not isinstance(etype, str) or not etype or truth.is_internal(etype):
        return None
    return etype


def _request_id(e: BaseException) -> str | None:
    resp = getattr(e, "response", None)
    return resp.headers.get("request-id") if resp is not None else None


class AnthropicProvider:
    """`provider: anthropic` (the key in ANTHROPIC_API_KEY, a compatible server in ANTHROPIC_BASE_URL)."""

    def __init__(self, client: anthropic.AsyncAnthropic, key_env: str = "ANTHROPIC_API_KEY", key_set: bool = True):
        self.client, self.key_env, self.key_set = client, key_env, key_set

    async def stream(self, request: dict[str, Any], sink: BlockSink, timeout: float | None = None) -> StreamEnd:
        return await stream_once(self.client, request, sink, timeout=timeout)

    async def check_key(self) -> None:
        """One cheap authenticated call (`GET /v1/models?limit=1`) before any bot connects.

        A 401/403 raises `KeyRejected` naming the variable. A server without that endpoint (404, 405),
        or one that cannot answer now, is no reason to stop: each call meets the key anyway.
        """
        host = self.client.base_url.host
        try:
            await self.client.models.list(limit=1, timeout=KEY_CHECK_SECONDS)
        except anthropic.APIStatusError as e:
            if e.status_code in (401, 403):
                body = e.body if isinstance(e.body, dict) else {}
                inner = body.get("error")
                err = inner if isinstance(inner, dict) else {}
                why = f"HTTP {e.status_code} {err.get('type') or f'http-{e.status_code}'}"
                raise KeyRejected(
                    f"{self.key_env}: the provider at {host} refused this key ({why}); set a valid key and start again"
                    if self.key_set
                    else f"{self.key_env}: not set, and the provider at {host} requires a key ({why})"
                ) from None
            key_not_checked(host, self.key_env, e.status_code)
        except anthropic.APIError as e:
            key_not_checked(host, self.key_env, type(e).__name__)

    async def close(self) -> None:
        await self.client.close()


def connect(endpoint: Endpoint) -> AnthropicProvider:
    """The registry's constructor (`residents.provider.REGISTRY`)."""
    return AnthropicProvider(make_client(endpoint.base_url, endpoint.key), endpoint.key_env, bool(endpoint.key))
