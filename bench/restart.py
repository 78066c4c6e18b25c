"""bench restart: the time to the first overdue delivery after a restart, and its start-up steps.

    kafka-scheduler bench restart --count 1000000

--count pending far ahead and one due 15 s later; stop the job, let that one fall due,
start it again: first overdue delivery after process start, and the start-up steps as the log
lines appeared (`spark: starting`, `running:`, `first batch done`) and the JVM process showed.
"""

from __future__ import annotations

import time

from kafka_scheduler.harness.process_tree import jvm_running

from .harness import (
    DeliveryReader,
    Environment,
    RequestProducer,
    log,
    wait_until,
)
from .job_load import FAR_FUTURE_MS, ingest_requests


def restart(env: Environment, args) -> dict:
    scheduler = env.scheduler(extra_args=args.scheduler_args).start()
    destination = env.topic("restart")
    reader = DeliveryReader(env.bootstrap, destination)
    far = int(time.time() * 1000) + FAR_FUTURE_MS
    ingest_requests(
        env, scheduler, destination, args.count, lambda i: far + i, "restart", args.time_budget, args.no_ids
    )
    overdue_due = int(time.time() * 1000) + 15_000
    producer = RequestProducer(env.bootstrap, f"{scheduler.app_id}-schedule-requests")
    producer.add(destination, overdue_due, "restart-overdue")
    producer.flush()
    requests = f"{scheduler.app_id}-schedule-requests"
    wait_until(lambda: scheduler.committed(requests) >= env.end_offsets(requests), 120, "the overdue request")
    log("stopping the scheduler")
    scheduler.stop()
    wait_until(lambda: time.time() * 1000 > overdue_due + 1000, 60, "the schedule to fall due while stopped")
    log("starting it again")
    scheduler.start(wait=False)
    jvm_seen: list[float] = []

    def delivered() -> bool:
        if not jvm_seen and jvm_running(scheduler.process.pid):
            jvm_seen.append(time.time())
        return reader.poll() >= 1

    wait_until(
        delivered,
        args.time_budget,
        "the overdue delivery",
        progress=lambda: "restoring" if "first batch" not in scheduler.log() else "first batch done",
    )
    first_delivery = reader.deliveries[0][0] / 1000
    figures = {
        "start_to_first_overdue_delivery_s": round(first_delivery - scheduler.started_at, 2),
        "pending_at_restart": args.count + 1,
    }
    figures.update(_startup_breakdown(scheduler, jvm_seen[0] if jvm_seen else None, first_delivery))
    reader.close()
    scheduler.stop()
    return figures


STARTUP_LINES = (
    ("spark_starting", r"spark: starting"),
    ("running", r"running: reading"),
    ("first_batch_done", r"first batch done ([\d.]+)s after start"),
)


def _startup_breakdown(scheduler, jvm_seen: float | None, first_delivery: float) -> dict:
    """Seconds from process start to each milestone, as the bench saw the log lines appear (the log's own
    timestamps are whole seconds), and the steps between them. The JVM milestone is when a java process
    first showed in the job's process tree (polled with the delivery, every 0.2 s)."""
    started = scheduler.started_at
    seen = {"jvm_process": jvm_seen}
    for name, pattern in STARTUP_LINES:
        found = scheduler.first(pattern)
        seen[name] = found[0] if found else None
    seen["first_overdue_delivery"] = first_delivery
    figures = {f"startup_{name}_s": round(at - started, 2) if at else None for name, at in seen.items()}
    logged = scheduler.first(STARTUP_LINES[-1][1])
    # The job's own clock starts when its Scheduler object is made, after imports and argument parsing.
    figures["first_batch_done_as_logged_s"] = float(logged[1].group(1)) if logged else None
    steps, previous = {}, ("process_start", started)
    for name in ("spark_starting", "jvm_process", "running", "first_batch_done", "first_overdue_delivery"):
        if seen[name] is not None:
            steps[f"{previous[0]}->{name}"] = round(seen[name] - previous[1], 2)
            previous = (name, seen[name])
    figures["startup_steps_s"] = steps
    return figures
