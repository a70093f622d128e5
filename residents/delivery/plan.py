"""From a settled generation to the posts a room should receive, in order.

Delivery plans; rooms send. Text is split into Discord-sized chunks that are exact substrings of
the canonical text (whitespace at the joins aside), a code fence a split cuts is closed and
reopened, a text line that would render as Discord subtext is escaped (`\\-# `) so only receipts
and notices look like boundary lines, and the boundary line comes last, in the wording `residents.truth`
owns.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .. import truth
from ..records import Planned, PostKind, PostReason
from ..text import FENCE_LINE, escape_subtext
from ..truth import LIMIT, RECEIPT_PREFIX

_SENTENCE_END = re.compile(r"[.!?…][\"')\]]*\s")


def split_text(text: str, limit: int = LIMIT, *, escape: bool = False) -> list[str]:
    """Chunks of at most `limit` characters, cut at the best boundary available in each window.

    Preference: paragraph, line, sentence, word, then a hard cut. Linear in len(text): each window is
    searched once and fence state is carried forward line by line. With `escape`, each chunk's
    subtext-looking lines are escaped (`residents.text.escape_subtext`) and the `\\` counts in its size.
    """
    chunks: list[str] = []
    pos, n = 0, len(text)
    fence: str | None = None  # the opening line of a code block still open at `pos`
    while pos < n:
        while pos < n and text[pos].isspace() and fence is None:
            pos += 1
        if pos >= n:
            break
        reopen = _reopen(fence) if fence else ""
        spare = 0  # characters the escapes of the chunk tried last took beyond the limit
        while True:
            budget = limit - len(reopen) - spare
            ahead = text[pos : pos + budget]
            # room for "\n```" if the chunk ends inside a block, or for the block's own closing line
            end_fence_room = 8 if fence or "```" in ahead or "~~~" in ahead else 0
            if n - pos <= budget:
                cut = n
            else:
                window = ahead[: budget - end_fence_room]
                cut = pos + max(1, _best_cut(window))
                cut = _clear_of_fences(text, pos, cut, fence, pos + budget)
            piece = text[pos:cut]
            fence_after = _fence_state(piece, fence, pos == 0 or text[pos - 1] == "\n", cut >= n or text[cut] == "\n")
            body = piece.rstrip() if fence_after is None else piece.rstrip("\n")
            if fence is not None and not body.strip():
                body = ""
            content = reopen + body
            if fence_after is not None and cut < n:
                content = content + ("\n" if not content.endswith("\n") else "") + "```"
            if escape:
                content = escape_subtext(content)
            over = len(content) - limit
            if over <= 0 or budget <= 1:
                break
            spare += over
        if content.strip():
            chunks.append(content)
        fence = fence_after
        pos = cut
    return chunks


def _clear_of_fences(text: str, pos: int, cut: int, fence: str | None, limit: int) -> int:
    """Never leave a fence line at the start of the next chunk while a block is open.

    A closing fence right after the cut is taken into this chunk (it closes the block itself);
    any other line starting with a fence marker moves the cut back before the line break, so the added
    closing fence and the text's own marker can never be mistaken for one another.
    """
    if not text.startswith(("```", "~~~"), cut):
        return cut
    piece = text[pos:cut]
    open_after = _fence_state(piece, fence, pos == 0 or text[pos - 1] == "\n", text[cut - 1] == "\n")
    if open_after is None:
        return cut
    end = text.find("\n", cut)
    end = len(text) if end < 0 else end
    m = FENCE_LINE.match(text[cut:end])
    if m and not m.group(2).strip() and m.group(1)[0] == open_after.lstrip()[0] and end <= limit:
        return end
    back = cut
    while back - 1 > pos and not text[back - 1 : cut].strip():
        back -= 1  # past the whitespace before the marker, then one visible character more
    return back - 1 if back - 1 > pos else cut


def _reopen(fence: str) -> str:
    """A plain ``` fence with the block's language, so every chunk's fences read the same way."""
    m = FENCE_LINE.match(fence)
    info = m.group(2).strip() if m else ""
    return "```" + (info if len(info) <= 20 else "") + "\n"


def _best_cut(window: str) -> int:
    floor = len(window) // 3  # a boundary too early wastes a message; fall through to a finer one
    i = window.rfind("\n\n")
    if i > floor:
        return i + 2
    i = window.rfind("\n")
    if i > floor:
        return i + 1
    last = None
    for m in _SENTENCE_END.finditer(window, floor):
        last = m.end()
    if last:
        return last
    i = window.rfind(" ")
    if i > floor:
        return i + 1
    cut = len(window)
    if cut > 1 and "\ud800" <= window[cut - 1] <= "\udbff":  # never split a surrogate pair
        cut -= 1
    return cut


def _fence_state(piece: str, fence: str | None, at_line_start: bool, at_line_end: bool) -> str | None:
    """The fence still open after `piece`, given the one open before it."""
    if "```" not in piece and "~~~" not in piece:
        return fence
    lines = piece.split("\n")
    for i, line in enumerate(lines):
        if i == 0 and not at_line_start:
            continue  # the tail of a line cut in the previous chunk: not a line of its own
        if i == len(lines) - 1 and not at_line_end and (line or len(lines) == 1):
            continue  # a line the next chunk finishes: judged there... by its start, which is here
        m = FENCE_LINE.match(line)
        if not m:
            continue
        if fence is None:
            fence = line.strip()
        elif m.group(1)[0] == fence.lstrip()[0] and not m.group(2).strip():
            fence = None
    return fence


def plan(e: truth.Ending, text: str) -> list[Planned]:
    """Posts for a settled generation: its text by kind, then at most one boundary line."""
    kind = truth.text_kind(e.status)
    if kind is not None and text.strip():
        out = [Planned(kind, c, PostReason.TEXT) for c in split_text(text, escape=True)]
        line = truth.receipt(e)
        return out + ([Planned(PostKind.RECEIPT, RECEIPT_PREFIX + line, PostReason.RECEIPT)] if line else [])
    line = truth.notice(e if text.strip() else replace(e, chars=0))
    return (
        [Planned(truth.no_text_line_kind(e.status), RECEIPT_PREFIX + line, truth.no_text_line_reason(e.status))]
        if line
        else []
    )


def plan_continuation(e: truth.Ending, added: str) -> list[Planned]:
    """Posts for one segment added on request: only the new text, then how the output now stands."""
    out: list[Planned] = []
    kind = truth.text_kind(e.status)
    if kind is not None and added:
        out += [Planned(kind, c, PostReason.TEXT) for c in split_text(added, escape=True)]
    line = truth.receipt(e)
    if line:
        out.append(Planned(PostKind.RECEIPT, RECEIPT_PREFIX + line, PostReason.RECEIPT))
    return out


def notice(line: str, reason: PostReason) -> Planned:
    """A notice that is not a generation's boundary line (a declined /continue, a retry, a refused key)."""
    return Planned(PostKind.NOTICE, RECEIPT_PREFIX + line, reason)


def plan_recovered(text: str, cause: str) -> list[Planned]:
    """A stump published at its resident's request: its text as `recovered` posts, then one receipt."""
    out = [Planned(PostKind.RECOVERED, c, PostReason.RECOVERED) for c in split_text(text, escape=True)]
    return out + [
        Planned(PostKind.RECEIPT, RECEIPT_PREFIX + truth.recovered_receipt(len(text), cause), PostReason.RECOVERED)
    ]
