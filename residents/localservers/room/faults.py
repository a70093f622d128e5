"""Fault injection: message POSTs answered with 500s, 429s, 400s, 403s and 404s, and the API refusing connections."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .jsonhttp import Handler, json_response
from .state import ApiError

log = logging.getLogger(__name__)


# What Discord answers when it will not take a post as it stands: (its JSON error code, message).
REFUSALS: dict[int, tuple[int, str]] = {
    400: (50035, "Invalid Form Body"),  # a post Discord finds malformed
    403: (50013, "Missing Permissions"),  # the bot lost Send Messages in the channel
    404: (10003, "Unknown Channel"),  # the channel was deleted
}


@dataclass
class MessageFault:
    """Fail the `nth` next bot message POST (1 = the very next), `times` times in a row.

    With `refuse_seconds`, the failure is not an HTTP status: that POST's connection is cut and the room
    refuses every connection for that long (`ConnectionOutage`), as when Discord cannot be reached.
    """

    status: int
    nth: int = 1
    times: int = 1
    retry_after: float = 0.05
    is_global: bool = False
    after_create: bool = False  # create the message, then fail: only the nonce prevents a duplicate
    refuse_seconds: float | None = None
    seen: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "nth": self.nth,
            "times": self.times,
            "retry_after": self.retry_after,
            "global": self.is_global,
            "after_create": self.after_create,
            "refuse_seconds": self.refuse_seconds,
            "seen": self.seen,
        }

    def response(self) -> web.Response:
        if self.status == 429:
            return rate_limited(self.retry_after, self.is_global)
        refusal = REFUSALS.get(self.status)
        if refusal is not None:
            return json_response({"message": refusal[1], "code": refusal[0]}, status=self.status)
        return json_response({"message": "500: Internal Server Error", "code": 0}, status=self.status)


class FaultPlan:
    def __init__(self) -> None:
        self.pending: list[MessageFault] = []
        self.hits = 0  # how many responses were faked
        self.refuse: Callable[[float], Awaitable[None]] | None = None  # the server's `refuse_connections`

    def add(
        self,
        status: int,
        *,
        nth: int = 1,
        times: int = 1,
        retry_after: float = 0.05,
        is_global: bool = False,
        after_create: bool = False,
        refuse_seconds: float | None = None,
    ) -> MessageFault:
        if refuse_seconds is not None:
            if not 0 < refuse_seconds <= 600:
                raise ApiError(400, 50035, "refuse_seconds must be between 0 and 600")
            times = 1
        elif status not in (*REFUSALS, 429, 500, 502, 503, 504):
            raise ApiError(400, 50035, "fault status must be 400, 403, 404, 429 or 5xx")
        if nth < 1 or times < 1:
            raise ApiError(400, 50035, "nth and times must be at least 1")
        if after_create and status == 429 and refuse_seconds is None:
            raise ApiError(400, 50035, "after_create only makes sense with a 5xx status")
        fault = MessageFault(
            status=status,
            nth=nth,
            times=times,
            retry_after=retry_after,
            is_global=is_global,
            after_create=after_create,
            refuse_seconds=refuse_seconds,
        )
        self.pending.append(fault)
        return fault

    async def respond(self, fault: MessageFault) -> web.Response:
        """The fault's answer; for an outage, none reaches the bot (its connection is cut with the rest)."""
        if fault.refuse_seconds is not None and self.refuse is not None:
            await self.refuse(fault.refuse_seconds)
            return web.Response(status=503)
        return fault.response()

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
        log.info(
            "fault injection: answering a message POST with %s%s",
            f"an outage of {fired.refuse_seconds}s" if fired.refuse_seconds is not None else fired.status,
            " after creating it" if fired.after_create else "",
        )
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


class ConnectionOutage:
    """Refuse TCP connections for a while, as when Discord's API cannot be reached at all.

    Not an HTTP status: the listening socket is closed (a new connection gets ECONNREFUSED) and every
    connection that served the REST API is cut (a kept-alive one, or a request in flight, sees a reset),
    then the room listens again on the same port. Gateway websockets stay up, as they do when only
    Discord's HTTP API is down, so discord.py does not reconnect; `/_room/` connections are left alone.
    """

    def __init__(self) -> None:
        self.rest: dict[int, asyncio.Transport] = {}  # id → transport that carried a REST request
        self.until: float | None = None  # monotonic time the room listens again
        self.outages = 0
        self.refused_requests = 0
        self._reopen: asyncio.Task[None] | None = None
        self._address: tuple[str, int] | None = None
        self._runner: web.AppRunner | None = None

    @property
    def refusing(self) -> bool:
        return self.until is not None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Remember which connections carry REST requests (the ones an outage cuts)."""
        transport = request.transport
        if transport is not None:
            if request.path.startswith("/api/"):
                if self.refusing:  # a connection that escaped the cut: cut it now, answer nothing
                    self.refused_requests += 1
                    transport.abort()
                    return web.Response(status=503)  # never reaches the peer
                if id(transport) not in self.rest:
                    for key in [k for k, t in self.rest.items() if t.is_closing()]:
                        del self.rest[key]  # forget connections that are gone
                    self.rest[id(transport)] = transport
            elif request.path.startswith("/gateway"):
                self.rest.pop(id(transport), None)  # a kept-alive connection upgraded to a websocket
        return await handler(request)

    async def refuse(self, runner: web.AppRunner, host: str, port: int, seconds: float) -> None:
        """Stop accepting connections for `seconds` (extending a running outage), then listen again."""
        if not 0 < seconds <= 600:
            raise ApiError(400, 50035, "refuse_connections must be between 0 and 600 seconds")
        loop = asyncio.get_running_loop()
        self.until = max(self.until or 0.0, loop.time() + seconds)
        if self._reopen is None:
            self._runner, self._address = runner, (host, port)
            self._reopen = asyncio.create_task(self._listen_again(), name="room-outage")
            self.outages += 1
            log.info("fault injection: refusing connections on port %d for %.1fs", port, seconds)
            for site in list(runner.sites):
                await site.stop()
        for transport in list(self.rest.values()):
            transport.abort()
        self.rest.clear()

    async def _listen_again(self) -> None:
        loop = asyncio.get_running_loop()
        while self.until is not None and loop.time() < self.until:
            await asyncio.sleep(self.until - loop.time())
        try:
            await self.end()
        except OSError as e:  # the port was taken meanwhile: say so, the room stays unreachable
            log.error(
                "fault injection: could not listen again on port %s: %s", self._address[1] if self._address else "?", e
            )

    async def end(self) -> None:
        """Listen again now (also what clearing the faults does)."""
        task, self._reopen = self._reopen, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        if self.until is None:
            return
        if self._runner is not None and self._address is not None:
            host, port = self._address
            await web.TCPSite(self._runner, host, port, reuse_address=True).start()
            log.info("fault injection: listening again on port %d", port)
        self.until = None  # only now: whoever sees the outage over can connect

    async def cancel(self) -> None:
        """The room is stopping: no listening again."""
        task, self._reopen, self.until = self._reopen, None, None
        if task is not None:
            task.cancel()

    def describe(self) -> dict[str, Any]:
        left = None
        if self.until is not None:
            left = max(0.0, self.until - asyncio.get_running_loop().time())
        return {
            "refusing": self.refusing,
            "seconds_left": left,
            "outages": self.outages,
            "refused_requests": self.refused_requests,
        }
