"""An Anthropic-compatible `POST /v1/messages` and an OpenAI-compatible `POST /v1/chat/completions`
on loopback, both answering from recorded calls (one queue: a scenario's calls, in order).

The real SDK talks to it over a real socket, so replay, tests, benchmarks and the demo exercise
the same client code as production. Each call is served from a queue (recorded specimens, HTTP
errors, cut connections, stalls) or, when the queue is empty, from an optional responder.
On `/v1/messages` it keeps a prompt cache by Anthropic's rules (`promptcache`) and reports each
stream's input tokens, cache writes and cache reads in its `message_start` (and `message_delta`),
whatever figures the recorded stream carried; `usage` keeps what each stream reported, in order.
Like the real API it can demand a key (`api_keys`: any other key is answered 401 or 403) and lists
models at `GET /v1/models`; with `models=False` that endpoint is missing (404), as on servers
that only speak `POST /v1/messages`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from . import sse
from .promptcache import Accounting, PromptCache, TooManyBreakpoints

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message or kind.replace("_", " ").capitalize()}}


# OpenAI's error types by status, for the chat-completions route's default error bodies.
CHAT_ERROR_TYPES = {401: "invalid_request_error", 429: "rate_limit_exceeded"}


def chat_error_body(status: int, message: str | None = None) -> dict[str, Any]:
    """An error body as OpenAI's API shapes it: `{"error": {"message", "type", "param", "code"}}`."""
    kind = CHAT_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message or f"HTTP {status}", "type": kind, "param": None, "code": None}}


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
    delay_seconds: float = 0.0  # silence after the headers, before the body: streams sent at one moment
    held_until: asyncio.Event | None = None  # silence after the headers until it is set: a test's own moment
    # True: the stream's usage goes out as recorded, not replaced by the prompt cache's accounting (a test
    # of how a provider's own figures, or their absence, are read).
    usage_as_recorded: bool = False


Responder = Callable[[dict[str, Any]], Call | None]


class ProviderServer:
    def __init__(
        self,
        responder: Responder | None = None,
        *,
        api_keys: set[str] | None = None,
        models: bool = True,
        reject_status: int = 401,
    ) -> None:
        self.queue: deque[Call] = deque()
        self.requests: list[dict[str, Any]] = []
        self.cache = PromptCache()
        # What each answered stream reported as its usage (`sse.usage_of`, after the cache's figures are
        # spliced in), in order: what the ledger's token counts must add up to.
        self.usage: list[dict[str, int]] = []
        self.responder = responder
        self.api_keys = api_keys  # None: any key will do; may change while running (a revoked key)
        self.models = models
        self.reject_status = reject_status  # 401 (a wrong key) or 403 (a key without permission)
        self.rejected = 0  # requests answered reject_status for their key
        self.model_requests = 0  # `GET /v1/models` received, answered or not
        self._runner: web.AppRunner | None = None
        self.url = ""

    def enqueue(self, calls: list[Call]) -> None:
        self.queue.extend(calls)

    def reset(self, calls: list[Call]) -> None:
        self.queue.clear()
        self.queue.extend(calls)
        self.requests.clear()
        self.usage.clear()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
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
        return await self._answer(request, error_body, "request-id", cached=True)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/chat/completions`: the same recorded calls, errors shaped as OpenAI's."""
        return await self._answer(request, chat_error_body, "x-request-id")

    async def _answer(
        self,
        request: web.Request,
        errors: Callable[[int, str | None], dict[str, Any]],
        id_header: str,
        cached: bool = False,
    ) -> web.StreamResponse:
        """`cached`: the route keeps a prompt cache (Anthropic's Messages) and reports its usage."""
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _json(400, errors(400, "request body is not JSON"))
        self.requests.append(body)
        if not self._key_accepted(request):
            return self._reject(errors)
        plan: Accounting | None = None
        if cached and isinstance(body, dict):
            try:
                plan = self.cache.plan(body)
            except TooManyBreakpoints as e:
                return _json(400, errors(400, str(e)))
        call = self.queue.popleft() if self.queue else (self.responder(body) if self.responder else None)
        if call is None:
            return _json(500, errors(500, "no call was recorded for this request"))
        rid = f"req_local_{uuid.uuid4().hex[:16]}"
        if call.status is not None and call.status != 200:
            payload = call.body if call.body is not None else errors(call.status, None)
            return _json(call.status, payload, {id_header: rid, **call.headers})
        resp = web.StreamResponse(
            status=200,
            headers={
                "content-type": "text/event-stream",
                id_header: rid,
                "cache-control": "no-cache",
                **call.headers,
            },
        )
        data = call.sse or b""
        if plan is not None and not call.usage_as_recorded:
            self.cache.commit(plan)
            data = sse.with_usage(data, plan.usage)
        await resp.prepare(request)
        if call.delay_seconds > 0:
            await asyncio.sleep(call.delay_seconds)
        if call.held_until is not None:
            await call.held_until.wait()
        if data:
            self.usage.append(sse.usage_of(data))
        if call.chunk_bytes > 0:
            for i in range(0, len(data), call.chunk_bytes):
                if i and call.chunk_delay > 0:
                    await asyncio.sleep(call.chunk_delay)
                await resp.write(data[i : i + call.chunk_bytes])
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

    def _key_accepted(self, request: web.Request) -> bool:
        """The key as the SDK sends it (`x-api-key`, or `Authorization: Bearer`), against `api_keys`."""
        if self.api_keys is None:
            return True
        key = request.headers.get("x-api-key")
        if key is None:
            auth = request.headers.get("authorization", "")
            key = auth[7:] if auth.lower().startswith("bearer ") else None
        return key is not None and key in self.api_keys

    def _reject(self, errors: Callable[[int, str | None], dict[str, Any]] = error_body) -> web.Response:
        self.rejected += 1
        message = "invalid x-api-key" if self.reject_status == 401 else "this key has no permission for this request"
        return _json(
            self.reject_status,
            errors(self.reject_status, message),
            {"request-id": f"req_local_{uuid.uuid4().hex[:16]}"},
        )

    async def _models(self, request: web.Request) -> web.Response:
        """`GET /v1/models`: one page of the models list, as the real API pages it; 404 with models=False."""
        self.model_requests += 1
        if not self.models:
            return _json(404, error_body(404, "Not found"))
        if not self._key_accepted(request):
            return self._reject()
        data = [
            {
                "type": "model",
                "id": "claude-sonnet-4-5",
                "display_name": "Claude Sonnet 4.5",
                "created_at": "2025-09-29T00:00:00Z",
            }
        ]
        try:
            limit = max(1, min(1000, int(request.query.get("limit", "20"))))
        except ValueError:
            return _json(400, error_body(400, "limit: not an integer"))
        data = data[:limit]
        return _json(200, {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]})


def _json(status: int, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(payload).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
