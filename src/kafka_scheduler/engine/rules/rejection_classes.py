"""Rejection reasons (free text in ``x-scheduler-rejection-reason``) grouped into a small fixed set of classes, so a
metric labelled by class keeps a bounded number of series whatever the texts quote (names, instants, sizes)."""

from __future__ import annotations

import re

BAD_TIME = "bad_time"
BAD_DESTINATION = "bad_destination"
TOO_LARGE = "too_large"
MISSING_FIELD = "missing_field"
MALFORMED = "malformed"
REFUSED_BY_DESTINATION = "refused_by_destination"
EXPIRED = "expired"  # a delivery later than its max lateness (x-scheduler-max-lateness)
TOO_FREQUENT = "too_frequent"  # a cron firing more often than --cron-min-interval
OTHER = "other"
CLASSES = (
    BAD_TIME,
    BAD_DESTINATION,
    TOO_LARGE,
    MISSING_FIELD,
    MALFORMED,
    REFUSED_BY_DESTINATION,
    EXPIRED,
    TOO_FREQUENT,
    OTHER,
)

# First match wins. Quoted parts ('...') are removed before matching: a value quoted in a reason must not pick
# its class. The texts come from dialects/*.py (decoding) and rejections.py (a destination's refusal, an expiry).
_RULES = (
    (EXPIRED, r"^expired: "),
    (TOO_FREQUENT, r"more often than the minimum interval"),
    # What a destination refused at delivery (rejections.py: TOPIC_MISSING, NOT_AUTHORIZED, ...).
    (
        REFUSED_BY_DESTINATION,
        r"^not authorized to write|^destination (topic|partition) .* does not exist"
        r"|too large for destination",
    ),
    (MISSING_FIELD, r"^(missing|empty) "),
    (TOO_LARGE, r"too large"),
    (BAD_DESTINATION, r"destination|deliver-to|target_partition|partition"),
    (BAD_TIME, r"\btime\b|deliver-at|epoch|days ahead|time zone|ISO-8601|Unix seconds|cron-start-at|cron-end-at"),
    (
        MALFORMED,
        r"^(invalid|malformed|unknown|unparseable|unsupported|duplicate) |not valid UTF-8|newer than"
        r"|no dialect|^header name",
    ),
)
_COMPILED = tuple((name, re.compile(pattern, re.I)) for name, pattern in _RULES)
_QUOTED = re.compile(r"'[^']*'")


def reason_class(reason) -> str:
    """The class of a rejection reason (text or UTF-8 bytes); a request rejected for several reasons is classed by
    its first."""
    if reason is None:
        return OTHER
    text = bytes(reason).decode("utf-8", "replace") if isinstance(reason, (bytes, bytearray, memoryview)) else reason
    text = _QUOTED.sub("''", text)
    for name, pattern in _COMPILED:
        if pattern.search(text):
            return name
    return OTHER
