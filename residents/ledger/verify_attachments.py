"""`ledger verify` on attachments: each row says consistently how its file was shown, and names a
generation that exists. (The rows never hold bytes: the table has no column for them.)"""

from __future__ import annotations

import re
from typing import Any

from ..records import NotShown, Shown
from .attachments import text_of

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_UNREAD = frozenset({NotShown.TOO_LARGE, NotShown.UNAVAILABLE})  # the only reasons a file may be unread


def check_attachments(lines: list[str], rows: list[dict[str, Any]], generations: set[str]) -> None:
    for r in rows:
        r = {**r, "name": text_of(r["name"]), "media_type": text_of(r["media_type"])}
        who = (
            f"attachment {r['name']!r} of generation {r['generation_id']} (message {r['message_id']} #{r['position']})"
        )
        if r["generation_id"] not in generations:
            lines.append(f"{who}: belongs to a missing generation")
        digest, shown, reason = r["sha256"], r["shown"], r["reason"]
        if digest is not None and not _SHA256.match(digest):
            lines.append(f"{who}: sha256 is not 64 lowercase hex digits")
        if shown not in set(Shown):
            lines.append(f"{who}: shown {shown!r} is not image, text or described")
        elif shown == Shown.DESCRIBED:
            if reason not in set(NotShown):
                lines.append(f"{who}: described without a known reason ({reason!r})")
            elif digest is None and reason not in _UNREAD:
                lines.append(f"{who}: described as {reason} but its bytes were not read")
        else:
            if reason is not None:
                lines.append(f"{who}: shown as {shown} yet has a reason ({reason})")
            if digest is None:
                lines.append(f"{who}: shown as {shown} without the SHA-256 of what was shown")
            if shown == Shown.IMAGE and r["media_type"] not in _IMAGES:
                lines.append(f"{who}: shown as an image of type {r['media_type']!r}")
