"""The floor of a channel as every resident in this process sees it (`residents run` runs them all in one).

Deciding to speak (read the history, count the replies, claim one) is one step per channel across
residents, and a claimed reply counts until its posts are in the room: a claim while it is being
generated, then as pending in the outbox, then in the room's history. Two residents that read the
same history can never both take the last reply. This lives outside the cogs because discord.py
loads an extension afresh for each bot, so a cog module's globals are not shared between bots.

What counts is replies, not messages or runs of one author: all posts of one generation (partials,
receipt, a later /continue's segment) are one reply, known from the ledger by message id; a bot
message the ledger does not know (another process's bot) counts one reply per run of its author.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Protocol


class Floor:
    def __init__(self) -> None:
        self.deciding: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.generating: dict[int, set[int]] = defaultdict(set)  # channel id → bot user ids with a turn claimed


_FLOORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Floor] = weakref.WeakKeyDictionary()


def shared_floor() -> Floor:
    """The floor shared by every bot on the running event loop."""
    loop = asyncio.get_running_loop()
    floor = _FLOORS.get(loop)
    if floor is None:
        floor = _FLOORS[loop] = Floor()
    return floor


class _Author(Protocol):  # read-only: a discord.py Member's `bot` is a property
    @property
    def id(self) -> int: ...
    @property
    def bot(self) -> bool: ...


class _Message(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def author(self) -> _Author: ...


def since_person(history: Sequence[_Message]) -> list[_Message]:
    """The messages after the last one a person wrote (history oldest first)."""
    i = len(history)
    while i > 0 and history[i - 1].author.bot:
        i -= 1
    return list(history[i:])


def replies(run: Sequence[_Message], reply_of: Mapping[str, str]) -> set[str]:
    """The replies among bot messages `run` (oldest first): `reply_of` maps a message id to its reply key."""
    keys: set[str] = set()
    previous: tuple[int, str] | None = None  # author and key of the previous message the ledger does not know
    for m in run:
        key = reply_of.get(str(m.id))
        if key is None:
            key = previous[1] if previous is not None and previous[0] == m.author.id else f"message:{m.id}"
            previous = (m.author.id, key)
        else:
            previous = None
        keys.add(key)
    return keys
