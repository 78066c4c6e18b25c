"""How the text of an option (a flag, a KAFKA_SCHEDULER_* variable, a key of the --config file) is read: the
parsers of config.py's OPTIONS. Each raises ValueError with what it expected."""

from __future__ import annotations

import re
from collections.abc import Callable

from .protocol import DIALECT_NAMES

_TRIGGER = re.compile(r"^\s*(\d+(\.\d+)?)\s*(ms|milliseconds?|s|seconds?|m|minutes?)\s*$", re.I)


def bool_value(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return value


_UNIT_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
}


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"must be a port number from 0 to 65535, got {text!r}")
    return value


def niceness(text: str) -> int:
    """A Unix nice value a process may give itself without privileges: 0 (the caller's own priority) to 19."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ValueError(f"must be a nice value from 0 to 19, got {text!r}")
    return value


def duration_ms(text: str) -> int:
    match = _TRIGGER.match(text)
    if not match:
        raise ValueError(f"expected a duration such as '0s', '250ms' or '1 second', got {text!r}")
    return int(float(match.group(1)) * _UNIT_MS[match.group(3).lower()])


def interval_ms(text: str) -> int:
    """A duration of at least one second (crons fire on whole seconds)."""
    value = duration_ms(text)
    if value < 1000:
        raise ValueError(f"expected a duration of at least 1s, got {text!r}")
    return value


def trigger_interval(text: str) -> str:
    return f"{duration_ms(text)} milliseconds"


def format_duration_ms(ms: int) -> str:
    """A duration as a user writes it, and as the duration options read it back: whole seconds as '3s', any other
    as '250ms'."""
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def one_of(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return text

    return parse


def regex(text: str) -> str:
    re.compile(text)
    return text


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def input_list(text: str) -> tuple[tuple[str, str], ...]:
    """``TOPIC:DIALECT[,TOPIC:DIALECT...]`` (a repeated --input arrives joined by commas)."""
    inputs: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        topic, sep, dialect = item.rpartition(":")
        if not sep or not topic:
            raise ValueError(f"expected TOPIC:DIALECT, got {item!r} (dialects: {', '.join(DIALECT_NAMES)})")
        if not _TOPIC.match(topic) or topic in (".", ".."):
            raise ValueError(f"{topic!r} is not a valid Kafka topic name")
        if dialect not in DIALECT_NAMES:
            raise ValueError(
                f"unknown dialect {dialect!r} for topic {topic!r} (expected one of {', '.join(DIALECT_NAMES)})"
            )
        if inputs.get(topic, dialect) != dialect:
            raise ValueError(f"topic {topic!r} is given twice, as {inputs[topic]} and as {dialect}")
        inputs[topic] = dialect
    if not inputs:
        raise ValueError("expected at least one TOPIC:DIALECT")
    return tuple(inputs.items())
