"""A generation's request, stored by content so a busy room's ledger grows with what was said.

Each turn's request repeats the room's recent history; stored whole, a ledger grows with history ×
turns (~40 KB a generation in a busy room). Stored here instead: every *part* once, in `request_parts`
keyed by its SHA-256 — a room line of a text message (its content split at the paragraph breaks
`compile` joins turns with), or a whole message of content blocks (the tool loop's) as its JSON; and
each *run* of consecutive messages, as the JSON list of their parts' keys. A generation keeps a small
*ref*: `{"request": [[field, how, value], ...]}` in the request's own order of fields — `"v"` a small
value as is, `"p"` the key of a part holding a larger one's JSON (tools, a long system prompt), `"m"`
the messages as the keys of their runs. Runs end where a
message's first key says so (content-defined, ~8 messages a run), so the next turn's window, slid by
a line or two, shares all but its first and last runs with this one: each turn adds what was said,
a run or two and a ref of a few keys, not the history again.

`unpack` gives back the request exactly: `json.dumps(unpack(...))` is the very bytes `json.dumps` of
the original gave, which is what the ledger stored before (the migration converting old rows checks
this row by row and leaves any row that would not come back so in its old column).

In a run, a message is `[role, key, key, ...]` (content: the parts' text joined by a paragraph break)
or one `key` (the message: the part's JSON). A key is the SHA-256's first 8 bytes as a signed integer
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


def part_of(body: bytes) -> Part:
    """A stored part for `body`: keyed by its SHA-256 (its first 8 bytes as the integer key)."""
    d = hashlib.sha256(body).digest()
    return Part(int.from_bytes(d[:8], "big", signed=True), d, body)


def _keep(parts: dict[int, Part], p: Part) -> None:
    """`p` among a request's parts; two different parts under one key are refused (the schema's trigger
    sees only rows already stored, not two parts of one request, of which only one would be written)."""
    have = parts.setdefault(p.id, p)
    if have.sha256 != p.sha256:
        raise ValueError("two parts of a request share the first 8 bytes of their SHA-256")


RUN = 8  # messages end a run where their first part's key is a multiple of this: ~8 messages a run


INLINE = 64  # a field of the request whose JSON is longer is stored as a part (tools, a long system prompt)


def pack(request: dict[str, Any], memo: dict[str, Part] | None = None) -> Packed:
    """The request's ref and parts. `memo` (text → part) spares re-hashing lines a caller sends again."""
    parts: dict[int, Part] = {}
    fields: list[list[Any]] = []
    for key, value in request.items():
        if key == "messages" and isinstance(value, list):
            fields.append([key, "m", _runs(value, parts, memo)])
            continue
        blob = json.dumps(value)
        if len(blob) <= INLINE:
            fields.append([key, "v", value])
        else:
            p = part_of(blob.encode("ascii"))
            _keep(parts, p)
            fields.append([key, "p", p.id])
    return Packed(json.dumps({"request": fields}).encode("ascii"), list(parts.values()))


def _runs(messages: list[Any], parts: dict[int, Part], memo: dict[str, Part] | None) -> list[int]:
    runs: list[int] = []
    run: list[Any] = []
    for n, m in enumerate(messages, 1):
        if isinstance(m, dict) and list(m) == ["role", "content"] and isinstance(m["content"], str):
            ids: list[Any] = [m["role"]]
            for text in m["content"].split(SEP):
                p = memo.get(text) if memo is not None else None
                if p is None:
                    p = part_of(text.encode("utf-8", "surrogatepass"))
                    if memo is not None:
                        memo[text] = p
                _keep(parts, p)
                ids.append(p.id)
            run.append(ids)
            key = ids[1]
        else:
            p = part_of(json.dumps(m).encode("ascii"))
            _keep(parts, p)
            run.append(p.id)
            key = p.id
        if key % RUN == 0 or n == len(messages):  # boundaries set by content: a sliding window keeps its runs
            r = part_of(json.dumps(run).encode("ascii"))
            _keep(parts, r)
            runs.append(r.id)
            run = []
    return runs


def needed(ref: bytes | str, have: Mapping[int, bytes]) -> list[int]:
    """The keys of parts the ref needs that are not in `have` yet: its fields and runs first, then the
    runs' parts (call again with the runs fetched)."""
    out: dict[int, None] = {}
    for _key, how, value in json.loads(ref)["request"]:
        for r in value if how == "m" else [value] if how == "p" else []:
            if r not in have:
                out[r] = None
            elif how == "m":
                for m in json.loads(have[r]):
                    for i in m[1:] if isinstance(m, list) else [m]:
                        if i not in have:
                            out[i] = None
    return list(out)


def unpack(ref: bytes | str, body: Mapping[int, bytes]) -> dict[str, Any]:
    """The request a ref stands for; `body`: the stored bytes of its parts (fields, runs, lines), by key."""
    request: dict[str, Any] = {}
    for key, how, value in json.loads(ref)["request"]:
        if how == "v":
            request[key] = value
        elif how == "p":
            request[key] = json.loads(bytes(body[value]).decode("ascii"))
        else:
            request[key] = [
                {"role": m[0], "content": SEP.join(bytes(body[i]).decode("utf-8", "surrogatepass") for i in m[1:])}
                if isinstance(m, list)
                else json.loads(bytes(body[m]).decode("ascii"))
                for r in value
                for m in json.loads(body[r])
            ]
    return request


def unpack_bytes(ref: bytes | str, body: Mapping[int, bytes]) -> bytes:
    """The request's JSON bytes exactly as the ledger stored it whole before m033."""
    return json.dumps(unpack(ref, body)).encode("ascii")
