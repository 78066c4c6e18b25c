"""Rejection reasons (free text in ``x-scheduler-rejection-reason``) grouped into a small fixed set of classes, so a
metric labelled by class keeps a bounded number of series whatever the texts quote (names, instants, sizes)."""

from __future__ import annotations

import re

BAD_TIME = "bad_time"
BAD_DESTINATION = "bad_destination"
TOO_LARGE = "too_large"
MISSING_FIELD = "missing_field"
MALFORMED = "malformed"
BAD_CRON = "bad_cron"  # a recurring schedule's definition the job cannot use
BAD_MAX_LATENESS = "bad_max_lateness"
REFUSED_BY_DESTINATION = "refused_by_destination"
EXPIRED = "expired"  # a delivery later than its max lateness (x-scheduler-max-lateness)
TOO_FREQUENT = "too_frequent"  # a cron firing more often than --cron-min-interval
OTHER = "other"

# Each class in a few words, as the status page shows it beside a rejection.
ABOUT = {
    MISSING_FIELD: "a required field is missing or empty (destination, due time, id, cron expression)",
    BAD_TIME: "a time cannot be read (no time zone, not ISO-8601 or Unix seconds), is negative, or is too far ahead",
    BAD_DESTINATION: "the destination topic or partition is not valid, or not allowed",
    TOO_LARGE: "the request is larger than the limit",
    MALFORMED: "the record is not a request of its dialect (unknown action or type, duplicate header, bad encoding, "
    "unsupported version)",
    BAD_CRON: "the recurring schedule cannot be used: an invalid cron expression or one that never fires, an unknown "
    "time zone, an unknown missed-fire policy, or its end before its start",
    BAD_MAX_LATENESS: "x-scheduler-max-lateness is not a positive duration",
    TOO_FREQUENT: "the recurring schedule fires more often than --cron-min-interval allows",
    EXPIRED: "not delivered: it would have gone out later than its due time plus its max lateness",
    REFUSED_BY_DESTINATION: "the destination refused the delivery (missing, not authorized, too large)",
    OTHER: "a reason without a class of its own (see x-scheduler-rejection-reason in the rejections topic)",
}
CLASSES = tuple(ABOUT)

# First match wins. Quoted parts ('...') are removed before matching: a value quoted in a reason must not pick
# its class. The texts come from dialects/*.py (decoding), engine/rules/cron.py (a CRON_ADD the rules refuse) and
# engine/rules/rejections.py (a destination's refusal, an expiry); tests/unit/test_prometheus.py walks them.
_RULES = (
    (EXPIRED, r"^expired: "),
    (TOO_FREQUENT, r"more often than the minimum interval"),
    # What a destination refused at delivery (rejections.py: TOPIC_MISSING, NOT_AUTHORIZED, ...).
    (
        REFUSED_BY_DESTINATION,
        r"^not authorized to write|^destination (topic|partition) .* does not exist"
        r"|too large for destination|^destination topic '' refused the record",
    ),
    (MISSING_FIELD, r"^(missing|empty) "),
    (BAD_MAX_LATENESS, r"max-lateness"),
    (BAD_CRON, r"cron-expr|^unknown time zone|missed-fire-policy|cron-end-at is before"),
    (TOO_LARGE, r"too large|^its value is left out"),
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
