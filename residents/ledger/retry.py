"""A turn's writes the ledger refused (a full disk, an I/O error), tried again until they are on disk.

A turn records everything before anything of it is posted. When the disk refuses a write, the turn
keeps what it has in memory (the provider's text goes on streaming into it) and waits: the refused
write is tried again with backoff (0.5, 1, 2, 4, 8 s, then every `cap` s) for as long as the process
runs, so once space is back the turn goes on within `cap` seconds, records its true outcome and is
answered. Nothing is posted meanwhile (nothing is recorded to post), and no generation is left
`pending` by a write that failed: it is settled as soon as the disk takes the write. After `alarm`
seconds of refusals one ERROR says an operator is needed. The outbox treats the room the same way.

A process stopped while the disk still refuses loses what the turn held in memory: the log says so
(the real cause), and the next start settles what reached disk as any stopped turn is settled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from .store import LedgerWriteError

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True)
class WriteBackoff:
    """Delays between tries of a refused write: doubling from `base`, at most `cap`; ERROR after `alarm` s."""

    base: float = 0.5
    cap: float = 10.0
    alarm: float = 600.0

    def delay(self, failures: int) -> float:
        return min(self.cap, self.base * 2 ** max(0, failures - 1))


WRITES = WriteBackoff()


async def until_written(what: str, write: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`write(*args, **kwargs)` until the ledger takes it; `what` names it in the log (`generation g-… settled`).

    Only a `LedgerWriteError` is tried again (nothing of the change is on disk, so asking again is
    safe); any other error is the caller's, as before.
    """
    failures, since, alarmed = 0, time.monotonic(), False
    while True:
        try:
            result = await write(*args, **kwargs)
        except LedgerWriteError as e:
            failures += 1
            waited = time.monotonic() - since
            if failures == 1:
                log.warning("%s: not recorded yet (%s); the turn waits and tries again with backoff", what, e)
            if not alarmed and waited >= WRITES.alarm:
                alarmed = True
                log.error(
                    "%s: the ledger has refused writes for %.0fs (%s); the turn still waits, tried every %.0fs",
                    what,
                    waited,
                    e,
                    WRITES.cap,
                )
            try:
                await asyncio.sleep(WRITES.delay(failures))
            except asyncio.CancelledError:
                # The process stops while the disk still refuses: what the turn held in memory is lost, and the
                # next start settles what reached disk as interrupted. The operator's log keeps the real cause.
                log.warning("%s: not recorded: the process stopped while the ledger refused writes (%s)", what, e)
                raise
            continue
        if failures:
            log.warning(
                "%s: recorded after %d refused tr%s over %.1fs; the turn goes on",
                what,
                failures,
                "y" if failures == 1 else "ies",
                time.monotonic() - since,
            )
        return result
