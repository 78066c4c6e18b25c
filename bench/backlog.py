"""bench backlog: ordinary schedules while a backlog of far-off ones is being accepted.

    kafka-scheduler bench backlog [--count 1000000] [--ordinary-rate 200] [--after 40] [--cancels-keyed-apart]

Ordinary schedules arrive at --ordinary-rate per second with ids, due 3 s and 30 s after they are sent (in turn);
every 10th of each lead is cancelled 1 s after it was sent (keyed like it, or apart from it with
--cancels-keyed-apart): bench/ordinary.py. After BEFORE_S seconds of that alone, --count schedules with ids due a
month ahead are produced as fast as one producer can (another thread), and the ordinary traffic goes on until --after
seconds past the moment the job has committed the whole backlog.

Figures for the ordinary schedules per lead and per window of when they were sent: "before" the backlog, "during"
(from its first request to its last one committed) and "after": lateness p50/p99/max (broker append time - due time),
early, lost, cancels sent and cancelled schedules delivered anyway. The backlog's producer and acceptance rates; the
job's batch durations per window of when they were logged, and the longest batch; the most its read of the inputs as
they arrive was behind per window (kafka_scheduler_early_read_behind_seconds, sampled every 0.5 s: a CANCEL read
later than its schedule's due time loses to it).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import urllib.request

from kafka_scheduler.kafka.local_broker import free_port

from .harness import Environment, log
from .job_load import FAR_FUTURE_MS, ingest_requests, warmed_up
from .ordinary import CANCEL_AFTER_S, CANCEL_EVERY, OrdinaryReader, OrdinaryTraffic, batch_figures, lateness_figures

LEADS_S = (3.0, 30.0)  # the ordinary schedules' leads, taken in turn
BEFORE_S = 20.0  # ordinary traffic alone before the backlog starts
WINDOWS = ("before", "during", "after")
BEHIND_METRIC = b"kafka_scheduler_early_read_behind_seconds "
BEHIND_EVERY_S = 0.5


class Backlog(threading.Thread):
    """Produces the backlog and waits until the job has committed it (``ingest_requests``), beside the ordinary
    traffic."""

    def __init__(self, env: Environment, scheduler, destination: str, count: int, time_budget: float):
        super().__init__(name="backlog", daemon=True)
        self.args = (env, scheduler, destination, count)
        self.time_budget = time_budget
        self.started_at: float | None = None
        self.accepted_at: float | None = None
        self.figures: dict = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        env, scheduler, destination, count = self.args
        self.started_at = time.time()
        due_ms = int(self.started_at * 1000) + FAR_FUTURE_MS
        try:
            self.figures = ingest_requests(
                env, scheduler, destination, count, lambda i: due_ms, "backlog", self.time_budget
            )
        except BaseException as exc:  # handed to the main thread, which stops the run
            self.error = exc
        self.accepted_at = time.time()


class BehindSampler(threading.Thread):
    """Every BEHIND_EVERY_S, how far the job's read of its inputs as they arrive is behind (its metric), as (when,
    seconds)."""

    def __init__(self, port: int):
        super().__init__(name="behind-sampler", daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(BEHIND_EVERY_S):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    body = answer.read()
            except OSError:
                continue
            for line in body.splitlines():
                if line.startswith(BEHIND_METRIC):
                    self.samples.append((time.time(), float(line[len(BEHIND_METRIC) :])))

    def figures(self, window_of) -> dict:
        per_window: dict[str, list[float]] = {w: [] for w in WINDOWS}
        for at, seconds in self.samples:
            per_window[window_of(at)].append(seconds)
        return {w: round(max(values), 2) if values else None for w, values in per_window.items()}


def backlog(env: Environment, args) -> dict:
    load_at_start = os.getloadavg()
    port = free_port()
    scheduler = warmed_up(
        env, argparse.Namespace(**{**vars(args), "scheduler_args": (*args.scheduler_args, "--metrics-port", str(port))})
    )
    behind = BehindSampler(port)
    behind.start()
    requests = f"{scheduler.app_id}-schedule-requests"
    ordinary_topic = env.topic("ordinary")
    log(
        f"backlog: ordinary schedules at {args.ordinary_rate:g}/s, due {' or '.join(f'{s:g}s' for s in LEADS_S)} "
        f"after sending, every {CANCEL_EVERY}th of each cancelled {CANCEL_AFTER_S:g}s after sending; after "
        f"{BEFORE_S:g}s, {args.count:,} schedules due a month ahead as fast as one producer sends them; then "
        f"{args.after:g}s more"
    )
    reader = OrdinaryReader(env.bootstrap, ordinary_topic)
    traffic = OrdinaryTraffic(
        env.bootstrap, requests, ordinary_topic, args.ordinary_rate, LEADS_S, args.cancels_keyed_apart
    )
    bulk = Backlog(env, scheduler, env.topic("backlog", partitions=4), args.count, args.time_budget)
    started = time.time()
    next_check = 0.0
    while True:
        now = time.time()
        if not bulk.is_alive() and bulk.started_at is None and now >= started + BEFORE_S:
            bulk.start()
            log("backlog: production starts")
        if now >= next_check:
            next_check = now + 0.5
            scheduler.assert_running()
            if bulk.error is not None:
                raise RuntimeError(f"the backlog failed: {bulk.error}") from bulk.error
        if bulk.accepted_at is not None and now >= bulk.accepted_at + args.after:
            break
        if now >= started + args.time_budget:
            log(f"  the backlog was not accepted within --time-budget {args.time_budget:.0f}s")
            break
        wait = traffic.pace(now)
        reader.poll(0)
        time.sleep(min(0.002, max(0.0, wait)))
    traffic.finish()
    traffic.wait_for_kept(reader, max(LEADS_S) + 120)
    behind.stopped.set()

    backlog_from = bulk.started_at or float("inf")
    backlog_until = bulk.accepted_at or float("inf")

    def window_of(sent_at: float) -> str:
        if sent_at < backlog_from:
            return "before"
        return "during" if sent_at <= backlog_until else "after"

    delivered = {key: (appended, due) for key, appended, due in reader.rows}
    lead_of = {key: round(due / 1000 - traffic.sent_at[key]) for key, due in traffic.sent.items()}
    figures: dict = {
        "backlog": {"count": args.count, **bulk.figures},
        "ordinary": {
            f"lead_{lead:g}s": {
                window: lateness_figures(
                    (
                        key
                        for key, sent_at in traffic.sent_at.items()
                        if lead_of[key] == round(lead) and window_of(sent_at) == window
                    ),
                    traffic.cancelled,
                    delivered,
                )
                for window in WINDOWS
            }
            for lead in LEADS_S
        },
        "ordinary_duplicates": reader.duplicates,
        "early_read_behind_max_s": behind.figures(window_of),
    }
    figures["batches"], longest = batch_figures(scheduler.follower.snapshot(), started, window_of, WINDOWS)
    if longest:
        longest["logged_after_backlog_start_s"] = round(longest.pop("seen") - backlog_from, 1)
    figures["longest_batch"] = longest
    figures["load_average_at_start"] = [round(x, 1) for x in load_at_start]
    figures["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
    reader.close()
    scheduler.stop()
    figures["met"] = targets_met(figures)
    return figures


def targets_met(figures: dict) -> dict:
    """Issue 44's backlog target, each part: for both leads, sent during the backlog and after it, lateness p99 <= 1
    s, 0 early, 0 lost and no cancelled schedule delivered."""
    return {
        f"{lead}_{window}": (
            o["lateness_p99_s"] is not None
            and o["lateness_p99_s"] <= 1.0
            and not o["early"]
            and not o["lost"]
            and not o["cancelled_delivered"]
        )
        for lead, windows in figures["ordinary"].items()
        for window, o in windows.items()
        if window != "before"
    }
