"""HTTP helpers shared by the Discord REST routes and the /_room/ API.

discord.py only parses a body as JSON when Content-Type is exactly `application/json`
(aiohttp's json_response appends `; charset=utf-8`), so every JSON answer goes through here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, web

from .model import ApiError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Upload = tuple[str, bytes, str | None]


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response whose Content-Type is exactly `application/json`."""
    all_headers = {"Content-Type": "application/json"}
    if headers:
        all_headers.update(headers)
    return web.Response(body=json.dumps(data).encode(), status=status, headers=all_headers)


def no_content() -> web.Response:
    return web.Response(status=204)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn ApiError (and bad JSON) into Discord-shaped error bodies."""
    try:
        return await handler(request)
    except ApiError as exc:
        if exc.status >= 500:
            log.error("%s %s -> %s", request.method, request.path, exc)
        else:
            log.debug("%s %s -> %s", request.method, request.path, exc)
        return json_response(exc.body(), status=exc.status)
    except json.JSONDecodeError:
        return json_response({"message": "The request body contains invalid JSON.", "code": 50109}, status=400)


async def read_body(request: web.Request) -> tuple[Any, list[Upload]]:
    """The JSON body, or a multipart form: `payload_json` plus its files, as Discord takes a message with files.

    Discord's form names each file part `files[n]`, and the payload's `attachments` entry whose `id` is
    n may rename it (its `filename` wins). A form without `payload_json` (an HTML form, a browser's
    FormData) gives its plain fields as the payload. Every file part is kept, whatever its field name.
    """
    if request.content_type.startswith("multipart/"):
        payload: Any = None
        fields: dict[str, str] = {}
        parts: list[tuple[str | None, str, bytes, str | None]] = []  # field name, filename, bytes, content type
        reader = await request.multipart()
        while True:
            part = await reader.next()
            if part is None:
                break
            if not isinstance(part, BodyPartReader):  # nested multipart: not something Discord accepts
                raise ApiError(400, 50035, "Invalid Form Body")
            if part.name == "payload_json":
                payload = json.loads(await part.text())
            elif part.filename is not None:
                data = await part.read(decode=False)
                parts.append((part.name, part.filename, bytes(data), part.headers.get("Content-Type")))
            elif part.name:
                fields[part.name] = await part.text()
        if payload is None:
            payload = fields
        return payload, _named(payload, parts)
    raw = await request.read()
    if not raw.strip():
        return {}, []
    return json.loads(raw), []


_FILES_FIELD = re.compile(r"^files\[(\d+)\]$")


def _named(payload: Any, parts: list[tuple[str | None, str, bytes, str | None]]) -> list[Upload]:
    """Each file with the name the payload's `attachments` entry gives its `files[n]` part, if any."""
    names: dict[str, str] = {}
    entries = payload.get("attachments") if isinstance(payload, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("filename"), str) and entry.get("id") is not None:
            names[str(entry["id"])] = entry["filename"]
    out: list[Upload] = []
    for field, filename, data, ctype in parts:
        m = _FILES_FIELD.match(field or "")
        out.append((names.get(m.group(1), filename) if m else filename, data, ctype))
    return out


def require_dict(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(
            400,
            50035,
            "Invalid Form Body",
            {"_errors": [{"code": "DICT_TYPE_CONVERT", "message": "Only dictionaries may be used in a DictType"}]},
        )
    return body


def query_int(request: web.Request, name: str, default: int | None = None) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ApiError(
            400,
            50035,
            "Invalid Form Body",
            {name: {"_errors": [{"code": "NUMBER_TYPE_COERCE", "message": f'Value "{value}" is not int.'}]}},
        ) from None


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")
