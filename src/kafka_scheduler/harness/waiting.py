"""Waiting on a condition with a deadline (never a bare sleep): how the harness, the tests, the benchmarks and the
crash suite wait for what the job does."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.1,
    guard: Callable[[], None] | None = None,
    progress: Callable[[], str] | None = None,
    every: float = 10.0,
    say: Callable[[str], None] = print,
):
    """Poll ``condition`` until it returns something truthy (returned); TimeoutError naming ``what`` at the deadline.

    ``guard`` (e.g. ``JobProcess.assert_running``) is called before each poll and may fail early; ``progress``
    is said every ``every`` seconds while waiting (long waits of the benchmarks show how far they got)."""
    deadline = time.monotonic() + timeout
    next_report = time.monotonic() + every
    while True:
        if guard is not None:
            guard()
        result = condition()
        if result:
            return result
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if progress is not None and now >= next_report:
            say(f"  waiting for {what}: {progress()}")
            next_report = now + every
        time.sleep(interval)
