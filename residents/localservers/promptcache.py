"""Anthropic's prompt caching as the local provider server accounts for it, so that what a request's
`cache_control` breakpoints save can be measured offline, by the rules Anthropic documents
(https://platform.claude.com/docs/en/build-with-claude/prompt-caching):

- A request is read as one sequence of blocks, in the order the model reads it: each tool
  definition, each system block (a string system prompt is one text block), then each message's
  content blocks (a string content is one text block). `cache_control` is not part of a block's
  content: marking or unmarking a block changes no prefix.
- A block carrying `cache_control` is a breakpoint; a top-level `cache_control` (automatic caching)
  marks the last block. More than `MAX_BREAKPOINTS` is refused (HTTP 400), as the API refuses it.
- A prefix is cached (written) only at a breakpoint, and only if it holds at least
  `MIN_CACHEABLE_TOKENS` tokens. A later request reads the longest cached prefix that ends at one
  of its breakpoints or at one of the `LOOKBACK_BLOCKS` blocks before one.
- The usage reported: `cache_read_input_tokens`, the prefix read; `cache_creation_input_tokens`,
  from there to the end of the last prefix written; `input_tokens`, the rest. Their sum is the
  request's whole input.
- An entry lives five minutes (an hour with `ttl: "1h"`), and each read starts that time again.
  Caches are per model.

Tokens are counted deterministically, as this server counts its replies' (four characters a token):
a block is its canonical JSON (keys sorted, no `cache_control`), a quarter of its characters,
rounded up. Only the counts are estimates; the rules above are the API's.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_BREAKPOINTS = 4
MIN_CACHEABLE_TOKENS = 1_024
LOOKBACK_BLOCKS = 20  # blocks before a breakpoint whose prefixes are also looked up
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
CHARS_PER_TOKEN = 4


class TooManyBreakpoints(ValueError):
    """A request marking more blocks with `cache_control` than the API allows."""


@dataclass(frozen=True)
class _Block:
    tokens: int
    breakpoint: str | None  # the marked block's ttl ("5m" or "1h"); None when not a breakpoint


@dataclass
class Accounting:
    """One request's cache use: what it reads, what it would write, and the usage the API reports."""

    model: str
    hashes: list[str]  # of each prefix: hashes[i] covers blocks 0..i
    ends: list[int]  # tokens of each prefix
    read_at: int | None  # the block the longest cached prefix read ends at
    writes: list[tuple[int, str]]  # (block, ttl) of each breakpoint prefix written
    usage: dict[str, Any] = field(default_factory=dict)


def _canonical(block: Any) -> str:
    return json.dumps(block, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _tokens(canonical: str) -> int:
    return max(1, -(-len(canonical) // CHARS_PER_TOKEN))


def block_tokens(block: Any) -> int:
    """A block's tokens: its canonical JSON's characters at `CHARS_PER_TOKEN`, rounded up, at least one."""
    return _tokens(_canonical(block))


def _content_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, dict) for b in content):
        return content
    raise TypeError("content that is neither a string nor a list of blocks")


def _ttl(mark: Any) -> str:
    ttl = mark.get("ttl", "5m") if isinstance(mark, dict) else "5m"
    return ttl if ttl in TTL_SECONDS else "5m"


def _blocks(body: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(what a block is, its cache_control or None), in the order the model reads them."""
    out: list[tuple[Any, Any]] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            raise TypeError("a tool that is not an object")
        out.append((("tool", _bare(tool)), tool.get("cache_control")))
    system = body.get("system")
    if system:
        for b in _content_blocks(system):
            out.append((("system", _bare(b)), b.get("cache_control")))
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise TypeError("messages that are not a list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError("a message that is not an object")
        for b in _content_blocks(m.get("content", "")):
            out.append((("message", i, m.get("role"), _bare(b)), b.get("cache_control")))
    return out


def _bare(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


class PromptCache:
    """The server's cache of prompt prefixes; `plan` a request's use, `commit` it once it is answered."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._entries: dict[str, tuple[float, float]] = {}  # prefix hash -> (when it expires, its lifetime)

    def _live(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry[0] > self.clock()

    def plan(self, body: dict[str, Any]) -> Accounting | None:
        """What `body` reads from and writes to the cache; None for a body that is not a Messages request.

        Raises `TooManyBreakpoints` for more than `MAX_BREAKPOINTS` marked blocks."""
        try:
            raw = _blocks(body)
        except (TypeError, AttributeError):
            return None
        if not raw:
            return None
        marks = [cc for _, cc in raw]
        top = body.get("cache_control")
        if top is not None and marks[-1] is None:
            marks[-1] = top
        count = sum(m is not None for m in marks)
        if count > MAX_BREAKPOINTS:
            raise TooManyBreakpoints(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {count}."
            )
        model = str(body.get("model", ""))
        digest = hashlib.sha256(json.dumps(model).encode())
        blocks: list[_Block] = []
        hashes: list[str] = []
        ends: list[int] = []
        total = 0
        for (what, _), mark in zip(raw, marks, strict=True):
            canonical = _canonical(what)
            digest.update(canonical.encode())
            hashes.append(digest.copy().hexdigest())
            tokens = _tokens(canonical)
            blocks.append(_Block(tokens, None if mark is None else _ttl(mark)))
            total += tokens
            ends.append(total)
        points = [i for i, b in enumerate(blocks) if b.breakpoint is not None]
        read_at: int | None = None
        for p in points:
            for i in range(p, max(-1, p - LOOKBACK_BLOCKS - 1), -1):
                if self._live(hashes[i]):
                    if read_at is None or i > read_at:
                        read_at = i
                    break  # walking back, the first cached prefix is this breakpoint's longest
        read = ends[read_at] if read_at is not None else 0
        writes = [
            (p, blocks[p].breakpoint or "5m")
            for p in points
            if ends[p] >= MIN_CACHEABLE_TOKENS and (read_at is None or p > read_at) and not self._live(hashes[p])
        ]
        created = {"5m": 0, "1h": 0}
        upto = read
        for p, ttl in writes:
            created[ttl] += ends[p] - upto
            upto = ends[p]
        usage = {
            "input_tokens": total - upto,
            "cache_creation_input_tokens": upto - read,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": created["5m"],
                "ephemeral_1h_input_tokens": created["1h"],
            },
        }
        return Accounting(model, hashes, ends, read_at, writes, usage)

    def commit(self, plan: Accounting) -> None:
        """The request was answered: its prefixes are written, and the one it read lives longer."""
        now = self.clock()
        if plan.read_at is not None:
            key = plan.hashes[plan.read_at]
            lifetime = self._entries[key][1]
            self._entries[key] = (now + lifetime, lifetime)
        for p, ttl in plan.writes:
            self._entries[plan.hashes[p]] = (now + TTL_SECONDS[ttl], TTL_SECONDS[ttl])
