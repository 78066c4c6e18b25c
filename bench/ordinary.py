"""Ordinary traffic beside bulk work, as `bench mixed` (a herd) and `bench backlog` (a backlog being accepted) send
it: schedules with ids at a steady rate, each due a lead after it is sent, every CANCEL_EVERY-th of each lead
cancelled CANCEL_AFTER_S after it was sent; what reaches the destination, and the figures per window."""

from __future__ import annotations

import argparse
import heapq
import re
import time
from collections.abc import Callable, Iterable

from .harness import DUE_HEADER, DeliveryReader, RequestProducer, log, percentile, wait_until

CANCEL_EVERY = 10  # every 10th ordinary schedule (of each lead) is cancelled ...
CANCEL_AFTER_S = 1.0  # ... this long after it was sent
BATCH_LINE = re.compile(r"batch (\d+): .*\[state ([\d.]+)s, write ([\d.]+)s\]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ordinary-rate",
        type=float,
        default=200,
        help="mixed, backlog: ordinary schedules per second alongside the bulk work (default 200)",
    )
    parser.add_argument(
        "--after",
        type=float,
        default=None,
        help="mixed, backlog: seconds of ordinary traffic after the herd's last delivery (mixed, default 30) or "
        "after the backlog is accepted (backlog, default 40)",
    )
    parser.add_argument(
        "--cancels-keyed-apart",
        action="store_true",
        help="mixed, backlog: key each CANCEL apart from its schedule (the id plus a suffix), so most go to another "
        "partition of the requests topic, as from a producer that sends CANCELs as headers only",
    )


