"""A generation's request, stored by content so a busy room's ledger grows with what was said.

Each turn's request repeats the room's recent history; stored whole, a ledger grows with history ×
turns (~40 KB a generation in a busy room). Stored here instead: every *part* once, in `request_parts`
keyed by its SHA-256 — a room line of a text message (its content split at the paragraph breaks
`compile` joins turns with), or a whole message of content blocks (the tool loop's) as its JSON — and
for each generation a small *ref*: the request as JSON with each message replaced by its parts' keys.

`unpack` gives back the request exactly: `json.dumps(unpack(...))` is the very bytes `json.dumps` of
the original gave, which is what the ledger stored before (the migration converting old rows checks
this row by row and leaves any row that would not come back so in its old column).

A ref's message is `[role, key, key, ...]` (content: the parts' text joined by a paragraph break) or
one `key` (the message: the part's JSON). A key is the SHA-256's first 8 bytes as a signed integer
(SQLite's rowid); the whole hash is kept with the part, and a collision is refused by the schema.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SEP = "\n\n"  # bot.context.compile joins turns of one role with a paragraph break


@dataclass(frozen=True)
class Part:
    id: int
    sha256: bytes
    body: bytes


@dataclass(frozen=True)
class Packed:
    ref: bytes  # ASCII JSON
    parts: list[Part]


def part(body: bytes) -> Part:
    d = hashlib.sha256(body).digest()
    return Part(int.from_bytes(d[:8], "big", signed=True), d, body)


def pack(request: dict[str, Any], memo: dict[str, Part] | None = None) -> Packed:
    """The request's ref and parts. `memo` (text → part) spares re-hashing lines a caller sends again."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return Packed(json.dumps(request).encode("ascii"), [])
    refs: list[Any] = []
    parts: dict[int, Part] = {}
    for m in messages:
        if isinstance(m, dict) and list(m) == ["role", "content"] and isinstance(m["content"], str):
            ids: list[Any] = [m["role"]]
            for text in m["content"].split(SEP):
                p = memo.get(text) if memo is not None else None
                if p is None:
                    p = part(text.encode("utf-8", "surrogatepass"))
                    if memo is not None:
                        memo[text] = p
                parts[p.id] = p
                ids.append(p.id)
            refs.append(ids)
        else:
            p = part(json.dumps(m).encode("ascii"))
            parts[p.id] = p
            refs.append(p.id)
    return Packed(json.dumps({**request, "messages": refs}).encode("ascii"), list(parts.values()))


def part_ids(ref: bytes | str) -> list[int]:
    """The keys of the parts a ref names, each once."""
    messages = json.loads(ref).get("messages")
    if not isinstance(messages, list):
        return []
    out: dict[int, None] = {}
    for m in messages:
        for i in m[1:] if isinstance(m, list) else [m]:
            out[i] = None
    return list(out)


def unpack(ref: bytes | str, body: Mapping[int, bytes]) -> dict[str, Any]:
    """The request a ref stands for; `body`: the stored bytes of its parts, by key."""
    request: dict[str, Any] = json.loads(ref)
    messages = request.get("messages")
    if isinstance(messages, list):
        request["messages"] = [
            {"role": m[0], "content": SEP.join(bytes(body[i]).decode("utf-8", "surrogatepass") for i in m[1:])}
            if isinstance(m, list)
            else json.loads(bytes(body[m]).decode("ascii"))
            for m in messages
        ]
    return request


def unpack_bytes(ref: bytes | str, body: Mapping[int, bytes]) -> bytes:
    """The request's JSON bytes exactly as the ledger stored it whole before m033."""
    return json.dumps(unpack(ref, body)).encode("ascii")
