"""A provider key refused during a run: an ERROR for the operator, at most one notice per channel per window.

A wrong or revoked key (HTTP 401/403) fails every generation the same way, and no retry mends it.
Posting `Provider error (authentication_error) …` on every mention would fill the room with a line
meant for the operator, so `residents run` shares one `KeyRejections` among all its residents: each
such failure is logged as an ERROR naming the variable to fix, and each channel hears of it at most
once per `truth.KEY_NOTICE_SECONDS`. A failure inside the window posts nothing; the generation, its
attempts and any text stay in the ledger as always. A moderator's /continue whose segment is refused
so is handled the same way: its receipt would only restate the cut and blame a provider error.
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
    def __init__(
        self,
        key_env: str,
        window: float = truth.KEY_NOTICE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        key_env_of: dict[str, str] | None = None,
    ) -> None:
        self.key_env = key_env
        self.key_env_of = key_env_of or {}  # a residence with a key of its own (`api_key_env`): that variable
        self.window = window
        self.clock = clock  # injected so the window can be tested without waiting it out
        self.last_notice: dict[str, float] = {}  # channel → when its last key notice was planned

    def review(self, g: Generation, channel: str, planned: list[Planned], added: str | None = None) -> list[Planned]:
        """The posts to send for `g` after a turn, or (with `added`, the text it added) after a /continue.

        Unchanged unless its last provider call failed on a refused key; then the operator is told,
        and where that leaves no new text to post, the room gets the key notice (once per window)
        instead of a line about a provider error.
        """
        final = g.attempts[-1] if g.attempts else None
        if final is None or final.outcome != "failed" or not truth.key_rejected(final.error):
            return planned
        error = final.error
        assert error is not None
        what = f"generation {g.id} failed" if g.status == "failed" else f"a continuation segment of {g.id} failed"
        log.error(
            "%s: the provider rejected the API key (%s) in channel %s; %s. Remedy: set a "
            "valid key in %s and restart `residents run`.",
            g.residence,
            error,
            channel,
            what,
            self.key_env_of.get(g.residence, self.key_env),
        )
        if (g.text if added is None else added).strip():
            return planned  # text to post: it goes out with its boundary line, as any cut output's
        now = self.clock()
        last = self.last_notice.get(channel)
        if last is not None and now - last < self.window:
            return []  # the room was told within the window; the ledger keeps the generation as ever
        self.last_notice[channel] = now
        return [notice(truth.key_rejected_notice(error), PostReason.KEY_REJECTED)]
