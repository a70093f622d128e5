"""The /_room/ JSON API: how people (and tests) post, invoke commands and watch the room.

Not part of Discord. Everything here goes through the same RoomState calls the Discord
REST routes use, so a person's message is dispatched to bots exactly like a real one.
The web page of the room (`/`, files in static/) is a client of this API and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from .faults import ConnectionOutage, FaultPlan
from .jsonhttp import Upload, json_response, read_body, require_dict
from .model import ApiError
from .state import RoomState

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
STATIC = Path(__file__).resolve().parent / "static"
MAX_ANNOTATION_IDS = 500


# A channel in a path: its id, its name, or `guild/channel` (the slash may be written as is or as %2F).
CHANNEL = "{channel:[^/]+(?:/[^/]+)?}"


class Room(Protocol):
    """What the API drives: the RoomServer (named structurally, so the server imports this module, not back)."""

    state: RoomState
    faults: FaultPlan
    outage: ConnectionOutage

    def snapshot(self) -> dict[str, Any]: ...
    def messages(self, channel: str = ..., member: str | None = ...) -> list[dict[str, Any]]: ...
    def post(
        self,
        channel: str,
        author: str,
        content: str,
        *,
        reply_to: int | str | None = ...,
        mentions: Iterable[str] = ...,
        moderator: bool | None = ...,
        allowed_mentions: dict[str, Any] | None = ...,
        attachments: Sequence[Upload] = ...,
    ) -> dict[str, Any]: ...
    async def invoke_command(
        self,
        channel: str,
        member: str,
        name: str,
        *,
        bot: str | None = ...,
        options: list[dict[str, Any]] | None = ...,
        moderator: bool | None = ...,
        timeout: float = ...,
        settle: float = ...,
        target: str | None = ...,
    ) -> dict[str, Any]: ...
    async def press_button(
        self,
        channel: str,
        member: str,
        message_id: str,
        custom_id: str,
        *,
        timeout: float = ...,
        settle: float = ...,
    ) -> dict[str, Any]: ...
    async def annotations(self, message_ids: Sequence[str]) -> dict[str, dict[str, Any]]: ...
    def faults_view(self) -> dict[str, Any]: ...
    def fail_message_posts(
        self,
        status: int = ...,
        *,
        nth: int = ...,
        times: int = ...,
        retry_after: float = ...,
        is_global: bool = ...,
        after_create: bool = ...,
        refuse_seconds: float | None = ...,
    ) -> None: ...
    async def drop_gateway(self, *, hold: bool = ..., shard: int | None = ...) -> int: ...
    async def invalidate_sessions(self, *, hold: bool = ..., shard: int | None = ...) -> int: ...
    async def refuse_connections(self, seconds: float) -> None: ...
    def release_gateway(self) -> None: ...
    def subscribe_events(self) -> asyncio.Queue[dict[str, Any] | None]: ...
    def show_status(self) -> dict[str, Any] | None: ...
    async def play_show_again(self) -> dict[str, Any]: ...
    def unsubscribe_events(self, queue: asyncio.Queue[dict[str, Any] | None]) -> None: ...


def json_uploads(entries: Any) -> list[Upload]:
    """Files given in a JSON body: `attachments`, each {filename, data (base64), content_type (optional)}."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ApiError(400, 50035, '"attachments" must be a list of {filename, data (base64)}')
    out: list[Upload] = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("filename"), str) or not isinstance(e.get("data"), str):
            raise ApiError(400, 50035, f"attachments[{i}] needs a filename and data (base64), both strings")
        try:
            data = base64.b64decode(e["data"], validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, 50035, f"attachments[{i}].data is not valid base64") from None
        ctype = e.get("content_type")
        out.append((e["filename"], data, ctype if isinstance(ctype, str) else None))
    return out


