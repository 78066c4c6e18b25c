"""The one place that decides which of the engines' lines reach what a person reads: Spark's JVM and Python
workers, librdkafka, py4j. Applied to the output of every command that starts Spark (engine_output.py) and to the
job's log the demo echoes (demo.py).

What the engines print for themselves is, in normal operation, noise: banners of Spark's Python workers, JVM
warnings, librdkafka's refused-connect retries, py4j's tracebacks when a stop interrupts a call. Errors are kept:
a log4j ERROR line, a line of ours, anything not known to be noise. ``KAFKA_SCHEDULER_LOG_LEVEL=DEBUG`` shows all.
"""

from __future__ import annotations

import logging
import re

# The first line of something printed: one of our log records (``HH:MM:SS LEVEL``), a log4j record
# (``HH:MM:SS LEVEL Class:``), a librdkafka log line, a JVM launcher warning, a Python worker banner, or what a JVM or
# a Python process prints when it dies (an uncaught exception of a JVM thread, -XX:+ExitOnOutOfMemoryError, a fatal
# Python error). Any other line continues the record above it (a stack trace, a multi-line message, a blank line).
_RECORD_START = re.compile(
    r"^(\d\d:\d\d:\d\d \w|%\d\||WARNING: |(Starting )?Streaming TransformWithState"
    r"|Exception in thread |Terminating due to |Fatal Python error)"
)

# Noise, as (the first line of a record, whether the record goes on over more lines).
_NOISE = [
    (re.compile(pattern), multi_line)
    for pattern, multi_line in (
        # log4j below ERROR (our own records say INFO with two spaces, WARNING in full: they never match).
        (r"^\d\d:\d\d:\d\d (WARN|INFO|DEBUG|TRACE) [\w$.-]+: ", True),
        # The JVM launcher: "WARNING: Using incubator modules: jdk.incubator.vector" and its kin.
        (r"^WARNING: ", False),
        # Spark's Python workers print a banner for every stage of every stateful UDF run (a line, then a blank one).
        (r"^(Starting )?Streaming TransformWithState\w* Python worker", False),
        # librdkafka: retries of a refused or dropped connection, and anything below error.
        (r"^%[3-7]\|[\d.]+\|(FAIL|CONNECT|BROKERFAIL|DISCONNECT|REQTMOUT)\|", False),
        (r"^%[4-7]\|", False),
        # py4j, when a stop interrupts a call in flight; the scheduler says itself how it stopped.
        (r"^\d\d:\d\d:\d\d ERROR (\w+ )?\w+ while (sending command|receiving)", True),
    )
]


class EngineNoiseFilter:
    """Judges the lines of a process's output one by one: ``shows(line)`` is False for engine noise, including
    the lines that continue a noisy record (its stack trace; only blank ones after a one-line record, so a line
    nothing is known of is shown)."""

    def __init__(self, everything: bool = False):
        self.everything = everything
        self._in_noise = False
        self._multi_line = False

    def shows(self, line: str) -> bool:
        if self.everything:
            return True
        if _RECORD_START.match(line):
            noise = next((multi_line for pattern, multi_line in _NOISE if pattern.match(line)), None)
            self._in_noise, self._multi_line = noise is not None, bool(noise)
        elif self._in_noise and not self._multi_line and line.strip():
            self._in_noise = False  # not a continuation of a one-line record: a line of its own, unknown
        return not self._in_noise


def debug_enabled() -> bool:
    return logging.getLogger().isEnabledFor(logging.DEBUG)
