"""Where a partition key sends an event: the partition index of a key, stable across
runs and processes (the mapping azure-eventhub's buffered producer uses)."""
from __future__ import annotations

import functools

__all__ = ["partition_for_key"]


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & 0xFFFFFFFF


def _lookup3(data: bytes) -> tuple[int, int]:
    """Bob Jenkins' lookup3 ``hashlittle2`` with zero seeds: returns (c, b)."""
    length = len(data)
    a = b = c = (0xDEADBEEF + length) & 0xFFFFFFFF
    pos = 0
    while length > 12:
        a = (a + int.from_bytes(data[pos:pos + 4], "little")) & 0xFFFFFFFF
        b = (b + int.from_bytes(data[pos + 4:pos + 8], "little")) & 0xFFFFFFFF
        c = (c + int.from_bytes(data[pos + 8:pos + 12], "little")) & 0xFFFFFFFF
        a = (a - c) & 0xFFFFFFFF; a ^= _rot(c, 4); c = (c + b) & 0xFFFFFFFF  # noqa: E702
        b = (b - a) & 0xFFFFFFFF; b ^= _rot(a, 6); a = (a + c) & 0xFFFFFFFF  # noqa: E702
        c = (c - b) & 0xFFFFFFFF; c ^= _rot(b, 8); b = (b + a) & 0xFFFFFFFF  # noqa: E702
        a = (a - c) & 0xFFFFFFFF; a ^= _rot(c, 16); c = (c + b) & 0xFFFFFFFF  # noqa: E702
        b = (b - a) & 0xFFFFFFFF; b ^= _rot(a, 19); a = (a + c) & 0xFFFFFFFF  # noqa: E702
        c = (c - b) & 0xFFFFFFFF; c ^= _rot(b, 4); b = (b + a) & 0xFFFFFFFF  # noqa: E702
        pos += 12
        length -= 12
    if length == 0:
        return c, b
    tail = data[pos:] + b"\x00" * (12 - length)
    a = (a + int.from_bytes(tail[0:4], "little")) & 0xFFFFFFFF
    b = (b + int.from_bytes(tail[4:8], "little")) & 0xFFFFFFFF
    c = (c + int.from_bytes(tail[8:12], "little")) & 0xFFFFFFFF
    c ^= b; c = (c - _rot(b, 14)) & 0xFFFFFFFF  # noqa: E702
    a ^= c; a = (a - _rot(c, 11)) & 0xFFFFFFFF  # noqa: E702
    b ^= a; b = (b - _rot(a, 25)) & 0xFFFFFFFF  # noqa: E702
    c ^= b; c = (c - _rot(b, 16)) & 0xFFFFFFFF  # noqa: E702
    a ^= c; a = (a - _rot(c, 4)) & 0xFFFFFFFF  # noqa: E702
    b ^= a; b = (b - _rot(a, 14)) & 0xFFFFFFFF  # noqa: E702
    c ^= b; c = (c - _rot(b, 24)) & 0xFFFFFFFF  # noqa: E702
    return c, b


@functools.lru_cache(maxsize=65536)
def partition_for_key(partition_key: str, partition_count: int) -> int:
    """The partition index of a key: stable across runs and processes.

    The same mapping as azure-eventhub's buffered producer (lookup3 over the key's
    UTF-8 bytes, folded to a signed 16-bit value, modulo the partition count). Whether
    the service maps keys the same way is not published; what matters here is that a
    key always lands in the same partition.
    """
    if not partition_key:
        return 0
    c, b = _lookup3(partition_key.encode("utf-8"))
    folded = (c ^ b) & 0xFFFF
    signed = folded - 0x10000 if folded >= 0x8000 else folded
    return abs(signed % partition_count)
