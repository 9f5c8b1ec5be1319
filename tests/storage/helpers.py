"""Frame builders shared by the storage tests: encode entries that continue a store's tail exactly."""

from __future__ import annotations

from storage import codec
from storage.api import LogPosition


def build(tail: LogPosition, bodies: list[bytes], term: int | None, segment_size: int) -> bytes:
    """Encode ``bodies`` as entries following ``tail`` (term defaults to the tail's term, at least 1)."""
    term = max(tail.last_term, 1) if term is None else term
    buf = bytearray()
    chain, end, index = tail.chain_crc, tail.end_pos, tail.last_index + 1
    for body in bodies:
        pos = codec.place(end, codec.HEADER_SIZE + len(body), segment_size)
        chain = codec.encode_into(buf, index, term, pos, body, chain)
        end = pos + codec.HEADER_SIZE + len(body)
        index += 1
    return bytes(buf)


def append(store, bodies: list[bytes], term: int | None = None) -> list[int]:
    return store.append(build(store.tail(), bodies, term, store.segment_size))


def body_for(index: int, salt: int = 0, size: int | None = None) -> bytes:
    """A deterministic body for ``index`` (so a test can tell entries apart)."""
    n = (index * 7 + salt) % 97 if size is None else size
    seed = f"{index}:{salt}:".encode()
    return (seed * (n // len(seed) + 1))[:n]
