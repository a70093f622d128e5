"""Real image bytes for tests, built with the standard library (no imaging dependency)."""

from __future__ import annotations

import struct
import zlib


def png(width: int = 1, height: int = 1) -> bytes:
    """A real PNG: signature, IHDR, one IDAT of grey pixels, IEND."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