class OrdinaryReader(DeliveryReader):
    """Keeps (key, broker append time, due time) of each ordinary delivery, and counts copies."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(bootstrap, topic)
        self.rows: list[tuple[bytes, int, int]] = []

    def take(self, message) -> None:
        due = delivery_id = None
        for name, value in message.headers() or []:
            if name == DUE_HEADER:
                due = int(value)
            elif name == "x-scheduler-delivery-id":
                delivery_id = value
        if delivery_id in self.delivery_ids:
            self.duplicates += 1
            return
        self.delivery_ids.add(delivery_id)
        self.rows.append((message.key(), message.timestamp()[1], due))


class OrdinaryTraffic:
    """Sends ordinary schedules at ``rate`` per second from the first ``pace`` call, the leads taken in turn; the
    i-th is ``ordinary-<i>``, keyed by its id. A CANCEL is keyed like its schedule, or apart from it
    (``keyed_apart``: to another partition most likely, as a producer that sends CANCELs as headers only does)."""

    def __init__(
        self,
        bootstrap: str,
        requests: str,
        destination: str,
        rate: float,
        leads_s: tuple[float, ...],
        keyed_apart: bool = False,
    ):
        self.producer = RequestProducer(bootstrap, requests)
        self.destination = destination
        self.rate = rate
        self.leads_s = leads_s
        self.keyed_apart = keyed_apart
        self.sent: dict[bytes, int] = {}  # key -> due time (ms)
        self.sent_at: dict[bytes, float] = {}  # key -> when it was sent (s)
        self.cancelled: set[bytes] = set()
        self._cancels: list[tuple[float, str]] = []
        self._started: float | None = None
        self._next = 0

    def pace(self, now: float) -> float:
        """Sends what is due by ``now`` (schedules and CANCELs); returns the seconds until the next schedule."""
        if self._started is None:
            self._started = now
        while self._cancels and self._cancels[0][0] <= now:
            self.producer.cancel(heapq.heappop(self._cancels)[1], keyed_apart=self.keyed_apart)
        while self._started + self._next / self.rate <= now:
            self._send(self._next, time.time())
            self._next += 1
        self.producer.producer.poll(0)
        return self._started + self._next / self.rate - time.time()

    def _send(self, i: int, now: float) -> None:
        request_id = f"ordinary-{i}"
        due_ms = int((now + self.leads_s[i % len(self.leads_s)]) * 1000)
        self.producer.add(self.destination, due_ms, request_id)
        key = request_id.encode()
        self.sent[key] = due_ms
        self.sent_at[key] = now
        if (i // len(self.leads_s)) % CANCEL_EVERY == 0:
            heapq.heappush(self._cancels, (now + CANCEL_AFTER_S, request_id))
            self.cancelled.add(key)

    def finish(self) -> None:
        """Sends the last CANCELs, each at its time, and flushes."""
        while self._cancels:
            at, request_id = heapq.heappop(self._cancels)
            time.sleep(max(0.0, at - time.time()))
            self.producer.cancel(request_id, keyed_apart=self.keyed_apart)
        self.producer.flush()

    def wait_for_kept(self, reader: OrdinaryReader, timeout: float) -> None:
        """Waits until every schedule not cancelled has arrived (or ``timeout``), then reads a few seconds more for
        copies and late ones."""
        expected = len(self.sent) - len(self.cancelled)

        def kept_delivered() -> int:
            # Cancelled ones delivered (a cancel read too late) must not count: with 883 of them in a run of
            # 2026-11-29 the wait ended before the last 15 kept ones arrived, and the bench counted them lost.
            reader.poll()
            return sum(1 for key, _, _ in reader.rows if key not in self.cancelled)

        try:
            wait_until(
                lambda: kept_delivered() >= expected,
                timeout,
                "the ordinary deliveries",
                progress=lambda: f"{kept_delivered():,} of {expected:,}",
            )
        except TimeoutError as exc:
            log(f"  {exc}: counting what arrived")
        settle_until = time.time() + 5
        while time.time() < settle_until:
            reader.poll(0.5)


def lateness_figures(keys: Iterable[bytes], cancelled: set[bytes], delivered: dict[bytes, tuple[int, int]]) -> dict:
    """Of ``keys``: lateness of those not cancelled (``delivered``: key -> (append time, due time)), early, lost
    (neither cancelled nor delivered), cancels sent and cancelled ones delivered anyway."""
    keys = list(keys)
    kept = [k for k in keys if k not in cancelled]
    lateness = sorted((delivered[k][0] - delivered[k][1]) / 1000 for k in kept if k in delivered)
    return {
        "sent": len(keys),
        "cancels_sent": len(keys) - len(kept),
        "delivered": len(lateness),
        "lateness_p50_s": round(percentile(lateness, 0.50), 3) if lateness else None,
        "lateness_p99_s": round(percentile(lateness, 0.99), 3) if lateness else None,
        "lateness_max_s": round(lateness[-1], 3) if lateness else None,
        "early": sum(1 for k in keys if k in delivered and delivered[k][0] < delivered[k][1]),
        "lost": sum(1 for k in kept if k not in delivered),
        "cancelled_delivered": sum(1 for k in keys if k in cancelled and k in delivered),
    }


def batch_figures(
    lines: list[tuple[float, str]], since: float, window_of: Callable[[float], str], windows: tuple[str, ...]
) -> tuple[dict, dict]:
    """Durations (state + write) of the job's logged batches per window of when they were logged (``window_of`` the
    time it was seen, from ``since`` on), and the longest."""
    per_window: dict[str, list[float]] = {w: [] for w in windows}
    longest = None
    for seen, line in lines:
        match = BATCH_LINE.search(line)
        if not match or seen < since:
            continue
        seconds = float(match.group(2)) + float(match.group(3))
        per_window[window_of(seen)].append(seconds)
        if longest is None or seconds > longest[0]:
            longest = (seconds, seen, line[line.index("batch ") :])
    figures = {}
    for window, durations in per_window.items():
        durations.sort()
        figures[window] = {
            "batches": len(durations),
            "p50_s": round(percentile(durations, 0.5), 2) if durations else None,
            "p99_s": round(percentile(durations, 0.99), 2) if durations else None,
            "max_s": round(durations[-1], 2) if durations else None,
        }
    if longest is None:
        return figures, {}
    return figures, {"seconds": round(longest[0], 2), "seen": longest[1], "line": longest[2]}
