"""The files people post, as a resident's request carries them: images as image blocks, text inline
(each line marked, `residents.context.marks`), the rest as one line each (`residents.truth.attachment_line`).
A request holds its files to a budget (`within_request`), the newest messages' first.

What a file is comes from its bytes: an image by its magic numbers (PNG, JPEG, GIF, WebP), text by
being UTF-8 without NUL bytes — a declared content type only names the limit a file too large to read
went over, and whether undecodable bytes were meant as text. The limits and wording are `residents.truth`'s.
The ledger keeps each file by name, type, size and SHA-256 (`SharedFile`), never its bytes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from .. import truth
from ..records import NotShown, SharedFile, Shown
from .marks import one_line, quoted

SUPPORTED_IMAGES = ("image/png", "image/jpeg", "image/gif", "image/webp")
FETCH_LIMIT = max(truth.IMAGE_LIMIT, truth.TEXT_LIMIT)  # a file over this is described without being read


def image_type(data: bytes) -> str | None:
    """The image type its first bytes say (PNG, JPEG, GIF, WebP), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


# JPEG markers of a frame header (SOF0–SOF15 less DHT, JPG and DAC), which carries the image's size.
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes) -> tuple[int, int] | None:
    """An image's width and height as its header states them, or None where the header does not say
    (then the provider decides). Read from the bytes alone: no image library, nothing decoded."""
    try:
        if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
            return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if data.startswith((b"GIF87a", b"GIF89a")) and len(data) >= 10:
            return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            chunk = data[12:16]
            if chunk == b"VP8X" and len(data) >= 30:
                return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
            if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
                bits = int.from_bytes(data[21:25], "little")
                return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
            if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a" and len(data) >= 30:
                return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
            return None
        if data.startswith(b"\xff\xd8"):
            i = 2
            while i + 4 <= len(data) and data[i] == 0xFF:
                marker = data[i + 1]
                if marker == 0xFF:  # fill byte
                    i += 1
                    continue
                if marker == 0x01 or 0xD0 <= marker <= 0xD9:  # markers without a length
                    i += 2
                    continue
                if marker in _JPEG_FRAMES and i + 9 <= len(data):
                    return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(data[i + 5 : i + 7], "big")
                if marker == 0xDA:  # the scan began with no frame header before it
                    return None
                i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    except IndexError:
        return None
    return None


def as_text(data: bytes) -> str | None:
    """The file's text if it is UTF-8 (a BOM allowed) without NUL bytes, else None."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def base64_size(n: int) -> int:
    """The length of `n` bytes as base64: what a provider holds to its image limit (a third more)."""
    return 4 * ((n + 2) // 3)


def shown_name(name: str) -> str:
    """A file name on one line of the request (`marks.one_line`): it cannot close its own
    `[attachment: …]` line or open another. The ledger keeps it whole."""
    return one_line(name)


def _declared_kind(declared: str | None) -> str:
    base = (declared or "").split(";")[0].strip().lower()
    return "image" if base.startswith("image/") else "text" if base.startswith("text/") else ""


@dataclass(frozen=True)
class Fetched:
    """An attachment of a room message as the room gave it: its metadata and, where read, its bytes."""

    name: str
    size: int  # as the room declared it (the bytes, where read, are what count)
    declared_type: str | None = None
    data: bytes | None = None  # None: not read — over FETCH_LIMIT, or the fetch failed (`failed`)
    failed: bool = False


@dataclass
class Placed:
    """One attachment's decision: its ledger record, and what the request carries for it."""

    record: SharedFile
    text: str | None = None  # the text file's text, or the description line
    image: dict[str, Any] | None = None  # the image block


def _described(
    f: Fetched,
    message_id: str,
    pos: int,
    size: int,
    digest: str | None,
    reason: NotShown,
    kind: str = "",
    media: str | None = None,
) -> Placed:
    record = SharedFile(message_id, pos, f.name, media or f.declared_type, size, digest, Shown.DESCRIBED, reason)
    return Placed(record, truth.attachment_line(shown_name(f.name), size, reason, kind))


