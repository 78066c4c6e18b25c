"""Keeping the engines' chatter out of what a person reads of the job's output: Spark's JVM and Python workers,
librdkafka, py4j.

What the engines print for themselves is, in normal operation, noise: banners of Spark's Python workers, JVM
warnings, librdkafka's refused-connect retries, py4j's tracebacks when a stop interrupts a call. Errors are kept:
a log4j ERROR line, a line of ours, anything not known to be noise. ``KAFKA_SCHEDULER_LOG_LEVEL=DEBUG`` shows all.
"""

from __future__ import annotations

import logging
import re

# The first line of something printed: one of our log records (``HH:MM:SS LEVEL``), a log4j record
# (``HH:MM:SS LEVEL Class:``), a librdkafka log line, a JVM launcher warning or a Python worker banner.
# Any other line continues the record above it (a stack trace, a multi-line message, a blank line).
_RECORD_START = re.compile(r"^(\d\d:\d\d:\d\d \w|%\d\||WARNING: |(Starting )?Streaming TransformWithState)")

_NOISE = [
    re.compile(pattern)
    for pattern in (
        # log4j below ERROR (our own records say INFO with two spaces, WARNING in full: they never match).
        r"^\d\d:\d\d:\d\d (WARN|INFO|DEBUG|TRACE) [\w$.-]+: ",
        # The JVM launcher: "WARNING: Using incubator modules: jdk.incubator.vector" and its kin.
        r"^WARNING: ",
        # Spark's Python workers print a banner for every stage of every stateful UDF run.
        r"^(Starting )?Streaming TransformWithState\w* Python worker",
        # librdkafka: retries of a refused or dropped connection, and anything below error.
        r"^%[3-7]\|[\d.]+\|(FAIL|CONNECT|BROKERFAIL|DISCONNECT|REQTMOUT)\|",
        r"^%[4-7]\|",
        # py4j, when a stop interrupts a call in flight; the scheduler says itself how it stopped.
        r"^\d\d:\d\d:\d\d ERROR (\w+ )?\w+ while (sending command|receiving)",
    )
]


class EngineNoiseFilter:
    """Judges the lines of a process's output one by one: ``shows(line)`` is False for engine noise, including
    the lines that continue a noisy record (its stack trace)."""

    def __init__(self, everything: bool = False):
        self.everything = everything
        self._in_noise = False

    def shows(self, line: str) -> bool:
        if self.everything:
            return True
        if _RECORD_START.match(line):
            self._in_noise = any(pattern.match(line) for pattern in _NOISE)
        return not self._in_noise


def debug_enabled() -> bool:
    return logging.getLogger().isEnabledFor(logging.DEBUG)
