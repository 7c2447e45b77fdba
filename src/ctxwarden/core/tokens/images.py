"""Image token costs by OpenAI's tile formula, with sizes read from ``data:`` URIs.

Only headers are parsed (PNG, GIF, JPEG, WebP); nothing is decoded or downloaded.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct

from ctxwarden.core.messages import ImagePart

__all__ = ["image_size", "image_tokens", "tile_tokens"]

_DATA_URI = re.compile(r"^data:[\w/+.-]+;base64,(?P<data>.*)$", re.DOTALL)
LOW_DETAIL_TOKENS = 85
TILE_TOKENS = 170
ASSUMED_SIZE = (1024, 1024)


def tile_tokens(width: int, height: int, detail: str | None = "auto") -> int:
    """OpenAI's published cost: 85 + 170 per 512-px tile after two rescalings."""
    if detail == "low":
        return LOW_DETAIL_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / 512) * math.ceil(h / 512)
    return LOW_DETAIL_TOKENS + TILE_TOKENS * tiles


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from an image header, or ``None`` for an unknown format."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return int(w), int(h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and data[12:16] == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return w, h
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            length = int.from_bytes(data[i + 2 : i + 4], "big")
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return int(w), int(h)
            i += 2 + length
    return None


def image_tokens(part: ImagePart) -> tuple[int, bool]:
    """Tokens of one image and whether the size was known (else 1024×1024 assumed)."""
    if part.detail == "low":
        return LOW_DETAIL_TOKENS, True
    match = _DATA_URI.match(part.url)
    size = None
    if match:
        try:
            chunk = match["data"][:65536]
            chunk += "=" * (-len(chunk) % 4)
            size = image_size(base64.b64decode(chunk))
        except (binascii.Error, ValueError):
            size = None
    if size is None:
        return tile_tokens(*ASSUMED_SIZE, part.detail), False
    return tile_tokens(*size, part.detail), True
