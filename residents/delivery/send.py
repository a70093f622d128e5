"""Sending planned posts to a room, in order, each recorded against its message id.

A post already delivered is skipped, so delivery can be resumed after a crash without posting
anything twice; the room adapter is the only part that knows Discord, the local room or replay.
"""

from __future__ import annotations

from typing import Protocol

from ..ledger import Ledger
from ..records import Post


class Room(Protocol):
    async def send(self, post: Post) -> str:
        """Deliver one post; returns the room's message id."""
        ...


async def deliver(ledger: Ledger, room: Room, posts: list[Post]) -> None:
    for post in posts:
        if post.message_id is not None:
            continue
        message_id = await room.send(post)
        await ledger.mark_delivered(post, message_id)
