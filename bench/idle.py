"""bench idle: the CPU of a job with nothing to do, then its wake-up lateness.

    kafka-scheduler bench idle [--count 10000] [--duration 60]

A warmed-up job, --count schedules due an hour ahead, committed, 10 s quiet, then the CPU
time (utime + stime from /proc, reaped children included) of the job's whole process tree over
--duration s: `cpu_percent_of_one_core`, per group (JVM, driver Python, Python workers) and per
process (in `details`), and the micro-batches run meanwhile; then 20 requests, one every 5 s,
each due --lead (3) s after sending: wake-up lateness p50/max, early, lost.
"""

from __future__ import annotations

import time

from kafka_scheduler.engine.spark.checkpoint import last_committed_batch
from kafka_scheduler.harness.process_tree import tree_cpu

from .harness import (
    DeliveryReader,
    Environment,
    RequestProducer,
    cpu_between,
    log,
)
from .job_load import ingest_requests, settle_and_count, warmed_up

IDLE_PENDING_AHEAD_MS = 3_600_000  # idle: the pending schedules are due an hour ahead
IDLE_SETTLE_S = 10  # idle: quiet time after the last commit before measuring
IDLE_SAMPLE_S = 5  # idle: CPU timeline resolution
WAKEUPS, WAKEUP_EVERY_S = 20, 5  # idle: then this many requests, one every 5 s, each due --lead s after sending


def idle(env: Environment, args) -> dict:
    """CPU of the whole job (driver Python, JVM, Python workers) with nothing due for an hour and nothing
    arriving, then whether requests sent one by one still wake it up on time."""
    scheduler = warmed_up(env, args)
    requests = f"{scheduler.app_id}-schedule-requests"
    pending_topic = env.topic("idle")
    early_reader = DeliveryReader(env.bootstrap, pending_topic)
    far = int(time.time() * 1000) + IDLE_PENDING_AHEAD_MS
    ingest_requests(env, scheduler, pending_topic, args.count, lambda i: far + i, "idle", args.time_budget)
    log(
        f"{args.count:,} pending an hour ahead, committed; quiet for {IDLE_SETTLE_S}s, "
        f"then measuring CPU for {args.duration:.0f}s"
    )
    time.sleep(IDLE_SETTLE_S)

    pid = scheduler.process.pid
    batch_before = last_committed_batch(scheduler.checkpoint) or 0
    first = previous = tree_cpu(pid)
    started = previous_at = time.monotonic()
    timeline = []
    while (now := time.monotonic()) < started + args.duration:
        time.sleep(min(IDLE_SAMPLE_S, started + args.duration - now))
        sample, at = tree_cpu(pid), time.monotonic()
        timeline.append(cpu_between(previous, sample, at - previous_at)["cpu_percent_of_one_core"])
        previous, previous_at = sample, at
    measured = cpu_between(first, previous, previous_at - started)
    batches = (last_committed_batch(scheduler.checkpoint) or 0) - batch_before
    log(
        f"idle: {measured['cpu_percent_of_one_core']}% of one core, {batches} micro-batches in "
        f"{previous_at - started:.0f}s; now {WAKEUPS} requests, one every {WAKEUP_EVERY_S}s, due {args.lead}s later"
    )

    wake_topic = env.topic("wake-up")
    reader = DeliveryReader(env.bootstrap, wake_topic)
    producer = RequestProducer(env.bootstrap, requests)
    wake_cpu_before, wake_started = tree_cpu(pid), time.monotonic()
    for i in range(WAKEUPS):
        producer.add(wake_topic, int(time.time() * 1000 + args.lead * 1000), f"wake-up-{i}")
        producer.flush()
        send_next = time.time() + WAKEUP_EVERY_S
        while time.time() < send_next:
            reader.poll(0.2)
    settle_and_count(reader, WAKEUPS, args.lead + 60, "the wake-up deliveries")
    wake_cpu = cpu_between(wake_cpu_before, tree_cpu(pid), time.monotonic() - wake_started)
    early_reader.poll(1.0)
    wake = reader.lateness_figures()
    figures = {
        "cpu_percent_of_one_core": measured["cpu_percent_of_one_core"],
        **{k: v for k, v in measured.items() if k.startswith("cpu_percent_") and k != "cpu_percent_of_one_core"},
        "measured_s": round(previous_at - started, 1),
        "micro_batches_while_idle": batches,
        "pending": args.count,
        "pending_delivered_early": early_reader.count,
        "wakeups_sent": WAKEUPS,
        "wakeups_delivered": wake["delivered"],
        "wakeups_lost": WAKEUPS - reader.count,
        "wakeups_early": wake["early"],
        "wakeups_duplicates": wake["duplicates"],
        "wakeup_lateness_p50_s": wake["lateness_p50_s"],
        "wakeup_lateness_max_s": wake["lateness_max_s"],
        "cpu_percent_during_wakeups": wake_cpu["cpu_percent_of_one_core"],
        "details": {
            "cpu_percent_per_5s": timeline,
            "processes": measured["processes"],
            "ended_processes": measured["ended_processes"],
            "wakeup_lateness_s": sorted(round((a - d) / 1000, 3) for a, d in reader.deliveries),
        },
    }
    reader.close()
    early_reader.close()
    scheduler.stop()
    return figures
