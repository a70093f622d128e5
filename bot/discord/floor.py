"""The floor of a channel as every resident in this process sees it (`residents run` runs them all in one).

Deciding to speak (read the history, count the turns, claim one) is one step per channel across
residents, and a claimed turn counts until its posts are in the room: two residents that read the
same history can never both take the last turn. This lives outside the cogs because discord.py
loads an extension afresh for each bot, so a cog module's globals are not shared between bots.
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections import defaultdict

log = logging.getLogger(__name__)


class Floor:
    def __init__(self) -> None:
        self.deciding: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.generating: dict[int, set[int]] = defaultdict(set)  # channel id → bot user ids with a turn claimed


_FLOORS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Floor]" = weakref.WeakKeyDictionary()


def shared_floor() -> Floor:
    """The floor shared by every bot on the running event loop."""
    loop = asyncio.get_running_loop()
    floor = _FLOORS.get(loop)
    if floor is None:
        floor = _FLOORS[loop] = Floor()
    return floor
