"""Text on its way out of the process: pure functions, no I/O.

The ledger keeps every emitted text exactly, lone UTF-16 surrogates included (a provider's JSON can
carry `\\ud83d` on its own). What leaves the process (request bodies, Discord posts, JSON output)
must be valid UTF-8, so it passes through `outbound` there, and the number of replacements is
recorded beside it. Speech and partial posts also pass through `escape_subtext`, so only receipts
and notices render as Discord subtext.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_SURROGATES = re.compile(r"[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")


def outbound(s: str) -> tuple[str, int]:
    """`s` as valid Unicode, and how many lone surrogates were replaced by U+FFFD to make it so.

    A high surrogate followed by a low one is a pair split into two code units (text assembled from
    deltas that each carried one half): it is joined into the character it encodes, not replaced.
    """
    try:
        s.encode("utf-8")
        return s, 0
    except UnicodeEncodeError:
        pass
    replaced = 0

    def fix(m: re.Match[str]) -> str:
        nonlocal replaced
        unit = m.group()
        if len(unit) == 2:
            return chr(0x10000 + ((ord(unit[0]) - 0xD800) << 10) + (ord(unit[1]) - 0xDC00))
        replaced += 1
        return REPLACEMENT

    return _SURROGATES.sub(fix, s), replaced


def outbound_json(value: Any) -> tuple[Any, int]:
    """A JSON-shaped value (dicts, lists, strings, scalars) with every string made `outbound`."""
    if isinstance(value, str):
        return outbound(value)
    if isinstance(value, dict):
        total, out = 0, {}
        for k, v in value.items():
            k2, n1 = outbound(k) if isinstance(k, str) else (k, 0)
            out[k2], n2 = outbound_json(v)
            total += n1 + n2
        return (out, total) if total else (value, 0)
    if isinstance(value, (list, tuple)):
        total, items = 0, []
        for v in value:
            v2, n = outbound_json(v)
            items.append(v2)
            total += n
        return (type(value)(items), total) if total else (value, 0)
    return value, 0


# A line that opens or closes a Markdown code block (up to three spaces, then ``` or ~~~ and an info
# string): the delivery planner closes and reopens blocks by it, and the ledger's verify reads them back.
FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})([^\n`]*)$")
SUBTEXT = "-# "  # Discord's subtext marker; it renders only at the very start of a line
ESCAPE = "\\"
_FENCE = "```"


def escape_subtext(content: str) -> str:
    """Discord message content in which no line of the text renders as subtext: `-# ` → `\\-# `.

    Discord's rule, followed here: subtext is a line whose first characters are `-# ` (an indented
    `  -# ` is plain text there, so it is left alone), and nothing inside a code block (between a
    ``` and the next ```) is markdown, so a line there keeps its text (a `\\` would show). Discord
    hides the backslash of an escaped punctuation mark, so the line reads the same, in plain type.
    A subtext marker nested after a quote (`> -# `), a bullet or a heading renders with that marker
    (a quote bar, a bullet, a heading) and cannot pass for a room's receipt; it is not escaped.
    """
    if SUBTEXT not in content:
        return content
    code = _code_spans(content)
    out: list[str] = []
    pos, k = 0, 0
    for start in _line_starts(content):
        if not content.startswith(SUBTEXT, start):
            continue
        while k < len(code) and code[k][1] <= start:
            k += 1
        if k < len(code) and code[k][0] <= start:
            continue  # inside a code block
        out.append(content[pos:start])
        out.append(ESCAPE)
        pos = start
    out.append(content[pos:])
    return "".join(out)


def _line_starts(content: str) -> list[int]:
    starts = [0]
    i = content.find("\n")
    while i >= 0:
        starts.append(i + 1)
        i = content.find("\n", i + 1)
    return starts


def _code_spans(content: str) -> list[tuple[int, int]]:
    """[start, end) of each code block: a ``` paired with the next ```, left to right, as Discord reads."""
    spans: list[tuple[int, int]] = []
    i = content.find(_FENCE)
    while i >= 0:
        j = content.find(_FENCE, i + 3)
        if j < 0:
            break
        spans.append((i, j + 3))
        i = content.find(_FENCE, j + 3)
    return spans
