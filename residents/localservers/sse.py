"""Anthropic's streaming wire format, written out: for scripted replies and fault fixtures."""

from __future__ import annotations

import json
import re
from typing import Any


def event(name: str, data: dict[str, Any]) -> bytes:
    """Raw UTF-8 as the API sends it; \\u escapes only where a lone surrogate leaves no other way."""
    try:
        return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
    except UnicodeEncodeError:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def head(
    model: str,
    input_tokens: int = 10,
    message_id: str = "msg_local",
    cache_write_tokens: int | None = None,
    cache_read_tokens: int | None = None,
) -> bytes:
    """The message's start, its usage as Anthropic reports it: `input_tokens` (input neither written to nor
    read from the prompt cache) and, where given, `cache_creation_input_tokens` and `cache_read_input_tokens`."""
    usage: dict[str, int] = {"input_tokens": input_tokens, "output_tokens": 1}
    if cache_write_tokens is not None:
        usage["cache_creation_input_tokens"] = cache_write_tokens
    if cache_read_tokens is not None:
        usage["cache_read_input_tokens"] = cache_read_tokens
    return event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        },
    ) + event(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )


def delta(text: str) -> bytes:
    return event(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    )


def tail(stop_reason: str | None, output_tokens: int, stop_details: dict[str, Any] | None = None) -> bytes:
    d: dict[str, Any] = {"stop_reason": stop_reason, "stop_sequence": None}
    if stop_details is not None:
        d["stop_details"] = stop_details
    return (
        event("content_block_stop", {"type": "content_block_stop", "index": 0})
        + event("message_delta", {"type": "message_delta", "delta": d, "usage": {"output_tokens": output_tokens}})
        + event("message_stop", {"type": "message_stop"})
    )


def error(kind: str = "overloaded_error", message: str = "Overloaded") -> bytes:
    return event("error", {"type": "error", "error": {"type": kind, "message": message}})


def pieces(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or []


def stream(
    text: str,
    stop_reason: str | None = "end_turn",
    output_tokens: int | None = None,
    model: str = "claude-3-opus-20240229",
    size: int = 12,
    finish: bool = True,
) -> bytes:
    """A whole recorded-style stream for `text`; `finish=False` leaves out the stop events."""
    body = head(model) + b"".join(delta(p) for p in pieces(text, size))
    if finish:
        body += tail(stop_reason, output_tokens if output_tokens is not None else max(1, len(text) // 4))
    return body


def usage_of(raw: bytes) -> dict[str, int]:
    """The usage a recorded stream reports, as a client reads it: Anthropic's `message_start` usage, then
    each `message_delta`'s over it (its counts are cumulative; the start's `output_tokens` is a placeholder,
    left out), or a chat stream's usage chunk. Only whole numbers; {} for a stream reporting none."""
    out: dict[str, int] = {}
    for block in raw.decode("utf-8", "replace").split("\n\n"):
        for line in block.splitlines():
            if not line.startswith("data: "):
                continue
            try:
                d = json.loads(line[6:])
            except ValueError:
                continue
            if not isinstance(d, dict):
                continue
            kind, message = d.get("type"), d.get("message")
            if kind == "message_start":  # its output_tokens is a placeholder, not a count of the output
                usage = message.get("usage") if isinstance(message, dict) else None
                usage = {k: v for k, v in usage.items() if k != "output_tokens"} if isinstance(usage, dict) else None
            else:  # a message_delta, or a chat chunk (no `type`)
                usage = d.get("usage") if kind in ("message_delta", None) else None
            if isinstance(usage, dict):
                out.update({k: v for k, v in usage.items() if type(v) is int})
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and type(details.get("cached_tokens")) is int:
                    out["cached_tokens"] = details["cached_tokens"]
    return out


def text_of(raw: bytes) -> str:
    """The text a recorded stream carries: its text deltas joined, in order."""
    out = []
    for block in raw.decode("utf-8", "replace").split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                try:
                    d = json.loads(line[6:])
                except ValueError:
                    continue
                if (
                    isinstance(d, dict)
                    and d.get("type") == "content_block_delta"
                    and d.get("delta", {}).get("type") == "text_delta"
                ):
                    out.append(d["delta"]["text"])
    return "".join(out)


def tool_use_stream(
    text: str,
    tool_id: str,
    name: str,
    input_json: str,
    output_tokens: int = 40,
    model: str = "claude-3-opus-20240229",
    stop_reason: str | None = "tool_use",
    size: int = 12,
) -> bytes:
    """A recorded-style answer that says `text` (if any), then calls tool `name` with `input_json` as streamed."""
    body = head(model) + b"".join(delta(p) for p in pieces(text, size)) if text else head(model)
    body += event("content_block_stop", {"type": "content_block_stop", "index": 0})
    body += event(
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        },
    )
    for p in [""] + pieces(input_json, size):
        body += event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": p}},
        )
    body += event("content_block_stop", {"type": "content_block_stop", "index": 1})
    if stop_reason is not None or output_tokens:
        body += event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        )
    return body + event("message_stop", {"type": "message_stop"})


# A whole usage-carrying event: its `event:` line at a block's start, one `data:` line, the blank line.
_USAGE_EVENT = re.compile(rb"(?:^|(?<=\n\n))event: (message_start|message_delta)\ndata: ([^\n]*)\n\n")


def with_usage(raw: bytes, usage: dict[str, Any]) -> bytes:
    """`raw` with the input-token figures of its `message_start` (and of each `message_delta`, which
    repeats the counts, without the breakdown by lifetime) set to `usage`, as the provider counted
    this request; every other byte unchanged, and the body not copied piece by piece (a recorded
    stream may be megabytes of small deltas).

    Only well-formed events (`event:` then `data:` holding a JSON object) are rewritten: a recorded
    stream that is malformed on purpose stays exactly as recorded."""
    out: list[bytes] = []
    done = 0
    for m in _USAGE_EVENT.finditer(raw):
        name = m.group(1).decode()
        try:
            data = json.loads(m.group(2))
        except ValueError:
            continue
        holder = data.get("message") if name == "message_start" and isinstance(data, dict) else data
        if not isinstance(holder, dict) or not isinstance(holder.get("usage"), dict):
            continue
        given = usage if name == "message_start" else {k: v for k, v in usage.items() if k.endswith("_tokens")}
        holder["usage"] = {**holder["usage"], **given}
        out += [raw[done : m.start()], event(name, data)]
        done = m.end()
    return b"".join(out) + raw[done:] if out else raw
