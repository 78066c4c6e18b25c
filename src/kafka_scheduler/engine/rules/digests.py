"""The digest of a version: what makes two versions "strictly identical" (an identical REPLACE, or CRON_ADD, is a
no-op). Digests are stored in checkpoints (chunk rows, the id index): their encoding must never change by one byte
(tests/unit/test_stored_formats.py pins them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct

from .cells import flag, header_pairs, missing, optional_bytes
from .entries import schedule_of_entry
from .schedule import Schedule


def _part(pieces: list, data: bytes | None) -> None:
    """One field of a digest: its length and bytes, or 0xff for null (so no two field lists encode alike)."""
    if data is None:
        pieces.append(b"\xff")
    else:
        pieces.append(struct.pack(">I", len(data)))
        pieces.append(data)


def _header_parts(pieces: list, pairs) -> None:
    pieces.append(struct.pack(">I", len(pairs)))
    for name, value in pairs:
        _part(pieces, name.encode())
        _part(pieces, value)


def _native_digest(due_ms: int, topic: str, key: bytes | None, value: bytes | None, header_list):
    """The digest of the fields every version has (a blake2b object, to go on with the rest)."""
    pieces = [struct.pack(">q", due_ms)]
    _part(pieces, topic.encode())
    _part(pieces, key)
    _part(pieces, value)
    _header_parts(pieces, header_list)
    h = hashlib.blake2b(digest_size=16)
    h.update(b"".join(pieces))
    return h


def digest_of_entry(r) -> bytes:
    """``digest(schedule_of_entry(r))``, without making the Schedule for a native row (the ingest path)."""
    if (
        missing(r.partition)
        and missing(r.partition_key)
        and missing(r.wb_headers)
        and not flag(r.history)
        and missing(getattr(r, "max_lateness_ms", None))
        and missing(getattr(r, "cron_expr", None))
    ):
        return _native_digest(
            int(r.due_ms),
            r.topic,
            optional_bytes(r.key),
            optional_bytes(r.value),
            [(name, optional_bytes(value)) for name, value in header_pairs(r.headers)],
        ).digest()
    return digest(schedule_of_entry(r))


def digest(schedule: Schedule) -> bytes:
    """What makes two versions "strictly identical": due time, destination, key, value, headers. Stored in
    checkpoints (chunk rows, the index): the encoding must never change."""
    h = _native_digest(schedule.due_ms, schedule.topic, schedule.key, schedule.value, schedule.headers)
    if (
        schedule.partition is not None
        or schedule.partition_key is not None
        or schedule.write_back is not None
        or schedule.history
    ):
        # Only dialects other than native get here, so digests of native schedules stay as they were.
        pieces = [b"+"]
        _part(pieces, None if schedule.partition is None else str(schedule.partition).encode())
        _part(pieces, schedule.partition_key)
        back = schedule.write_back
        if back is None:
            pieces.append(b"\xff")
        else:
            _part(pieces, back.topic.encode())
            pieces.append(struct.pack(">i", back.partition))
            _part(pieces, back.key)
            _header_parts(pieces, back.headers)
        pieces.append(b"h" if schedule.history else b"-")
        h.update(b"".join(pieces))
    if schedule.max_lateness_ms is not None or schedule.cron is not None:
        # Only schedules with expiry or a cron add this part: the digests of all others stay as they always were.
        pieces = [b"c", struct.pack(">q", -1 if schedule.max_lateness_ms is None else schedule.max_lateness_ms)]
        definition = schedule.cron
        if definition is not None:
            _part(pieces, definition.expr.encode())
            _part(pieces, None if definition.tz is None else definition.tz.encode())
            _part(pieces, definition.policy.encode())
            for bound in (definition.start_ms, definition.end_ms):
                pieces.append(b"\xff" if bound is None else struct.pack(">q", bound))
        h.update(b"".join(pieces))
    return h.digest()


def cron_digest(schedule: Schedule) -> bytes:
    """What makes two cron definitions identical (an identical CRON_ADD is a no-op): all but the firing instant and
    the ids."""
    return digest(dataclasses.replace(schedule, due_ms=0, delivery_id=""))


def cron_digest_of_entry(r) -> bytes:
    """``cron_digest(schedule_of_entry(r))`` without the Schedule (the bulk path of CRON_ADDs)."""
    return cron_digest(schedule_of_entry(r))
