"""Attachments in the ledger: each file of a request by name, type, size and SHA-256 — never its bytes.

A request is stored with every image block's base64 data replaced by a reference to its SHA-256
(`stored_request`), so the ledger holds what was asked of the model without the files themselves; a
request rebuilt from the ledger (a later /continue) carries a line in each image's place
(`without_image_refs`), since the bytes are not there to send again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from .. import truth
from ..records import NotShown, SharedFile, Shown

IMAGE_REF = "sha256"  # the `source.type` of an image block whose data the ledger replaced by its hash


def _image_ref(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64" or not isinstance(source.get("data"), str):
        return block
    try:
        digest = hashlib.sha256(base64.b64decode(source["data"], validate=True)).hexdigest()
    except (binascii.Error, ValueError):
        digest = hashlib.sha256(source["data"].encode("ascii", "replace")).hexdigest()
    return {**block, "source": {"type": IMAGE_REF, "media_type": source.get("media_type"), "sha256": digest}}


def _map_images(request: dict[str, Any], change: Any) -> dict[str, Any]:
    messages = request.get("messages")
    if not isinstance(messages, list) or not any(
        isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages
    ):
        return request
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            m = {
                **m,
                "content": [change(b) if isinstance(b, dict) and b.get("type") == "image" else b for b in content],
            }
        out.append(m)
    return {**request, "messages": out}


def stored_request(request: dict[str, Any]) -> dict[str, Any]:
    """The request as the ledger keeps it: each base64 image's data replaced by its SHA-256."""
    return _map_images(request, _image_ref)


def without_image_refs(request: dict[str, Any]) -> dict[str, Any]:
    """A stored request made sendable again: each image reference becomes a text line saying so."""

    def change(block: dict[str, Any]) -> dict[str, Any]:
        source = block.get("source")
        if isinstance(source, dict) and source.get("type") == IMAGE_REF:
            # A line of its own however a provider joins the text around it (chat completions joins a
            # message's text parts with nothing between): a note starts a line, and no one's text follows it there.
            note = truth.image_not_resent(str(source.get("media_type")), str(source["sha256"]))
            return {"type": "text", "text": f"\n{note}\n"}
        return block

    return _map_images(request, change)


INSERT = (
    "INSERT INTO attachments (generation_id, message_id, position, name, media_type, size, sha256, shown, reason)"
    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)"
)


def _blob(text: str | None) -> bytes | None:
    """A name or type as the room gave it, kept byte-exact like every text of the ledger: the room's
    JSON can carry a lone surrogate (`\\ud800`), which plain TEXT could not store."""
    return text.encode("utf-8", "surrogatepass") if text is not None else None


def text_of(value: bytes | str | None) -> str | None:
    """A name or type column as written: a BLOB of UTF-8 (surrogates passed through), or TEXT."""
    return bytes(value).decode("utf-8", "surrogatepass") if isinstance(value, bytes | memoryview) else value


def insert(generation_id: str, files: list[SharedFile]) -> list[tuple[str, tuple[Any, ...]]]:
    return [
        (
            INSERT,
            (
                generation_id,
                f.message_id,
                f.position,
                _blob(f.name),
                _blob(f.media_type),
                f.size,
                f.sha256,
                f.shown,
                f.reason,
            ),
        )  # fmt: skip
        for f in files
    ]


def from_row(r: Any) -> SharedFile:
    return SharedFile(
        message_id=r["message_id"],
        position=r["position"],
        name=text_of(r["name"]) or "",
        media_type=text_of(r["media_type"]),
        size=r["size"],
        sha256=r["sha256"],
        shown=Shown(r["shown"]),
        reason=NotShown(r["reason"]) if r["reason"] is not None else None,
    )
