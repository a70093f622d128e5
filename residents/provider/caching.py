"""Prompt caching as a request asks for it, for providers that cache only where a request says.

Anthropic caches a request's prefix (tools, then system, then messages) only up to a block marked
`cache_control`, at most `MAX_BREAKPOINTS` of them per request (a top-level `cache_control` marks
the last block and counts as one), and only a prefix of at least its model's minimum. A mark below
`MIN_CACHEABLE_TOKENS` would be spent for nothing, so none is placed there; sizes are estimated as
the file budget estimates them (`residents.truth.BYTES_PER_TOKEN`). Where the request compiler
places the marks, and why the prefix stays byte-stable: docs/providers.md, "Prompt caching".
OpenAI-compatible servers cache a repeated prefix by themselves and are sent no marks.
"""

from __future__ import annotations

import json
from typing import Any

from .. import truth

BREAKPOINT: dict[str, str] = {"type": "ephemeral"}  # five minutes, renewed by each read
MAX_BREAKPOINTS = 4
MIN_CACHEABLE_TOKENS = 1_024  # the smallest minimum of any current Claude model; larger ones simply read less


def estimated_tokens(value: Any) -> int:
    """About how many tokens `value` (a system prompt, tools, messages) takes: its JSON's UTF-8 bytes at
    `truth.BYTES_PER_TOKEN`."""
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return -(-len(data) // truth.BYTES_PER_TOKEN)


def with_breakpoint(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`content` (a string or blocks) as blocks whose last carries the mark; the others unchanged."""
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
    )
    blocks[-1]["cache_control"] = dict(BREAKPOINT)
    return blocks


def breakpoints(request: dict[str, Any]) -> int:
    """The marks `request` carries: marked tools, system blocks and message blocks, and a top-level one
    (which marks the last block, unless that block is marked already)."""
    marked = [t for t in request.get("tools") or [] if "cache_control" in t]
    system = request.get("system")
    if isinstance(system, list):
        marked += [b for b in system if "cache_control" in b]
    last: Any = None
    for m in request.get("messages") or []:
        if isinstance(m.get("content"), list):
            marked += [b for b in m["content"] if "cache_control" in b]
            last = m["content"][-1] if m["content"] else None
        else:
            last = None
    top = "cache_control" in request and not (isinstance(last, dict) and "cache_control" in last)
    return len(marked) + int(top)
