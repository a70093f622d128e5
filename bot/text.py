"""Text as it leaves the process: always valid UTF-8, with a count of what had to be replaced.

The ledger keeps every emitted text exactly, lone surrogates included (a provider's JSON can carry
`\\ud83d` on its own, or the two halves of a pair in separate deltas). Nothing outside the process
can take such text as it is: a request body, a Discord post or a JSON document must be UTF-8. So
the copy that leaves is made here, in one pure place, and the caller records how many replacements
it made.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


def outbound(s: str) -> tuple[str, int]:
    """`s` as valid UTF-8 text, and how many lone surrogates were replaced by U+FFFD.

    A high surrogate directly followed by a low one is the pair it spells (the character the two
    halves of a split pair stand for), not two replacements. Text without surrogates is returned
    as it is, at the cost of one encode.
    """
    try:
        s.encode("utf-8")
        return s, 0
    except UnicodeEncodeError:
        pass
    fixed = s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return fixed, fixed.count(REPLACEMENT) - s.count(REPLACEMENT)
