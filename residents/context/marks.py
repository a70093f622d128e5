"""Whose each line of a request is. The framework's notes, and only they, begin a line with `[`.

Every line of text that someone other than the framework wrote and that a resident reads in a user
turn begins with a mark saying whose it is: each line of a room message (a person's, or another
resident's) with its author's name, `alice: `; each line of a text file's contents, or of a resident's
own set-aside text shown by policy, with `| `. Lines are split at every break Python knows
(`str.splitlines`: `\\n`, `\\r`, `\\u2028`, `\\x0b`, ...), so no break a model might read as one starts
an unmarked line. Nothing a person writes or attaches — a note's exact text, a look-alike with a
zero-width character or full-width brackets, any line breaks — can then stand in a request as a line the
framework wrote: the rule is a form people's text cannot take, not a list of texts it may not hold.
"""

from __future__ import annotations

import unicodedata

NOTE_OPEN = "["  # the first character of every framework note (`residents.truth` words them all)
QUOTE_MARK = "| "  # before each line of a text file's contents, or of set-aside text shown by policy
NAME_CHARS = 100  # of a name as the request shows it


def one_line(name: str) -> str:
    """A name on one line of the request: control characters and line breaks as spaces, brackets as
    parentheses (a name can neither open a note's `[` nor close an `[attachment: …]` line), at most
    `NAME_CHARS` characters, never empty."""
    flat = "".join(" " if unicodedata.category(c)[0] in "CZ" and c != " " else c for c in name)
    flat = " ".join(flat.translate(str.maketrans("[]", "()")).split()) or "(no name)"
    return flat if len(flat) <= NAME_CHARS else flat[: NAME_CHARS - 1] + "…"


def marked(text: str, mark: str) -> str:
    """`text` with `mark` before each of its lines (an empty text is one empty line). Each line keeps
    its own break, so the text is exactly what remains once the marks are taken off; an empty line
    gets the mark without its trailing space."""
    out = []
    for line in text.splitlines(keepends=True) or [""]:
        body = line.rstrip("\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029")
        out.append((mark if body else mark.rstrip(" ")) + line)
    return "".join(out)


def said(author: str, text: str) -> str:
    """A room message as a resident reads it: every line under its author's name."""
    return marked(text, f"{one_line(author)}: ")


def quoted(text: str) -> str:
    """A text file's contents, or set-aside text, under the framework's line above it: every line marked."""
    return marked(text, QUOTE_MARK)
