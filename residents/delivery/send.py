"""What a room given to a resident's turn is: the place its posts are meant for.

Sending itself is the outbox's (`residents.delivery.outbox`), through the room each resident registered
there: a post already delivered is never sent again, and one whose send failed is looked for in the room
before it is sent again. The room adapter is the only part that knows Discord, the local room or replay.
"""

from __future__ import annotations

from typing import Protocol

from ..records import Post


class Room(Protocol):
    async def send(self, post: Post) -> str:
        """Deliver one post; returns the room's message id."""
        ...
