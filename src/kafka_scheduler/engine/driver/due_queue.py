"""What the driver's writers share (the timed writer, the herd writer, the wake-ups): work queued by due time under
one lock and done by a thread of their own at its instant, a graceful stop's bound, and batches that wait for what is
due by their time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# A writer's pause before it tries a failed write again.
RETRY_PAUSE_S = 1.0


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_until_due(
    cond: threading.Condition,
    closed: Callable[[], bool],
    next_due_ms: Callable[[], int | None],
    take_due: Callable[[int], list],
) -> list | None:
    """With ``cond`` held: wait until ``take_due(now)`` takes something, and return it; None once closed. Waits
    until the next due instant (at most 1 s: ``add``/``hold`` notify, but a clock may jump)."""
    while not closed():
        now = now_ms()
        taken = take_due(now)
        if taken:
            return taken
        due = next_due_ms()
        cond.wait(max(0.0005, min((due - now) / 1000 if due is not None else 1.0, 1.0)))
    return None


class DueQueue:
    """The base of the timed writer and the herd writer (herd_writer.py): what is queued by due time is written by a
    thread of their own. A subclass names the earliest due time still queued (``_earliest_queued``) and sets
    ``_writing`` while it writes, ``failure`` when it cannot go on."""

    def __init__(self):
        self.failure: BaseException | None = None  # set when the writer cannot go on: batches then fail
        self._cond = threading.Condition()
        self._writing: int | None = None  # while writing: the due time it is compared with a batch's time by
        self._through: int | None = None  # while a graceful stop is under way: nothing due after this is written

    def _earliest_queued(self) -> int | None:
        """Called with the lock held: the earliest due time still queued, if any."""
        raise NotImplementedError

    def wait_written(self, up_to_ms: int, timeout: float = 300.0) -> bool:
        """Until everything queued or being written that may be due by ``up_to_ms`` is written and acknowledged: a
        batch that retires prepared schedules from state must not commit before that."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.failure is not None:
                    return False
                queued = self._earliest_queued()
                pending = queued is not None and queued <= up_to_ms
                busy = self._writing is not None and self._writing <= up_to_ms
                if not pending and not busy:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))

    def write_through(self, up_to_ms: int) -> None:
        """From now on write nothing due after ``up_to_ms`` (a graceful stop: what the next run emits again must
        not have been written). Called again with a later instant, it writes what is due up to that one."""
        with self._cond:
            self._through = up_to_ms if self._through is None else max(self._through, up_to_ms)
            self._cond.notify_all()
