"""Which room messages a request shows, chosen so that its older part stays the same from turn to turn.

A provider's prompt cache reads a request's prefix only if it is byte for byte one it has seen. A
window sliding by one message a turn changes the first message shown, and so every byte after it,
each turn. Here the window's first message stays put while the room grows: it moves only when it
would fall out of the `history_limit` messages the room was read for, and then by `step` messages at
once. So a request shows between `history_limit - step` and `history_limit` messages, never more,
and its start moves once every `step` messages instead of once a message.

The shown messages are then split at a point that also moves in steps of `step` messages, counted
from the window's start: what lies before it is the frozen part the request marks for caching
(docs/providers.md, "Prompt caching"), what follows is the recent tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar


class _Message(Protocol):
    @property
    def id(self) -> str: ...


M = TypeVar("M", bound=_Message)  # a room message (`residents.context.compile.RoomMessage`)

STEP_SHARE = 4  # the window's start, and the frozen part's end, move by a quarter of history_limit


def step(limit: int) -> int:
    """How many messages the window's start, or the frozen part's end, moves at a time."""
    return max(1, limit // STEP_SHARE)


def frozen_count(shown: int, limit: int) -> int:
    """How many of `shown` messages (from the window's start) lie in the frozen part: a whole number of
    steps, leaving at least one message to the tail."""
    s = step(limit)
    return max(0, (shown - 1) // s * s)


@dataclass
class Window:
    """Where one channel's requests start showing the room: kept between a resident's turns there.

    `start`: the id of the first message shown, None until a request has been compiled. Kept in
    memory only: after a restart the first request starts afresh (one request's prefix is not read
    from the cache)."""

    start: str | None = None

    def shown(self, history: list[M], limit: int) -> list[M]:
        """The messages of `history` (oldest first) a request shows: from the kept start while it is
        among the last `limit`, else from a new start `step` messages in (from the first message, for
        a room that has fewer than `limit`)."""
        recent = history[-limit:]
        ids = [m.id for m in recent]
        if self.start in ids:
            return recent[ids.index(self.start) :]
        at = 0 if len(history) < limit else min(step(limit), len(recent) - 1)
        self.start = recent[at].id if recent else None
        return recent[at:]
