"""Fault injection for message POSTs, so tests can see how a bot copes with 500s and 429s."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .jsonhttp import json_response
from .state import ApiError

log = logging.getLogger(__name__)


@dataclass
class MessageFault:
    """Fail the `nth` next bot message POST (1 = the very next), `times` times in a row."""

    status: int
    nth: int = 1
    times: int = 1
    retry_after: float = 0.05
    is_global: bool = False
    after_create: bool = False  # create the message, then fail: only the nonce prevents a duplicate
    seen: int = 0

    def describe(self) -> dict[str, Any]:
        return {"status": self.status, "nth": self.nth, "times": self.times, "retry_after": self.retry_after,
                "global": self.is_global, "after_create": self.after_create, "seen": self.seen}

    def response(self) -> web.Response:
        if self.status == 429:
            return rate_limited(self.retry_after, self.is_global)
        if self.status == 403:  # what Discord answers when a bot lost Send Messages in a channel
            return json_response({"message": "Missing Permissions", "code": 50013}, status=403)
        return json_response({"message": "500: Internal Server Error", "code": 0}, status=self.status)


class FaultPlan:
    def __init__(self) -> None:
        self.pending: list[MessageFault] = []
        self.hits = 0  # how many responses were faked

    def add(self, status: int, *, nth: int = 1, times: int = 1, retry_after: float = 0.05,
            is_global: bool = False, after_create: bool = False) -> MessageFault:
        if status not in (403, 429, 500, 502, 503, 504):
            raise ApiError(400, 50035, "fault status must be 403, 429 or 5xx")
        if nth < 1 or times < 1:
            raise ApiError(400, 50035, "nth and times must be at least 1")
        if after_create and status == 429:
            raise ApiError(400, 50035, "after_create only makes sense with a 5xx status")
        fault = MessageFault(status=status, nth=nth, times=times, retry_after=retry_after, is_global=is_global,
                             after_create=after_create)
        self.pending.append(fault)
        return fault

    def clear(self) -> None:
        self.pending.clear()

    def check(self) -> MessageFault | None:
        """Called once per bot message POST: the fault to apply now, if any."""
        fired: MessageFault | None = None
        for fault in self.pending:
            if fault.seen < fault.nth - 1:
                fault.seen += 1
                continue
            fired = fault
            break
        if fired is None:
            return None
        fired.times -= 1
        if fired.times <= 0:
            self.pending.remove(fired)
        self.hits += 1
        log.info("fault injection: answering a message POST with %s%s", fired.status,
                 " after creating it" if fired.after_create else "")
        return fired


def rate_limited(retry_after: float, is_global: bool = False) -> web.Response:
    """Discord's 429: body plus the headers discord.py reads (it ignores 429s without `Via`)."""
    headers = {
        "Retry-After": str(max(1, math.ceil(retry_after))),
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": f"{time.time() + retry_after:.3f}",
        "X-RateLimit-Reset-After": f"{retry_after:.3f}",
        "X-RateLimit-Bucket": "localroom-messages",
        "X-RateLimit-Scope": "shared" if not is_global else "global",
        "Via": "1.1 google",
    }
    if is_global:
        headers["X-RateLimit-Global"] = "true"
    body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": is_global, "code": 0}
    return json_response(body, status=429, headers=headers)
