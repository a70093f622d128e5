"""Exact overlap removal and the progress/repetition guards for one new segment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rapidfuzz.distance import Indel

# The similarity check compares fixed-size windows, so its cost stays flat whatever the output's size.
SIMILARITY_WINDOW = 2048


def find_overlap(prior: str, new: str, min_overlap: int = 1) -> int:
    """Length of the longest prefix of `new` that equals a suffix of `prior` (0 when under min_overlap).

    Knuth–Morris–Pratt's failure function over `new`, then one pass over the last len(new)
    characters of `prior`: time linear in len(new), the window searched.
    """
    if not new or not prior:
        return 0
    m = len(new)
    fail = [0] * m
    k = 0
    for i in range(1, m):
        c = new[i]
        while k and new[k] != c:
            k = fail[k - 1]
        if new[k] == c:
            k += 1
        fail[i] = k
    k = 0
    for c in prior[-m:] if len(prior) > m else prior:
        while k and (k == m or new[k] != c):
            k = fail[k - 1]
        if new[k] == c:
            k += 1
    return k if k >= min_overlap else 0


def similarity(prior: str, new: str, window: int = SIMILARITY_WINDOW) -> float:
    """How much `new` repeats what came before, 0..1.

    The head of the new text is compared with the head and the tail of the prior text (an echo
    of the whole partial starts like its head; a stutter repeats its tail); a head found verbatim
    anywhere in the prior text counts as 1.0.
    """
    head = new[:window]
    if not head or not prior:
        return 0.0
    if len(head) >= 32 and head in prior:
        return 1.0
    best = 0.0
    for ref in (prior[: len(head)], prior[-len(head) :]):
        best = max(best, Indel.normalized_similarity(head, ref))
    return best


@dataclass(frozen=True)
class Decision:
    overlap: int
    added: str  # what the segment adds once the overlap is removed
    verdict: Literal["append", "no-progress", "repetition"]


def judge_segment(
    prior: str, new: str, *, min_overlap: int, min_progress: int, similarity_abort: float, stripped_tail: str = ""
) -> Decision:
    """Decide what one continuation segment contributes.

    `stripped_tail` is trailing whitespace taken off the prefill (the API rejects it); a segment
    that opens by re-emitting exactly that whitespace overlaps by it.
    """
    overlap = find_overlap(prior, new, min_overlap)
    if stripped_tail and overlap < len(stripped_tail) and new.startswith(stripped_tail):
        overlap = len(stripped_tail)
    added = new[overlap:]
    if len(added) < min_progress:
        return Decision(overlap, added, "no-progress")
    if similarity(prior, added) >= similarity_abort:
        return Decision(overlap, added, "repetition")
    return Decision(overlap, added, "append")