def decide(message_id: str, files: tuple[Fetched, ...], images_ok: bool) -> list[Placed]:
    """Each file of one message: an image block, inline text, or a line saying why it is not shown."""
    placed: list[Placed] = []
    images = 0
    for pos, f in enumerate(files):
        data = f.data
        size = len(data) if data is not None else f.size
        digest = hashlib.sha256(data).hexdigest() if data is not None else None

        if data is None:
            reason = NotShown.UNAVAILABLE if f.failed else NotShown.TOO_LARGE
            placed.append(_described(f, message_id, pos, size, digest, reason, _declared_kind(f.declared_type)))
            continue
        media = image_type(data)
        if media is not None:
            if base64_size(size) > truth.IMAGE_LIMIT:
                placed.append(_described(f, message_id, pos, size, digest, NotShown.TOO_LARGE, "image", media))
            elif not images_ok:
                placed.append(_described(f, message_id, pos, size, digest, NotShown.NO_IMAGES, "image", media))
            elif max(image_size(data) or (0, 0)) > truth.IMAGE_SIDE_LIMIT:
                placed.append(_described(f, message_id, pos, size, digest, NotShown.TOO_MANY_PIXELS, "image", media))
            elif images >= truth.IMAGES_PER_MESSAGE:
                placed.append(_described(f, message_id, pos, size, digest, NotShown.TOO_MANY, "image", media))
            else:
                images += 1
                block = {
                    "type": "image",
                    "source": {"type": "base64", "media_type": media, "data": base64.b64encode(data).decode("ascii")},
                }
                record = SharedFile(message_id, pos, f.name, media, size, digest, Shown.IMAGE)
                placed.append(Placed(record, truth.attachment_image_label(shown_name(f.name), size), block))
            continue
        text = as_text(data)
        if text is None:
            reason = NotShown.NOT_UTF8 if _declared_kind(f.declared_type) == "text" else NotShown.UNSUPPORTED
            placed.append(_described(f, message_id, pos, size, digest, reason))
        elif size > truth.TEXT_LIMIT:
            placed.append(_described(f, message_id, pos, size, digest, NotShown.TOO_LARGE, "text"))
        else:
            media = f.declared_type if _declared_kind(f.declared_type) == "text" else "text/plain"
            record = SharedFile(message_id, pos, f.name, media, size, digest, Shown.TEXT)
            placed.append(Placed(record, f"{truth.attachment_text_header(shown_name(f.name), size)}\n{quoted(text)}"))
    return placed


def within_request(per_message: list[list[Placed]], budget: int) -> None:
    """Hold a request's files to its limits, newest messages first (messages oldest first; within one
    message, its files in order): images to `IMAGES_PER_REQUEST` and `IMAGE_BYTES_PER_REQUEST`, and every
    image and inline text file to `budget` tokens (`truth.file_tokens`). A file past a limit is described
    instead, in place; an older one that still fits what is left is shown."""
    count = total = spent = 0
    for placed in reversed(per_message):
        for i, p in enumerate(placed):
            r = p.record
            if r.shown == Shown.DESCRIBED:
                continue
            image = p.image is not None
            if image and (count + 1 > truth.IMAGES_PER_REQUEST or total + r.size > truth.IMAGE_BYTES_PER_REQUEST):
                placed[i] = _left_out(r, NotShown.REQUEST_LIMIT, "image", budget)
                continue
            cost = truth.file_tokens(p.text, image)
            if spent + cost > budget:
                placed[i] = _left_out(r, NotShown.OVER_BUDGET, "image" if image else "text", budget)
                continue
            spent += cost
            if image:
                count += 1
                total += r.size


def _left_out(r: SharedFile, reason: NotShown, kind: str, budget: int) -> Placed:
    """A file shown by its own limits that the request's limits leave out: one line in its place."""
    record = SharedFile(r.message_id, r.position, r.name, r.media_type, r.size, r.sha256, Shown.DESCRIBED, reason)
    return Placed(record, truth.attachment_line(shown_name(r.name), r.size, reason, kind, budget))


def content(line: str, placed: list[Placed]) -> str | list[dict[str, Any]]:
    """A message's content: its line and its files' text; a list of blocks where it carries images."""
    parts: list[str | dict[str, Any]] = [line] if line else []
    for p in placed:
        if p.text is not None:
            parts.append(p.text)
        if p.image is not None:
            parts.append(p.image)
    if not any(isinstance(x, dict) for x in parts):
        return "\n".join(x for x in parts if isinstance(x, str))
    blocks: list[dict[str, Any]] = []
    for x in parts:
        if isinstance(x, dict):
            blocks.append(x)
        elif blocks and blocks[-1]["type"] == "text":
            blocks[-1]["text"] += "\n" + x
        else:
            blocks.append({"type": "text", "text": x})
    return blocks
