"""Text on its way out of the process: pure functions, no I/O.

The ledger keeps every emitted text exactly, lone UTF-16 surrogates included (a provider's JSON can
carry `\\ud83d` on its own). What leaves the process (request bodies, Discord posts, JSON output)
must be valid UTF-8, so it passes through `outbound` there, and the number of replacements is
recorded beside it. Speech and partial posts also pass through `escape_subtext`, so only receipts
and notices render as Discord subtext. `cover` reads posts back: are they a text, exactly once?
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
# string): the delivery planner closes and reopens blocks by it, and `cover` reads them back.
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


def cover(text: str, contents: list[str]) -> str | None:
    """None when the contents, in order, are the text's pieces with only whitespace between and around.

    A piece may carry one added fence line at its start (reopening a block a split cut) and/or one at
    its end (closing it), and a `\\` before a line's leading `-# `, as the delivery planner writes
    them. Where a fence line could be either the text's own or an added one, both readings are
    followed (a set of reachable positions), so the check never rejects a split by guessing wrong.
    """
    if "".join(contents) == text:
        for c in contents:
            if not c or ESCAPE + SUBTEXT in c or len(_bodies(c)) > 1:
                break
        else:  # the pieces end to end, none of them empty or readable another way (the usual case):
            return None  # every position the reading reaches is at or past the exact one, which it ends at
    return cover_by_reading(text, contents)


def cover_by_reading(text: str, contents: list[str]) -> str | None:
    """`cover` by following every reading of every piece."""
    reach = {0}
    for i, c in enumerate(contents, 1):
        nxt: set[int] = set()
        for pos in reach:
            start = pos
            while start < len(text) and text[start].isspace():
                start += 1
            nxt |= _matches(text, pos, start, c)
        if not nxt:
            return f"text post {i} is not the next piece of the text (at character {min(reach)})"
        reach = set(sorted(nxt)[:64])
    if not any(not text[pos:].strip() for pos in reach):
        pos = max(reach)
        return f"characters {pos}..{len(text)} were never posted"
    return None


def _matches(text: str, pos: int, start: int, content: str) -> set[int]:
    """Where the text may continue after `content`, placed anywhere in the whitespace run pos..start."""
    out = set()
    for body, added in _bodies(content):
        if not (body or added):
            continue
        for j in range(pos, start + 1):  # a piece inside a code block may begin with its own indentation
            if text.startswith(body, j):
                out.add(j + len(body))
            elif ESCAPE + SUBTEXT in body:
                end = _escaped_at(text, j, body)
                if end is not None:
                    out.add(end)
    return out


def _escaped_at(text: str, j: int, body: str) -> int | None:
    """Where `body` ends in the text at `j`, reading a `\\` before a line's leading `-# ` as added.

    The planner escapes such lines so only receipts and notices render as subtext
    (`escape_subtext`); the text keeps its exact form. Deterministic: where the text itself
    has the `\\`, it matches as text, and an added one can only stand before a `-#` of the text.
    """
    i, n = j, len(text)
    for k, ch in enumerate(body):
        added = ch == ESCAPE and (k == 0 or body[k - 1] == "\n") and body.startswith(SUBTEXT, k + 1)
        if i < n and text[i] == ch:
            i += 1
        elif not (added and text.startswith(SUBTEXT, i)):
            return None
    return i


def _bodies(content: str) -> list[tuple[str, bool]]:
    """The content as posted, then with an added reopening and/or closing fence line taken off (each
    line looked at is sliced off alone: the usual post, with neither, is not copied)."""
    out = [(content, False)]
    head = None
    if "\n" in content and FENCE_LINE.match(content[: content.index("\n")]):
        head = content[content.index("\n") + 1 :]
        out.append((head, True))
    for c in (content, head):
        if c is not None and "\n" in c and FENCE_LINE.match(c[c.rindex("\n") + 1 :]):
            out.append((c[: c.rindex("\n")], True))
    if head is not None and FENCE_LINE.match(head):  # a chunk that is only a reopened and closed fence
        out.append(("", True))
    return out
