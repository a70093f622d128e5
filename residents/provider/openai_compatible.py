"""`provider: openai-compatible`: any server speaking OpenAI's chat completions. One call: the SDK's
stream chunks → the same content blocks, stop reason, tokens or classified failure as the Anthropic
provider (`residents.provider.anthropic_messages`).

Built on `chat.completions.create(stream=True, stream_options={"include_usage": True})` with the
SDK's own retries off, so every call is one attempt the generation layer names, keeps and retries.
The request the rest of the project builds stays Anthropic Messages-shaped; it is translated here
(`chat_request`). The stop reason is the stream's `finish_reason` as given (what it means is
`residents.truth`'s); the token counts are the final usage chunk's (`completion_tokens`; `prompt_tokens`
less `prompt_tokens_details.cached_tokens`, which are cache reads), or None. Reasoning
deltas (`reasoning_content`, `reasoning`) are kept as `thinking` blocks, a `refusal` as a block of
its own, tool calls as `tool_use` blocks (their arguments as streamed), so only text is ever posted.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import openai

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

_RETRYABLE_STATUS = frozenset({408, 409, 429})
# Error types in an error object inside a stream that no later attempt would mend.
_FINAL_TYPES = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error", "insufficient_quota"}
)
# The first of these a delta carries (non-empty) is its reasoning; a server sending both sends the same text.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


def make_openai_client(base_url: str, api_key: str | None, timeout: float = 600.0) -> openai.AsyncOpenAI:
    """The SDK client with its hidden retries off: each provider call must be an attempt we record."""
    return openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key or "local", max_retries=0, timeout=call_timeout(timeout)
    )


# ---------------------------------------------------------------- the request, translated


def chat_request(request: dict[str, Any], official: bool = False) -> dict[str, Any]:
    """An Anthropic Messages-shaped request as chat-completions parameters.

    `system` becomes the first message; text blocks stay text; `tool_use` blocks become the assistant
    message's `tool_calls` and `tool_result` blocks `tool` messages; an image with a base64 source
    becomes an `image_url` data URL; a text document is inlined as text; reasoning is not sent back.
    `official`: OpenAI's own API, which takes the ceiling as `max_completion_tokens`.
    """
    messages: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        text = system if isinstance(system, str) else "".join(b.get("text", "") for b in system)
        messages.append({"role": "system", "content": text})
    for m in request.get("messages", []):
        messages += _messages_of(m)
    out: dict[str, Any] = {"model": request["model"], "messages": messages}
    if "max_tokens" in request:
        out["max_completion_tokens" if official else "max_tokens"] = request["max_tokens"]
    if "temperature" in request:
        out["temperature"] = request["temperature"]
    if request.get("stop_sequences"):
        out["stop"] = list(request["stop_sequences"])
    if request.get("tools"):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {"type": "object"}),
                },
            }
            for t in request["tools"]
        ]
    return out


def _messages_of(m: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = m["role"], m.get("content", "")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
        calls = [
            {
                "id": b.get("id", ""),
                "type": "function",
                "function": {
                    "name": b.get("name", ""),
                    "arguments": json.dumps(b.get("input", {}), ensure_ascii=False),
                },
                **({"extra_content": b["extra_content"]} if "extra_content" in b else {}),
            }
            for b in content
            if b.get("type") == "tool_use"
        ]
        msg: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            msg["tool_calls"] = calls
        return [msg]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for b in content:
        t = b.get("type")
        if t == "tool_result":  # a tool message must follow the assistant message that called it
            c = b.get("content", "")
            text = c if isinstance(c, str) else "".join(x.get("text", "") for x in c if isinstance(x, dict))
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": text})
        elif t == "text":
            parts.append({"type": "text", "text": b.get("text", "")})
        elif t == "image":
            src = b.get("source", {})
            url = (
                f"data:{src.get('media_type')};base64,{src.get('data')}"
                if src.get("type") == "base64"
                else src.get("url")
            )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif t == "document":
            src = b.get("source", {})
            if src.get("type") == "text":
                title = b.get("title")
                parts.append(
                    {"type": "text", "text": f"{title}:\n{src.get('data', '')}" if title else src.get("data", "")}
                )
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        out.append({"role": role, "content": "".join(p["text"] for p in parts) if only_text else parts})
    return out


# ---------------------------------------------------------------- the stream


class _Blocks:
    """Chat deltas as content blocks: a new block whenever the kind of content changes; one per tool call."""

    def __init__(self, sink: BlockSink) -> None:
        self.sink = sink
        self.next = 0
        self.cur: tuple[int, str] | None = None  # (block index, type) of the block that takes plain deltas
        self.tools: dict[int, tuple[int, str]] = {}  # a tool call's key → its block index and id
        self.last: int | None = None  # the key of the tool call started last
        self.at: int | None = None  # the block the sink has current
        self.refused = False

    def feed(self, btype: str, text: str) -> bool:
        if self.cur is not None and self.cur[1] == btype:
            return self._add(self.cur[0], text)
        i = self.next
        self.next += 1
        self.cur, self.at = (i, btype), i
        if btype == "refusal":
            self.refused = True
        return self.sink.start(i, btype, text, None)

    def tool(self, call: dict[str, Any]) -> bool:
        """A tool-call delta. Its `index` says which call it continues, but not every server numbers them:
        Gemini's compatible endpoint sends none, Ollama `0` for every call. So an id other than the one of
        the call at that index starts a new call, and a delta without an index continues the last one."""
        ti = call.get("index")
        fn = call.get("function") or {}
        cid = call.get("id") or ""
        if not isinstance(fn, dict) or not isinstance(ti, int | None) or not isinstance(cid, str):
            raise TypeError("a tool call of the wrong shape")
        args = fn.get("arguments") or ""
        if not isinstance(args, str):
            raise TypeError("tool call arguments that are not a string")
        key = self.last if ti is None else ti
        known = self.tools.get(key) if key is not None else None
        if known is None or (cid and known[1] and cid != known[1]):
            key = ti if ti is not None else -1 - self.next  # the newest call at an index takes its key
            i = self.next
            self.next += 1
            self.tools[key], self.last, self.cur, self.at = (i, cid), key, None, i
            start = {"id": cid, "name": fn.get("name") or ""}
            if isinstance(call.get("extra_content"), dict):  # Gemini's thought signature: sent back with the call
                start["extra_content"] = call["extra_content"]
            return self.sink.start(i, "tool_use", args, start)
        if ti is not None:
            self.last = key
        return self._add(known[0], args) if args else False

    def _add(self, i: int, text: str) -> bool:
        if self.at != i:
            self.sink.select(i)
            self.at = i
        return self.sink.add(text)


async def openai_stream_once(
    client: openai.AsyncOpenAI, request: dict[str, Any], sink: BlockSink, timeout: float | None = None
) -> StreamEnd:
    """One call; `timeout` (the residence's `retries.timeout_seconds`) overrides the client's for this call."""
    end = StreamEnd()
    finish: str | None = None
    blocks = _Blocks(sink)
    try:
        request, end.request_replacements = outbound_json(request)
        if end.request_replacements:
            log.warning("request body carried %d lone surrogate(s); sent as U+FFFD", end.request_replacements)
        params = chat_request(request, official=client.base_url.host == "api.openai.com")
        extra: dict[str, Any] = {"timeout": call_timeout(timeout)} if timeout is not None else {}
        stream = await client.chat.completions.create(
            **params, stream=True, stream_options={"include_usage": True}, **extra
        )
    except Exception as e:  # every pre-stream failure becomes data
        end.failure = _classify(e, started=False)
        end.request_id = _request_id(getattr(e, "response", None))
        return end
    end.request_id = _request_id(stream.response)
    try:
        async for chunk in stream:
            try:
                d = chunk.to_dict(mode="json", warnings=False)
                due = False
                usage = d.get("usage")
                if isinstance(usage, dict):
                    _usage(usage, end)
                for choice in d.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    delta = choice.get("delta") or {}
                    for name in _REASONING_FIELDS:
                        x = delta.get(name)
                        if x is None or x == "":
                            continue
                        if not isinstance(x, str):
                            raise TypeError(f"a delta whose {name} is not a string")
                        due |= blocks.feed("thinking", x)
                        break
                    for name, btype in (("content", "text"), ("refusal", "refusal")):
                        x = delta.get(name)
                        if x is not None and not isinstance(x, str):
                            raise TypeError(f"a delta whose {name} is not a string")
                        if x:
                            due |= blocks.feed(btype, x)
                    for call in delta.get("tool_calls") or []:
                        due |= blocks.tool(call)
                    reason = choice.get("finish_reason")
                    if reason is not None:
                        if not isinstance(reason, str):
                            raise TypeError(f"a finish_reason that is not a string: {reason!r}")
                        finish = reason
            except (AttributeError, TypeError, KeyError, ValueError) as e:
                raise MalformedEvent(f"a chunk of the wrong shape: {e}") from None
            if due:
                await sink.flush()
    except Exception as e:
        end.failure = _classify(e, started=True)
    finally:
        await stream.close()
    end.stop_reason = truth.chat_stop_reason(finish, blocks.refused, bool(blocks.tools))
    if end.stop_reason != finish:  # a refusal, or tools called: the finish_reason as given stays on record
        end.stop_details = {"finish_reason": finish}
    return end


def _usage(usage: dict[str, Any], end: StreamEnd) -> None:
    """The final usage chunk's counts, in the columns' one meaning (Anthropic's): `prompt_tokens` counts
    the cached tokens too, so input is `prompt_tokens` less `prompt_tokens_details.cached_tokens`, and those
    are cache reads (a chat server reports no cache writes: it caches by itself). A count it did not give
    stays None; cached tokens not given leave the whole prompt as input."""
    out, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    if isinstance(out, int):
        end.output_tokens = out
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and cached >= 0:
        end.cache_read_tokens = cached
    if isinstance(prompt, int) and prompt >= 0:
        end.input_tokens = max(0, prompt - (end.cache_read_tokens or 0))


def _classify(e: BaseException, started: bool) -> Failure:
    """openai's exceptions as the same failure kinds the Anthropic path names."""
    if isinstance(e, openai.APIStatusError):
        code = e.status_code
        body = e.body if isinstance(e.body, dict) else {}
        msg = str(body.get("message")) if body.get("message") else _said(code, e.body) or str(e)
        if code in (401, 403):  # whatever type the body names, this is the key refused
            return Failure(f"http-{code}", False, msg, code)
        etype = body.get("type")
        kind = etype if isinstance(etype, str) and etype and not truth.is_internal(etype) else f"http-{code}"
        # A 429 for an account out of credit (`insufficient_quota`) is no rate limit: no later attempt mends it.
        retryable = (code in _RETRYABLE_STATUS or code >= 500) and kind not in _FINAL_TYPES
        return Failure(kind, retryable, msg, code, retry_after(e.response.headers))
    if isinstance(e, openai.APITimeoutError):
        if started:
            return Failure("read-timeout", True, "the stream stalled past the read timeout")
        return Failure("timeout", True, "no response before the timeout")
    if isinstance(e, openai.APIConnectionError):
        if started:
            return Failure("connection-cut", True, "the connection closed mid-stream")
        return Failure("connection-error", True, str(e.__cause__ or e))
    if isinstance(e, openai.APIError):  # an error object inside the stream (HTTP 200)
        body = e.body if isinstance(e.body, dict) else {}
        etype = body.get("type")
        if not isinstance(etype, str) or not etype or truth.is_internal(etype):
            if isinstance(e.body, str) and e.body.strip():  # `{"error": "model unloaded"}`
                return Failure("stream-error", True, e.body.strip()[:200], 200)
            if not body.get("message"):
                return Failure("malformed-stream", True, f"an error object of the wrong shape: {str(e)[:200]}", 200)
            etype = "stream-error"
        return Failure(etype, etype not in _FINAL_TYPES, e.message, 200)
    if isinstance(e, openai.OpenAIError):
        return Failure("api-error", False, str(e))
    return transport_failure(e) or internal_failure(e)


def _said(code: int, body: object) -> str:
    """A body that is not an error object (an HTML page, `404 page not found`, a bare string): its words, for the log."""
    if not isinstance(body, str) or not body.strip():
        return ""
    return f"HTTP {code}: {' '.join(body.split())[:200]}"


def _request_id(response: Any) -> str | None:
    if response is None:
        return None
    return response.headers.get("x-request-id") or response.headers.get("request-id")


class OpenAICompatibleProvider:
    """`provider: openai-compatible`: the server at the residence's `base_url`, its key in `api_key_env`."""

    def __init__(self, client: openai.AsyncOpenAI, key_env: str) -> None:
        self.client, self.key_env = client, key_env

    async def stream(self, request: dict[str, Any], sink: BlockSink, timeout: float | None = None) -> StreamEnd:
        return await openai_stream_once(self.client, request, sink, timeout=timeout)

    async def check_key(self) -> None:
        """As the Anthropic provider's: one `GET /models` before any bot connects; only 401/403 stops start-up."""
        host = self.client.base_url.host
        try:
            await self.client.models.list(timeout=KEY_CHECK_SECONDS)
        except openai.APIStatusError as e:
            if e.status_code in (401, 403):
                raise KeyRejected(
                    f"{self.key_env}: the provider at {host} refused this key (HTTP {e.status_code}); set a valid key and start again"
                ) from None
            key_not_checked(host, self.key_env, e.status_code)
        except openai.OpenAIError as e:
            key_not_checked(host, self.key_env, type(e).__name__)

    async def close(self) -> None:
        await self.client.close()


def connect(endpoint: Endpoint) -> OpenAICompatibleProvider:
    """The registry's constructor (`residents.provider.REGISTRY`)."""
    assert endpoint.base_url is not None  # the residence's `base_url`, required by its configuration
    return OpenAICompatibleProvider(make_openai_client(endpoint.base_url, endpoint.key), endpoint.key_env)