class RoomApi:
    def __init__(self, server: Room) -> None:
        self.server = server

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/_room/state", self.get_state)
        r.add_get(f"/_room/channels/{CHANNEL}/messages", self.list_messages)
        r.add_post(f"/_room/channels/{CHANNEL}/messages", self.post_message)
        r.add_post("/_room/commands", self.invoke_command)
        r.add_post("/_room/buttons", self.press_button)
        r.add_get("/_room/faults", self.get_faults)
        r.add_post("/_room/faults", self.post_faults)
        r.add_delete("/_room/faults", self.clear_faults)
        r.add_get("/_room/events", self.events)
        r.add_get("/_room/annotations", self.get_annotations)
        r.add_get("/_room/show", self.get_show)
        r.add_post("/_room/show/play", self.play_show)
        r.add_get("/", self.index)
        r.add_static("/static/", STATIC, append_version=False)
        r.add_get("/attachments/{channel_id}/{attachment_id}/{filename}", self.attachment)

    async def get_state(self, request: web.Request) -> web.Response:
        return json_response(self.server.snapshot())

    async def list_messages(self, request: web.Request) -> web.Response:
        """`?member=NAME`: as that person, who must be able to see the channel."""
        return json_response(self.server.messages(request.match_info["channel"], request.query.get("member")))

    async def post_message(self, request: web.Request) -> web.Response:
        """JSON (`attachments`: [{filename, data: base64, content_type?}]), or a multipart form: plain fields
        (`author`, `content`) or `payload_json`, with any number of file parts (the web page's upload)."""
        raw, files = await read_body(request)
        body = require_dict(raw)
        author = body.get("author")
        if not isinstance(author, str):
            raise ApiError(400, 50035, '"author" (a person\'s name) is required')
        if not request.content_type.startswith("multipart/"):
            files = json_uploads(body.get("attachments"))
        view = self.server.post(
            request.match_info["channel"],
            author,
            str(body.get("content") or ""),
            reply_to=body.get("reply_to"),
            mentions=list(body.get("mentions") or []),
            moderator=body.get("moderator"),
            allowed_mentions=body.get("allowed_mentions"),
            attachments=files,
        )
        return json_response(view, status=201)

    async def invoke_command(self, request: web.Request) -> web.Response:
        """`target_id`: run the message command `name` on that message (its Apps menu), not a slash command."""
        body = require_dict((await read_body(request))[0])
        channel = body.get("channel") or body.get("channel_id")  # an id, a name or guild/channel
        if not channel:
            raise ApiError(400, 50035, '"channel" (an id, a name or guild/channel) is required')
        for key in ("member", "name"):
            if not body.get(key):
                raise ApiError(400, 50035, f'"{key}" is required')
        result = await self.server.invoke_command(
            str(channel),
            str(body["member"]),
            str(body["name"]),
            bot=body.get("bot"),
            options=body.get("options"),
            moderator=body.get("moderator"),
            timeout=float(body.get("timeout", 10.0)),
            settle=float(body.get("settle", 0.25)),
            target=str(body["target_id"]) if body.get("target_id") is not None else None,
        )
        return json_response(result)

    async def press_button(self, request: web.Request) -> web.Response:
        """`member` presses the button `custom_id` on `message_id` in `channel`; the answers they saw, as for a command."""
        body = require_dict((await read_body(request))[0])
        for key in ("channel", "member", "message_id", "custom_id"):
            if not body.get(key):
                raise ApiError(400, 50035, f'"{key}" is required')
        result = await self.server.press_button(
            str(body["channel"]),
            str(body["member"]),
            str(body["message_id"]),
            str(body["custom_id"]),
            timeout=float(body.get("timeout", 10.0)),
            settle=float(body.get("settle", 0.25)),
        )
        return json_response(result)

    async def get_annotations(self, request: web.Request) -> web.Response:
        """`?ids=1,2,3` -> {id: {"kind": ..., "generation_id": ...}} from the server's annotator."""
        ids = [i for i in request.query.get("ids", "").split(",") if i.strip()]
        if len(ids) > MAX_ANNOTATION_IDS:
            raise ApiError(400, 50035, f"at most {MAX_ANNOTATION_IDS} ids per request")
        try:
            found = await self.server.annotations([i.strip() for i in ids])
        except Exception as exc:  # the annotator is someone else's code: answer, don't crash the page
            log.warning("annotator failed for %d ids", len(ids), exc_info=True)
            return json_response({"message": f"annotator failed: {exc!r}", "code": 0}, status=503)
        return json_response(found)

    async def get_show(self, request: web.Request) -> web.Response:
        """The script playing in this room (the demo's), or 404 where none is."""
        status = self.server.show_status()
        if status is None:
            raise ApiError(404, 0, "nothing is playing in this room")
        return json_response(status)

    async def play_show(self, request: web.Request) -> web.Response:
        """Play the script again (the page's "Play again"); 409 while it is still playing."""
        return json_response(await self.server.play_show_again(), status=202)

    async def index(self, request: web.Request) -> web.FileResponse:
        """The web page of the room (static/index.html; no build step)."""
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def get_faults(self, request: web.Request) -> web.Response:
        return json_response(self.server.faults_view())

    async def post_faults(self, request: web.Request) -> web.Response:
        body = require_dict((await read_body(request))[0])
        post = body.get("message_post")
        if post is not None:
            post = require_dict(post)
            self.server.fail_message_posts(
                int(post.get("status", 500)),
                nth=int(post.get("nth", 1)),
                times=int(post.get("times", 1)),
                retry_after=float(post.get("retry_after", 0.05)),
                is_global=bool(post.get("global", False)),
                after_create=bool(post.get("after_create", False)),
                refuse_seconds=float(post["refuse_seconds"]) if post.get("refuse_seconds") is not None else None,
            )
        shard = body.get("shard")
        if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int) or shard < 0):
            raise ApiError(400, 50035, '"shard" must be a shard id (a whole number, 0 or more)')
        if body.get("invalidate_sessions"):
            await self.server.invalidate_sessions(hold=bool(body.get("hold", False)), shard=shard)
        elif body.get("drop_gateway"):
            await self.server.drop_gateway(hold=bool(body.get("hold", False)), shard=shard)
        if body.get("release_gateway"):
            self.server.release_gateway()
        refuse = body.get("refuse_connections")
        if refuse is not None:
            if isinstance(refuse, bool) or not isinstance(refuse, (int, float)):
                raise ApiError(400, 50035, "refuse_connections must be a number of seconds")
            await self.server.refuse_connections(float(refuse))
        return json_response(self.server.faults_view())

    async def clear_faults(self, request: web.Request) -> web.Response:
        self.server.faults.clear()
        self.server.release_gateway()
        await self.server.outage.end()
        return json_response(self.server.faults_view())

    async def attachment(self, request: web.Request) -> web.Response:
        try:
            att = self.server.state.attachments[int(request.match_info["attachment_id"])]
        except (KeyError, ValueError):
            raise ApiError(404, 0, "404: Not Found") from None
        # As a header: aiohttp's `content_type=` refuses a type with parameters (`text/plain; charset=utf-8`).
        return web.Response(body=att.data, headers={"Content-Type": att.content_type or "application/octet-stream"})

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Every new/edited/deleted message (and typing, members, interaction answers) as server-sent events."""
        queue = self.server.subscribe_events()
        try:
            return await self._events_sse(request, queue)
        finally:
            self.server.unsubscribe_events(queue)

    async def _events_sse(
        self, request: web.Request, queue: asyncio.Queue[dict[str, Any] | None]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            await resp.write(b": connected\n\n")
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    continue
                if item is None:
                    break
                await resp.write(f"event: {item['type']}\ndata: {json.dumps(item)}\n\n".encode())
        except (ConnectionResetError, RuntimeError) as exc:
            log.debug("event stream closed: %r", exc)
        return resp
