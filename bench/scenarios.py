"""The benchmark scenarios. Each runs against a broker and the real `kafka-scheduler run` job,
prints its figures and appends a JSON result to bench/results/.

    kafka-scheduler bench steady --rate 1000 --duration 60
    kafka-scheduler bench ingest --count 1000000
    kafka-scheduler bench herd --count 1000000
    kafka-scheduler bench pending --count 10000000
    kafka-scheduler bench restart --count 1000000
    make bench            # all five with the issue's target sizes
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from .harness import DeliveryReader, Environment, RequestProducer, directory_bytes, log, wait_until, write_result

FAR_FUTURE_MS = 30 * 86_400_000  # "due far in the future": a month ahead


def _ids(prefix: str, count: int):
    return (f"{prefix}-{i}" for i in range(count))


def _ingest(env: Environment, scheduler, destination: str, count: int, due_ms: Callable[[int], int],
            prefix: str, time_budget: float, no_ids: bool = False) -> dict:
    """Produce ``count`` ADDs as fast as possible and wait until the scheduler has committed them all.

    Returns the producer rate and the scheduler's sustained acceptance rate (10%..90% of the
    committed offsets, which excludes start-up and the last partial batch).
    """
    requests = f"{scheduler.app_id}-schedule-requests"
    base = scheduler.committed(requests)
    producer = RequestProducer(env.bootstrap, requests)
    progress_points: list[tuple[float, int]] = []
    started = time.time()
    log(f"producing {count:,} requests" + (" without request ids" if no_ids else " with unique request ids"))
    for i, request_id in enumerate(_ids(prefix, count)):
        producer.add(destination, due_ms(i), None if no_ids else request_id)
        if i % 100_000 == 99_999:
            scheduler.sample_memory()
    producer.flush()
    produced_s = time.time() - started
    log(f"produced {count:,} in {produced_s:.1f}s ({count / produced_s:,.0f}/s); waiting for the scheduler")

    def progress() -> str:
        done = scheduler.committed(requests) - base
        return f"{done:,} of {count:,} committed ({done / max(1e-9, time.time() - started):,.0f}/s so far)"

    def committed_all() -> bool:
        done = scheduler.committed(requests) - base
        if done and (not progress_points or done > progress_points[-1][1]):
            progress_points.append((time.time(), done))
        scheduler.sample_memory()
        return done >= count

    wait_until(committed_all, time_budget, "the requests to be committed", interval=0.2, progress=progress)
    finished = time.time()
    # Between the first and the last commit: the scheduler's own pace, without the wait for the first batch.
    (t0, n0), (t1, n1) = progress_points[0], progress_points[-1]
    sustained = (n1 - n0) / (t1 - t0) if t1 > t0 else None
    return {"produced_per_s": round(count / produced_s), "accepted_per_s_overall": round(count / (finished - started)),
            "accepted_per_s_between_commits": round(sustained) if sustained else None,
            "commits_observed": len(progress_points), "ingest_seconds": round(finished - started, 1)}


def _warmed_up(env: Environment, args):
    """A started scheduler that has already delivered something: the first batches with data are slow
    (Python workers start, code paths warm up), and the figures should show the steady state."""
    scheduler = env.scheduler(extra_args=args.scheduler_args).start()
    warm_topic = env.topic("warm-up", partitions=1)
    reader = DeliveryReader(env.bootstrap, warm_topic)
    producer = RequestProducer(env.bootstrap, f"{scheduler.app_id}-schedule-requests")
    for round_number in range(3):
        now = int(time.time() * 1000)
        for i in range(100):
            producer.add(warm_topic, now + 500, f"warm-up-{round_number}-{i}")
            producer.add(warm_topic, now + 500, None)
        producer.flush()
        wait_until(lambda: reader.poll() >= 200 * (round_number + 1), 300, "the warm-up deliveries")
    reader.close()
    log("scheduler warmed up")
    return scheduler


def steady(env: Environment, args) -> dict:
    scheduler = _warmed_up(env, args)
    destination = env.topic("steady")
    reader = DeliveryReader(env.bootstrap, destination)
    producer = RequestProducer(env.bootstrap, f"{scheduler.app_id}-schedule-requests")
    total = int(args.rate * args.duration)
    log(f"steady: {args.rate}/s for {args.duration}s, each due {args.lead}s after it is sent")
    started = time.time()
    for i, request_id in enumerate(_ids("steady", total)):
        target = started + i / args.rate
        while time.time() < target:
            reader.poll(0)
            time.sleep(min(0.002, max(0.0, target - time.time())))
        producer.add(destination, int(time.time() * 1000 + args.lead * 1000), request_id)
        if i % max(1, int(args.rate)) == 0:
            producer.producer.poll(0)
            scheduler.sample_memory()
    producer.flush()
    wait_until(lambda: reader.poll() >= total, args.lead + 120, "all deliveries",
               progress=lambda: f"{len(reader.deliveries):,} of {total:,}")
    appended = sorted(a for a, _ in reader.deliveries)
    figures = reader.lateness_figures()
    figures["deliveries_per_s"] = round((len(appended) - 1) / max(1e-9, (appended[-1] - appended[0]) / 1000))
    reader.close()
    scheduler.stop()
    return figures


def ingest(env: Environment, args) -> dict:
    scheduler = _warmed_up(env, args)
    destination = env.topic("ingest")
    far = int(time.time() * 1000) + FAR_FUTURE_MS
    figures = _ingest(env, scheduler, destination, args.count, lambda i: far + i, "ingest", args.time_budget,
                      args.no_ids)
    scheduler.stop()
    return figures


def herd(env: Environment, args) -> dict:
    scheduler = _warmed_up(env, args)
    destination = env.topic("herd", partitions=4)
    reader = DeliveryReader(env.bootstrap, destination)
    due = int(time.time() * 1000 + args.lead * 1000)
    ingest_figures = _ingest(env, scheduler, destination, args.count, lambda i: due, "herd", args.lead, args.no_ids)
    if time.time() * 1000 > due:
        raise RuntimeError("ingest took longer than --lead: the herd was not all pending at its due instant")
    log(f"all {args.count:,} pending; due in {(due - time.time() * 1000) / 1000:.1f}s")
    wait_until(lambda: reader.poll(0.5) >= args.count, args.lead + args.time_budget, "the herd to be delivered",
               interval=0, progress=lambda: f"{len(reader.deliveries):,} of {args.count:,}")
    appended = sorted(a for a, _ in reader.deliveries)
    figures = reader.lateness_figures()
    figures.update({"due_to_last_delivery_s": round((appended[-1] - due) / 1000, 2),
                    "due_to_first_delivery_s": round((appended[0] - due) / 1000, 2),
                    "deliveries_per_s": round(len(appended) / max(1e-9, (appended[-1] - appended[0]) / 1000)),
                    "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"]})
    reader.close()
    scheduler.stop()
    return figures


def pending(env: Environment, args) -> dict:
    scheduler = env.scheduler(extra_args=args.scheduler_args).start()
    destination = env.topic("pending")
    far = int(time.time() * 1000) + FAR_FUTURE_MS
    ingest_figures = _ingest(env, scheduler, destination, args.count, lambda i: far + i, "pending", args.time_budget,
                             args.no_ids)
    log("sampling memory for 20 s more (idle batches, RocksDB flushes)")
    settle_until = time.time() + 20
    wait_until(lambda: scheduler.sample_memory() is not None and time.time() > settle_until, 60, "settling",
               interval=1)
    peak = scheduler.peak_rss
    checkpoint_bytes = directory_bytes(scheduler.checkpoint)
    scheduler.stop()
    return {"peak_rss_total_mib": round(sum(peak.values()) / 2**20),
            **{f"peak_rss_{k}_mib": round(v / 2**20) for k, v in peak.items()},
            "checkpoint_bytes_per_pending": round(checkpoint_bytes / args.count, 1),
            "checkpoint_mib": round(checkpoint_bytes / 2**20, 1),
            "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"]}


def restart(env: Environment, args) -> dict:
    scheduler = env.scheduler(extra_args=args.scheduler_args).start()
    destination = env.topic("restart")
    reader = DeliveryReader(env.bootstrap, destination)
    far = int(time.time() * 1000) + FAR_FUTURE_MS
    _ingest(env, scheduler, destination, args.count, lambda i: far + i, "restart", args.time_budget, args.no_ids)
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
    wait_until(lambda: reader.poll() >= 1, args.time_budget, "the overdue delivery",
               progress=lambda: "restoring" if "first batch" not in scheduler.log() else "first batch done")
    first_delivery = reader.deliveries[0][0] / 1000
    figures = {"start_to_first_overdue_delivery_s": round(first_delivery - scheduler.started_at, 2),
               "pending_at_restart": args.count + 1}
    reader.close()
    scheduler.stop()
    return figures


SCENARIOS = {"steady": steady, "ingest": ingest, "herd": herd, "pending": pending, "restart": restart}

# The target sizes, as a single scenario runs them by default.
TARGETS = {
    "steady": {"rate": 1000, "duration": 60},
    "ingest": {"count": 1_000_000},
    "herd": {"count": 1_000_000},
    "pending": {"count": 10_000_000},
    "restart": {"count": 1_000_000},
}

# What `make bench` (scenario "all") runs: every target, with and without the tuning that matters.
PLAN = [
    ("steady", {"scheduler_args": ("--lookahead=1500ms",)}),
    ("steady", {}),
    ("ingest", {}),
    ("ingest", {"no_ids": True}),
    ("herd", {"no_ids": True}),
    ("pending", {"no_ids": True}),
    ("restart", {"no_ids": True}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"], help="which scenario ('all' = make bench)")
    parser.add_argument("--rate", type=float, default=1000, help="steady: schedules per second (default 1000)")
    parser.add_argument("--duration", type=float, default=60, help="steady: seconds of load (default 60)")
    parser.add_argument("--lead", type=float, default=None,
                        help="steady: due this many seconds after sending (default 3); herd: the instant all are "
                             "due, in seconds from the start of ingest (default: enough to ingest them first)")
    parser.add_argument("--count", type=int, default=None, help="ingest/herd/pending/restart: number of schedules")
    parser.add_argument("--no-ids", action="store_true",
                        help="send ADDs without request ids (they cannot be replaced; they skip the id index)")
    parser.add_argument("--time-budget", type=float, default=1800,
                        help="give up waiting after this many seconds (default 1800)")
    parser.add_argument("--bootstrap-servers", default=None,
                        help="use this broker instead of starting a local one")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (broker data, checkpoints, logs)")
    parser.add_argument("--scheduler-arg", dest="scheduler_args", action="append", default=[],
                        help="extra argument for `kafka-scheduler run`, e.g. --scheduler-arg=--partitions=4")


def run_one(name: str, args: argparse.Namespace, overrides: Optional[dict] = None) -> dict:
    defaults = TARGETS[name]
    scenario_args = argparse.Namespace(**vars(args))
    scenario_args.scheduler_args = tuple(args.scheduler_args)
    for key, value in (overrides or {}).items():
        setattr(scenario_args, key, value)
    if scenario_args.count is None:
        scenario_args.count = defaults.get("count", 0)
    if name == "steady":
        scenario_args.lead = 3.0 if args.lead is None else args.lead
    elif name == "herd" and args.lead is None:
        scenario_args.lead = 30 + scenario_args.count / 8000  # time to ingest them all first
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    log(f"{name}: work folder {workdir}")
    env = Environment(workdir, args.bootstrap_servers)
    try:
        figures = SCENARIOS[name](env, scenario_args)
    finally:
        env.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    log(f"{name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    parameters = {k: v for k, v in vars(scenario_args).items()
                  if k not in ("scenario", "keep", "bootstrap_servers", "command", "handler")
                  and isinstance(v, (int, float, str, bool, type(None)))}
    parameters["scheduler_args"] = list(scenario_args.scheduler_args)
    path = write_result(name, parameters, figures)
    log(f"{name}: written to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return figures


def main(args: argparse.Namespace) -> int:
    plan = PLAN if args.scenario == "all" else [(args.scenario, {})]
    results = []
    for name, overrides in plan:
        label = name + "".join(f" {k}={v}" for k, v in overrides.items())
        try:
            results.append((label, run_one(name, args, overrides)))
        except (TimeoutError, RuntimeError) as exc:
            log(f"{label}: FAILED: {exc}")
            results.append((label, {"error": str(exc)}))
            write_result(name, {"count": args.count, **{k: str(v) for k, v in overrides.items()}}, {"error": str(exc)})
    print()
    for label, figures in results:
        print(f"{label}\n    " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    return 0 if all("error" not in f for _, f in results) else 1
