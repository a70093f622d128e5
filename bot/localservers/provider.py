"""An Anthropic-compatible `POST /v1/messages` on loopback that answers from recorded calls.

The real SDK talks to it over a real socket, so replay, tests, benchmarks and the demo exercise
the same client code as production. Each call is served from a queue (recorded specimens, HTTP
errors, cut connections, stalls) or, when the queue is empty, from an optional responder.
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

log = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               500: "api_error", 502: "api_error", 503: "api_error", 504: "timeout_error", 529: "overloaded_error"}


def error_body(status: int, message: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message or kind.replace("_", " ").capitalize()}}


@dataclass
class Call:
    """One recorded provider answer."""
    sse: bytes | None = None
    end: Literal["clean", "drop", "stall"] = "clean"
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    stall_seconds: float = 30.0  # with end="stall": how long to hold the connection open, silent
    chunk_bytes: int = 0  # 0: write the body at once; else in pieces of this size
    chunk_delay: float = 0.0  # with chunk_bytes: seconds between pieces, so a stream takes a known time


Responder = Callable[[dict[str, Any]], Call | None]


class ProviderServer:
    def __init__(self, responder: Responder | None = None) -> None:
        self.queue: deque[Call] = deque()
        self.requests: list[dict[str, Any]] = []
        self.responder = responder
        self._runner: web.AppRunner | None = None
        self.url = ""

    def enqueue(self, calls: list[Call]) -> None:
        self.queue.extend(calls)

    def reset(self, calls: list[Call]) -> None:
        self.queue.clear()
        self.queue.extend(calls)
        self.requests.clear()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _json(400, error_body(400, "request body is not JSON"))
        self.requests.append(body)
        call = self.queue.popleft() if self.queue else (self.responder(body) if self.responder else None)
        if call is None:
            return _json(500, error_body(500, "no call was recorded for this request"))
        rid = f"req_local_{uuid.uuid4().hex[:16]}"
        if call.status is not None and call.status != 200:
            payload = call.body if call.body is not None else error_body(call.status)
            return _json(call.status, payload, {"request-id": rid, **call.headers})
        resp = web.StreamResponse(status=200, headers={"content-type": "text/event-stream", "request-id": rid,
                                                       "cache-control": "no-cache", **call.headers})
        await resp.prepare(request)
        data = call.sse or b""
        if call.chunk_bytes > 0:
            for i in range(0, len(data), call.chunk_bytes):
                if i and call.chunk_delay > 0:
                    await asyncio.sleep(call.chunk_delay)
                await resp.write(data[i:i + call.chunk_bytes])
        elif data:
            await resp.write(data)
        if call.end == "stall":
            await asyncio.sleep(call.stall_seconds)
        if call.end in ("drop", "stall"):
            if request.transport is not None:
                request.transport.close()  # cut with no clean end of the chunked body
            raise asyncio.CancelledError()
        await resp.write_eof()
        return resp


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(payload).encode(),
                        headers={"content-type": "application/json", **(headers or {})})
