"""The partition Kafka's default partitioner picks for a key, for deliveries that name a partition key.

Karafka's ``schedule_target_partition_key`` routes a delivery as if the key were the record key,
but the record key is another value, so the producer cannot do it: the processor computes the
hash, the sink reduces it modulo the destination's partition count.
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (seed 0x9747b28c), as a signed 32-bit int like Java's."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_hash(key: bytes) -> int:
    """``Utils.toPositive(murmur2(key))``: the partition is this modulo the topic's partition count."""
    return murmur2(key) & 0x7FFFFFFF
