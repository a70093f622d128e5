"""What the pipeline tells whoever watches it, without knowing who watches.

Two things, both pure: the ids of the work in hand (residence, channel, generation, attempt), kept in
context variables where a turn runs so every log line of that turn can carry them (`JsonLines`); and
the `Observer` each layer tells a fact at the one place it settles (an attempt's stream ended, a
generation settled, a turn ended, a post left the outbox, a ledger commit returned). The metrics
(`residents.metrics`) implement `Observer`; nothing below them imports them, and a part nobody
watches tells `UNOBSERVED`, which does nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Protocol

from .records import Attempt, Generation, Post, Stump

# The ids of the work in hand, read by `JsonLines` for every line logged while it runs.
IDS: dict[str, ContextVar[str | None]] = {
    name: ContextVar(f"residents_{name}", default=None) for name in ("residence", "channel", "generation", "attempt")
}


def set_ids(**ids: str | None) -> None:
    """Name the work from here on in this task (a generation, an attempt); `working_on` scopes it."""
    for name, value in ids.items():
        IDS[name].set(value)


@contextlib.contextmanager
def working_on(**ids: str | None) -> Iterator[None]:
    """The ids for a block (a turn: residence and channel); on leaving it every id is as it was, including
    a generation or attempt id `set_ids` named inside it."""
    tokens = [(var, var.set(ids[name]) if name in ids else var.set(var.get())) for name, var in IDS.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the ids of the work in hand.

    An id passed with `extra=` wins over the context's. ASCII-only JSON, so a lone surrogate in a
    message is an escape, never an encoding error on stderr."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, var in IDS.items():
            value = getattr(record, name, None) or var.get()
            if value:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class Observer(Protocol):
    """Facts as they settle, each told from one place. Called on the event loop; must not raise or block."""

    def attempt_ended(self, g: Generation, a: Attempt, seconds: float, first_content: float | None) -> None:
        """An attempt's stream ended (`a` has its outcome, error kind and tokens): `seconds` from the call to
        the end, `first_content` from the call to its first content block (None: none came)."""

    def generation_settled(self, g: Generation, *, new: bool, stumps: Sequence[Stump], continuations: int) -> None:
        """`g` is settled in the ledger: `new` for a reply's first settlement (else a /continue), with the
        stumps and continuation segments this settlement added."""

    def turn_ended(self, residence: str, channel: str, seconds: float) -> None:
        """One turn, from taking it up to its posts in the room (or set aside, or the outbox closed)."""

    def post_delivered(self, residence: str, post: Post) -> None:
        """A post left the outbox: in the room (`post.message_id`) or set aside (`post.refused`)."""

    def committed(self, seconds: float, refused: bool) -> None:
        """One ledger commit took `seconds` in the connection's thread; `refused`: the disk refused a write in it."""


class Unobserved:
    """Nobody watches: every fact is dropped."""

    def attempt_ended(self, g: Generation, a: Attempt, seconds: float, first_content: float | None) -> None:
        pass

    def generation_settled(self, g: Generation, *, new: bool, stumps: Sequence[Stump], continuations: int) -> None:
        pass

    def turn_ended(self, residence: str, channel: str, seconds: float) -> None:
        pass

    def post_delivered(self, residence: str, post: Post) -> None:
        pass

    def committed(self, seconds: float, refused: bool) -> None:
        pass


UNOBSERVED: Observer = Unobserved()
