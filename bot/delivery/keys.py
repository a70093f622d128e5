"""A provider key refused during a run: an ERROR for the operator, at most one notice per channel per window.

A wrong or revoked key (HTTP 401/403) fails every generation the same way, and no retry mends it.
Posting `Provider error (authentication_error) …` on every mention would fill the room with a line
meant for the operator, so `residents run` shares one `KeyRejections` among all its residents: each
such failure is logged as an ERROR naming the variable to fix, and each channel hears of it at most
once per `truth.KEY_NOTICE_SECONDS`. A failure inside the window posts nothing; the generation, its
attempts and any text stay in the ledger as always.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .. import truth
from ..records import Generation, Planned, PostReason
from .plan import notice

log = logging.getLogger(__name__)


class KeyRejections:
    def __init__(self, key_env: str, window: float = truth.KEY_NOTICE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.key_env = key_env
        self.window = window
        self.clock = clock  # injected so the window can be tested without waiting it out
        self.last_notice: dict[str, float] = {}  # channel → when its last key notice was planned

    def review(self, g: Generation, channel: str, planned: list[Planned]) -> list[Planned]:
        """The posts to send for `g`: unchanged unless it failed on a refused key with no text to post."""
        error = g.ending().error
        if g.status != "failed" or not truth.key_rejected(error) or g.text.strip():
            return planned
        assert error is not None
        log.error("%s: the provider rejected the API key (%s) in channel %s; generation %s failed. Remedy: set a "
                  "valid key in %s and restart `residents run`.", g.residence, error, channel, g.id, self.key_env)
        now = self.clock()
        last = self.last_notice.get(channel)
        if last is not None and now - last < self.window:
            return []  # the room was told within the window; the ledger keeps the generation as ever
        self.last_notice[channel] = now
        return [notice(truth.key_rejected_notice(error), PostReason.KEY_REJECTED)]
