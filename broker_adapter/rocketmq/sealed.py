"""What receipt and recall handles share (``receipt.py``, ``recall.py``): a handle is a prefix, then base64url
without padding of a body and the body's CRC32 (4 bytes, big-endian), so a mangled or made-up handle is refused,
not misread; names in a body are length-prefixed UTF-8 (1 + n bytes, at most 255)."""

from __future__ import annotations

import base64
import binascii
import zlib


def seal(prefix: str, body: bytes) -> str:
    return prefix + base64.urlsafe_b64encode(body + zlib.crc32(body).to_bytes(4, "big")).decode().rstrip("=")


def unseal(
    prefix: str, text: object, max_length: int, min_body: int, error: type[ValueError], what: str
) -> bytes:
    """The body of a sealed handle; ``error`` saying what is wrong with it otherwise."""
    if not isinstance(text, str) or not text.startswith(prefix) or len(text) > max_length:
        shown = text[:40] if isinstance(text, str) else type(text).__name__
        raise error(f"not a {what} of this broker: {shown!r}")
    b64 = text[len(prefix) :]
    try:
        raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    except (binascii.Error, ValueError) as err:
        raise error(f"{what} is not base64url: {err}") from None
    if len(raw) < min_body + 4:
        raise error(f"{what} is too short ({len(raw)} bytes)")
    body, crc = raw[:-4], int.from_bytes(raw[-4:], "big")
    if zlib.crc32(body) != crc:
        raise error(f"{what} checksum does not match: it was altered or truncated")
    return body


def pack_names(names: tuple[str, ...], error: type[ValueError], what: str) -> bytes:
    encoded = [n.encode() for n in names]
    if any(len(n) > 255 for n in encoded):
        raise error(f"{what} must be at most 255 bytes each")
    return b"".join(bytes([len(n)]) + n for n in encoded)


def unpack_names(body: bytes, at: int, count: int, error: type[ValueError], what: str) -> list[str]:
    """``count`` names from ``at`` to the body's end exactly."""
    names: list[str] = []
    try:
        for _ in range(count):
            n = body[at]
            names.append(body[at + 1 : at + 1 + n].decode())
            at += 1 + n
    except (IndexError, UnicodeDecodeError) as err:
        raise error(f"names no {what}: {err}") from None
    if at != len(body):
        raise error(f"has {len(body) - at} bytes after its {what}")
    return names
