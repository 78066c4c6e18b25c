"""Native ADDs and REPLACEs read as they arrive, decoded in Python, so that one due before a batch could reach it is
handed to the timed writer at once (``TimedWriter.hold_early``) and a version it supersedes is dropped.

The verdict is the native decoder's (dialects/native.py) on a strict subset of what it accepts: a record this module
decodes is one the decoder accepts with the same fields; anything it is not sure of (another spelling of the due
time, a header name outside ASCII, a destination rule given as a regex, ...) is left to the batches, as every request
was before. tests/unit/test_early_requests.py holds the two verdicts side by side over hostile records.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ...delivery_ids import delivery_id
from ...dialects.common import TOPIC_NAME_REGEX, DecodeSettings
from ...dialects.native import ISO_DURATION_REGEX, MILLIS_REGEX, UNITS_REGEX
from ...kafka.topics import Destination
from ...protocol import (
    ACTION,
    CLIENT_SID_PREFIX,
    DELIVER_AT,
    DELIVER_TO,
    DELIVERY_ID,
    INTERNAL_SID_PREFIX,
    MAX_LATENESS,
    PREFIX,
    REQUEST_ID,
    schedule_sid,
)
from .early_cancels import Arrival, first_headers
from .sink_plan import record_payload_bytes, takes_at_once

# The due time as the client writes it (UTC, a Z, up to nanoseconds): other spellings are the batches' to read.
# ASCII: Java's \d is an ASCII digit, Python's any digit.
UTC_INSTANT = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?Z", re.ASCII)
_TOPIC = re.compile(TOPIC_NAME_REGEX, re.ASCII)
_MILLIS, _UNITS, _ISO = (re.compile(regex, re.ASCII) for regex in (MILLIS_REGEX, UNITS_REGEX, ISO_DURATION_REGEX))
ONE_SHOT_ACTIONS = ("ADD", "REPLACE")


class EarlyRequest(NamedTuple):
    """A valid native ADD or REPLACE, as the decoder reads it."""

    action: str
    sid: bytes  # id:<topic>/<request id>, or offset:<topic>/<partition>/<offset> for an ADD without id
    arrival: Arrival
    due_ms: int
    topic: str  # the destination
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]  # those delivered: the request's, less every x-scheduler-* one
    max_lateness_ms: int | None

    @property
    def delivery_id(self) -> str:
        return delivery_id(self.arrival.topic, self.arrival.partition, self.arrival.offset)

    @property
    def has_id(self) -> bool:
        return self.sid.startswith(CLIENT_SID_PREFIX)


def _text(value: bytes | None) -> str | None:
    return None if value is None else bytes(value).decode("utf-8", "replace")


def due_ms_of(text: str | None) -> int | None:
    """Epoch milliseconds of a UTC instant as the client writes it, rounded up (never early); None for any other
    spelling, or a date that does not exist."""
    match = None if text is None else UTC_INSTANT.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    if not (1970 <= year <= 9999 and 1 <= month <= 12 and hour < 24 and minute < 60 and second < 60):
        return None
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        return None
    fraction = (match.group(7) or "").ljust(9, "0")
    below_ms = int(fraction[3:]) > 0
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    return seconds * 1000 + int(fraction[:3]) + (1 if below_ms else 0)


def _part(match: re.Match, group: int, factor: int) -> int:
    return int(match.group(group) or 0) * factor


def lateness_ms_of(raw: str) -> int | None:
    """Milliseconds of an x-scheduler-max-lateness, as the decoder reads it (``native.duration_ms``); None when it is
    not a duration."""
    if not raw.isascii():
        return None
    text = raw.strip(" ").lower()
    if _MILLIS.fullmatch(text):
        return int(text)
    units = _UNITS.fullmatch(text)
    if text and units:
        return (
            _part(units, 1, 86_400_000)
            + _part(units, 2, 3_600_000)
            + _part(units, 3, 60_000)
            + _part(units, 4, 1000)
            + _part(units, 5, 1)
        )
    iso = _ISO.fullmatch(text)
    if iso and text not in ("p", "pt") and not text.endswith("t"):
        millis = int((iso.group(5) or "").ljust(3, "0"))
        return (
            _part(iso, 1, 86_400_000) + _part(iso, 2, 3_600_000) + _part(iso, 3, 60_000) + _part(iso, 4, 1000) + millis
        )
    return None


def native_early_request(
    arrival: Arrival,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable | None,
    settings: DecodeSettings,
    first: dict | None = None,
) -> EarlyRequest | None:
    """The ADD or REPLACE a record of a native input (read at ``arrival``, its own ``timestamp``) is, when this module
    can tell it as the decoder does; else None (another action, invalid, or not sure: the batches decide).
    ``first``: ``first_headers(headers)``, when the caller has it."""
    headers = list(headers or ())
    if any(not isinstance(name, str) or not name.isascii() for name, _ in headers):
        return None
    first = first or first_headers(headers)
    if first is None:
        return None
    action_text = _text(first.get(ACTION))
    if action_text is not None and not action_text.isascii():
        return None
    action = "ADD" if action_text is None else action_text.strip(" ").upper()
    if action not in ONE_SHOT_ACTIONS:
        return None
    request_id = first.get(REQUEST_ID)
    if request_id is not None and len(request_id) == 0:
        return None  # an empty id is rejected
    if request_id is None and action == "REPLACE":
        return None  # a REPLACE needs an id
    destination = _text(first.get(DELIVER_TO))
    if destination is None or not _allowed(destination, settings):
        return None
    due_ms = due_ms_of(_text(first.get(DELIVER_AT)))
    if due_ms is None or due_ms > timestamp + settings.max_ahead_ms:
        return None
    lateness = None
    if MAX_LATENESS in first:
        raw = _text(first[MAX_LATENESS])
        lateness = None if raw is None else lateness_ms_of(raw)
        if lateness is None or lateness <= 0:
            return None
    if len(value or b"") > settings.max_value_bytes:
        return None
    sid = (
        schedule_sid(arrival.topic, bytes(request_id))
        if request_id is not None
        else INTERNAL_SID_PREFIX + f"{arrival.topic}/{arrival.partition}/{arrival.offset}".encode()
    )
    delivered = tuple(
        (name, None if v is None else bytes(v)) for name, v in headers if not name.lower().startswith(PREFIX)
    )
    return EarlyRequest(
        action,
        sid,
        arrival,
        due_ms,
        destination,
        None if key is None else bytes(key),
        None if value is None else bytes(value),
        delivered,
        lateness,
    )


def early_decoder(settings: DecodeSettings, lookahead_ms: int, destination_of: Callable[[str], Destination | None]):
    """``native_early_request`` with the job's settings, as the CANCEL watcher calls it for each record. A request due
    later than the lookahead from now is the batches' (one will have applied it before the frontier reaches its due
    time): told from the due time's text alone, without decoding the rest (a backlog of far-off requests costs next
    to nothing). So is one whose destination the sink has not looked up yet (``destination_of``: what it knows of a
    topic), or would refuse: the batches make a rejection of it where the sink would."""

    latest = [0, b""]  # the second it was made in, and the latest due time's text that may be decoded then

    def decode(arrival: Arrival, timestamp: int, key, value, headers, first=None) -> EarlyRequest | None:
        due_text = None if not first else first.get(DELIVER_AT)
        if due_text is not None and len(due_text) >= 19:
            now = int(time.time())
            if now != latest[0]:
                latest[:] = now, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now + lookahead_ms / 1000 + 2)).encode()
            if bytes(due_text[:19]) > latest[1]:
                return None
        request = native_early_request(arrival, timestamp, key, value, headers, settings, first)
        if request is None:
            return None
        delivered = (*request.headers, (DELIVERY_ID, request.delivery_id.encode()))
        payload = record_payload_bytes(request.key, request.value, delivered)
        return request if takes_at_once(destination_of(request.topic), payload) else None

    return decode


def _allowed(destination: str, settings: DecodeSettings) -> bool:
    """The decoder's rules for a destination with the built-in rule (a rule given as a regex is Java's to apply)."""
    if settings.allowed_destinations is not None:
        return False
    if not _TOPIC.fullmatch(destination) or destination in (".", ".."):
        return False
    return not destination.startswith("__") and destination not in settings.own_topics
