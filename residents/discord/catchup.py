"""What a resident missed while it had no gateway session, and where its catch-up reads begin and end.

A RESUME replays every event missed, so nothing is lost across it; a new session (INVALID_SESSION, a
reconnect that could not resume, a restart) loses whatever was said in between. Per channel, the
messages missed are those after the last one the resident saw (`Sightings.at_drop`, or, after a
restart, the newest message a turn of it read, from the ledger) and before the first one the new session
delivered live (`Sightings.live_from`): those later are the live path's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import discord

from ..records import Generation

# Messages read per channel in each of the two reads of a catch-up (within the window; older than it).
CATCH_UP_READ = 1000
# How long a message id claimed for a turn is remembered in process (the ledger remembers it for good).
CLAIM_SECONDS = 24 * 3600
CLAIMS_PRUNED_ABOVE = 10_000


class Sightings:
    """Per channel: the newest message seen, as it was when the gateway last dropped, and the first one the
    current connection delivered live."""

    def __init__(self) -> None:
        self.newest: dict[int, int] = {}
        self.at_drop: dict[int, int] | None = None  # None: no drop yet in this process (the ledger decides)
        self.live_from: dict[int, int] = {}

    def saw(self, channel: int, message_id: int) -> None:
        """A message handed to on_message (live, or replayed by a RESUME)."""
        self.newest[channel] = max(self.newest.get(channel, 0), message_id)
        self.live_from.setdefault(channel, message_id)

    def examined(self, channel: int, message_id: int) -> None:
        """A message a catch-up read and judged: the next catch-up starts after it."""
        self.newest[channel] = max(self.newest.get(channel, 0), message_id)

    def dropped(self, channels: Iterable[int] | None = None) -> None:
        """The gateway connection closed (only that carrying `channels`, for one shard of a sharded bot):
        what comes next there is a RESUME (a replay) or a new session (a gap). The other shards' channels
        keep what their connections saw."""
        if channels is None:
            self.at_drop = dict(self.newest)
            self.live_from = {}
            return
        cut = set(channels)
        self.at_drop = {**(self.at_drop or {}), **{c: n for c, n in self.newest.items() if c in cut}}
        self.live_from = {c: m for c, m in self.live_from.items() if c not in cut}

    def last_seen(self, channel: int) -> int | None:
        """The newest message seen in `channel` before the gap, if this process saw one."""
        return None if self.at_drop is None else self.at_drop.get(channel)


class Claims:
    """Message ids whose turn this process has taken or queued, live or caught up, so it queues each once.
    Whether a message was answered is the ledger's claim (`Ledger.claim_reply`), across processes."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def __contains__(self, message_id: int) -> bool:
        return message_id in self.ids

    def claim(self, message_id: int) -> bool:
        """True if `message_id` was not claimed before (and now is)."""
        if message_id in self.ids:
            return False
        if len(self.ids) >= CLAIMS_PRUNED_ABOVE:
            horizon = discord.utils.time_snowflake(discord.utils.utcnow() - dt.timedelta(seconds=CLAIM_SECONDS))
            self.ids = {i for i in self.ids if i > horizon}
        self.ids.add(message_id)
        return True


def ledger_bound(latest: Generation | None) -> int | None:
    """The newest message a turn of the resident read in the channel, by its latest generation there.

    Its trigger and `seen_upto` (the newest message of its history), not the ids of its posts: posts a
    stopped process left undelivered go out at the next start before the bot connects, so a post's id says
    nothing about what the resident read.
    """
    if latest is None:
        return None
    ids = [int(i) for i in (latest.trigger, latest.seen_upto) if i and i.isdigit()]
    return max(ids, default=None)


def window_start(now: dt.datetime, seconds: float) -> int:
    """The newest snowflake a message older than the window can have."""
    return discord.utils.time_snowflake(now - dt.timedelta(seconds=seconds), high=True)


def age_words(seconds: float) -> str:
    """An age as a person reads it in a log line: 45s, 12m 5s, 3h 20m."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}m"


def oldest_first(messages: Iterable[discord.Message]) -> list[discord.Message]:
    return sorted({m.id: m for m in messages}.values(), key=lambda m: m.id)
