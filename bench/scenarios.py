"""The benchmark scenarios. Each runs against a broker and the real `kafka-scheduler run` job,
prints its figures and appends a JSON result to bench/results/.

    kafka-scheduler bench steady --rate 1000 --duration 60
    kafka-scheduler bench ingest --count 1000000
    kafka-scheduler bench herd --count 1000000
    kafka-scheduler bench pending --count 10000000
    kafka-scheduler bench restart --count 1000000
    kafka-scheduler bench strikes --count 1000000 --strikes 500000 --wave 5000 [--deliver]
    make bench            # all six with the issue's target sizes

strikes: a replace or cancel of a pending schedule strikes its old version out of its time
bucket (lazy deletion). Phase 1 files --count schedules with request ids, all due at one
instant, so they share one bucket per shard; phase 2 sends --strikes requests on distinct
pending ids, cancels and replaces alternating (a replace keeps the due instant and the
destination with a new value, so it strikes and refiles in the same bucket), in waves of
--wave, each sent once the previous one is committed, so the strikes spread over many
batches while the bucket's struck set grows. Figures: strikes/s overall, over the first
and last 10% of waves and their ratio (about 1 if a strike costs the same however many
came before), per decile, and the scheduler's state time per batch from its log. By
default the bucket is due a month ahead, so nothing fires; --deliver makes it due --lead
seconds after the start (by default enough for both phases), waits for it and checks the
deliveries: count - cancels of them, replaced ids with their new value, no cancelled id,
none early, no duplicates.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from kafka_scheduler.checkpoint import last_committed_batch
from kafka_scheduler.protocol import DIALECT_NAMES

from .harness import (DeliveryReader, Environment, RequestProducer, directory_bytes, log, percentile, wait_until,
                      write_result)

FAR_FUTURE_MS = 30 * 86_400_000  # "due far in the future": a month ahead


def _ids(prefix: str, count: int):
    return (f"{prefix}-{i}" for i in range(count))


def _ingest(env: Environment, scheduler, destination: str, count: int, due_ms: Callable[[int], int],
            prefix: str, time_budget: float, no_ids: bool = False, requests: Optional[str] = None,
            dialect: str = "native") -> dict:
    """Produce ``count`` ADDs as fast as possible and wait until the scheduler has committed them all.

    Returns the producer rate and the scheduler's sustained acceptance rate (10%..90% of the
    committed offsets, which excludes start-up and the last partial batch).
    """
    requests = requests or f"{scheduler.app_id}-schedule-requests"
    base = scheduler.committed(requests)
    producer = RequestProducer(env.bootstrap, requests, dialect)
    progress_points: list[tuple[float, int]] = []
    started = time.time()
    log(f"producing {count:,} {dialect} requests" + (" without request ids" if no_ids else " with unique request ids"))
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


def _dialect_inputs(env: Environment, args) -> tuple[tuple, dict[str, str]]:
    """Scheduler flags and the inputs (topic -> dialect) besides the native requests topic: a topic of
    ``--dialect`` (requests go there), and with ``--with-dialects`` an idle topic of every other dialect."""
    wanted = [] if args.dialect == "native" else [args.dialect]
    if args.with_dialects:
        wanted += [d for d in DIALECT_NAMES if d not in ("native", *wanted)]
    inputs = {env.topic(d.replace("-", ""), log_append_time=False): d for d in wanted}
    return tuple(a for t, d in inputs.items() for a in ("--input", f"{t}:{d}")), inputs


def _warmed_up(env: Environment, args, app_id: Optional[str] = None, inputs: tuple = ()):
    """A started scheduler that has already delivered something: the first batches with data are slow
    (Python workers start, code paths warm up), and the figures should show the steady state."""
    app_id = app_id or f"bench-{uuid.uuid4().hex[:6]}"
    if inputs:
        inputs = ("--input", f"{app_id}-schedule-requests:native", *inputs)
    scheduler = env.scheduler(app_id, extra_args=(*inputs, *args.scheduler_args)).start()
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
    flags, _ = _dialect_inputs(env, argparse.Namespace(dialect="native", with_dialects=args.with_dialects))
    scheduler = _warmed_up(env, args, inputs=flags)
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
    flags, inputs = _dialect_inputs(env, args)
    scheduler = _warmed_up(env, args, inputs=flags)
    destination = env.topic("ingest")
    far = int(time.time() * 1000) + FAR_FUTURE_MS
    if args.dialect != "native" and args.no_ids:
        raise RuntimeError(f"--no-ids: every {args.dialect} request carries an id (the record key)")
    requests = next((t for t, d in inputs.items() if d == args.dialect), None)
    # As native: due times 1 ms apart (Karafka and ETF1 round them up to whole seconds: the same buckets).
    figures = _ingest(env, scheduler, destination, args.count, lambda i: far + i, "ingest", args.time_budget,
                      args.no_ids, requests, args.dialect)
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


STRIKES_PER_S_PLANNED = 400  # strikes --deliver: the slowest strike rate its default --lead allows for
STRUCK_VALUE = b"replaced"  # the REPLACEs' value; the ADDs carry RequestProducer's default, b"payload"
_BATCH_LINE = re.compile(r"batch (\d+): (\d+) requests \(([^)]*)\);.*\[state ([\d.]+)s, write ([\d.]+)s\]")


def _strike_plan(count: int, strikes: int):
    """(request id, "cancel" | "replace") for each strike, in sending order: ids spread evenly over the
    pending ones (every one distinct since strikes <= count), cancels and replaces alternating."""
    for j in range(strikes):
        yield f"strikes-{j * count // strikes}", ("cancel" if j % 2 == 0 else "replace")


def _rate_groups(waves: list[tuple[int, float]], groups: int) -> list[Optional[float]]:
    """Requests per second of ``waves`` cut into ``groups`` consecutive slices of (nearly) equal length."""
    rates = []
    for g in range(groups):
        part = waves[g * len(waves) // groups:(g + 1) * len(waves) // groups]
        seconds = sum(t for _, t in part)
        rates.append(round(sum(n for n, _ in part) / seconds) if part and seconds > 0 else None)
    return rates


def _logged_strike_batches(log_text: str, after_batch: int) -> list[tuple[dict, float]]:
    """(outcome counts, state seconds) of the batches after ``after_batch`` that cancelled or replaced
    something, from the scheduler's per-batch log line (see metrics.BatchSummary.log_line)."""
    batches = []
    for match in _BATCH_LINE.finditer(log_text):
        if int(match.group(1)) <= after_batch:
            continue
        outcomes = {}
        for part in match.group(3).split(","):
            n, _, name = part.strip().partition(" ")
            outcomes[name] = int(n)
        if outcomes.keys() & {"cancelled", "replaced", "cancel_noop", "replace_noop"}:
            batches.append((outcomes, float(match.group(4))))
    return batches


def strikes(env: Environment, args) -> dict:
    """One bucket of ``count`` schedules, then ``strikes`` cancels/replaces of them in committed waves:
    does a strike cost more as the bucket's struck set grows?"""
    scheduler = _warmed_up(env, args)
    destination = env.topic("strikes", partitions=4)
    requests = f"{scheduler.app_id}-schedule-requests"
    started = time.time()
    # A whole second, so the schedules are in one bucket whatever BUCKET_MS divides it into.
    if args.deliver:
        due = (int((started + args.lead) * 1000) // 1000 + 1) * 1000
        log(f"strikes: all due {args.lead:.0f}s after the start of ingest; the strikes must be committed by then")
    else:
        due = (int(started * 1000) + FAR_FUTURE_MS) // 1000 * 1000

    def before_due() -> float:
        """Seconds left until the bucket falls due (minus a margin for the commit to land), or the budget."""
        return (due / 1000 - 1 - time.time()) if args.deliver else args.time_budget

    try:
        ingest_figures = _ingest(env, scheduler, destination, args.count, lambda i: due, "strikes",
                                 min(args.time_budget, before_due()))
    except TimeoutError as exc:
        if args.deliver and time.time() >= due / 1000 - 1:
            raise RuntimeError(f"{exc}: the bucket fell due first; give a longer --lead than {args.lead:.0f}s") from exc
        raise
    log(f"phase 1 done: {args.count:,} pending in one bucket; phase 2: {args.strikes:,} strikes "
        f"in waves of {args.wave:,}, each sent once the previous one is committed")

    phase2_after_batch = last_committed_batch(scheduler.checkpoint) or -1
    base = scheduler.committed(requests)
    producer = RequestProducer(env.bootstrap, requests)
    plan = list(_strike_plan(args.count, args.strikes))
    cancels = sum(1 for _, action in plan if action == "cancel")
    total_waves = -(-len(plan) // args.wave)
    waves: list[tuple[int, float]] = []  # (requests, seconds from sending the first to its commit)
    phase_started = time.time()
    deadline = phase_started + args.time_budget
    next_report = phase_started + 10
    sent = 0
    error = None
    for number, start in enumerate(range(0, len(plan), args.wave), 1):
        wave = plan[start:start + args.wave]
        wave_started = time.time()
        for request_id, action in wave:
            if action == "cancel":
                producer.cancel(request_id)
            else:
                producer.replace(destination, due, request_id, STRUCK_VALUE)
        producer.flush()
        sent += len(wave)
        try:
            wait_until(lambda: scheduler.committed(requests) - base >= sent,
                       min(deadline - time.time(), before_due()), f"wave {number} of {total_waves} to be committed",
                       interval=0.05,
                       progress=lambda: f"{scheduler.committed(requests) - base:,} of {sent:,} committed")
        except TimeoutError as exc:
            # Keep the waves measured so far: a slowdown that outlasts the budget is a result too.
            error = (f"{exc} (the bucket fell due first: give a longer --lead than {args.lead:.0f}s)"
                     if args.deliver and time.time() >= due / 1000 - 1 else str(exc))
            log(f"  {error}; the figures cover the {len(waves)} waves committed before")
            break
        waves.append((len(wave), time.time() - wave_started))
        if time.time() >= next_report:
            done_s = time.time() - phase_started
            log(f"  wave {number} of {total_waves}: {sent:,} of {len(plan):,} strikes committed, "
                f"{sent / done_s:,.0f}/s so far, last wave {waves[-1][1]:.2f}s ({len(wave) / waves[-1][1]:,.0f}/s)")
            next_report = time.time() + 10
    phase_seconds = time.time() - phase_started
    committed = sum(n for n, _ in waves)
    log(f"phase 2 {'stopped' if error else 'done'}: {committed:,} strikes committed in {phase_seconds:.1f}s")

    edge = max(1, round(len(waves) / 10))  # the first and last 10% of waves, at least one each
    first, last = _rate_groups(waves[:edge], 1)[0], _rate_groups(waves[-edge:], 1)[0]
    wave_times = sorted(t for _, t in waves)
    figures = {"pending_in_bucket": args.count, "strikes": len(plan), "cancels": cancels,
               "replaces": len(plan) - cancels, "waves": len(waves),
               "strikes_per_s_overall": round(committed / phase_seconds),
               "strikes_per_s_first_10pct": first, "strikes_per_s_last_10pct": last,
               "last_to_first": round(last / first, 2) if first and last else None,
               "strikes_per_s_by_decile": _rate_groups(waves, min(10, len(waves))),
               "wave_s_p50": round(percentile(wave_times, 0.5), 3) if waves else None,
               "wave_s_max": round(wave_times[-1], 3) if waves else None,
               "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"]}
    if error:
        figures["strikes_committed"] = committed

    # The scheduler's own account: did every strike strike (no no-ops), and its state time per batch.
    logged = _logged_strike_batches(scheduler.log(), phase2_after_batch)
    outcomes: dict[str, int] = {}
    for counts, _ in logged:
        for name, n in counts.items():
            outcomes[name] = outcomes.get(name, 0) + n
    edge = max(1, round(len(logged) / 10))
    figures.update({"batches_with_strikes": len(logged), "logged_outcomes": outcomes,
                    "batch_state_s_first_10pct": round(sum(s for _, s in logged[:edge]) / edge, 3) if logged else None,
                    "batch_state_s_last_10pct": round(sum(s for _, s in logged[-edge:]) / edge, 3) if logged else None})
    figures["details"] = {"wave_requests": [n for n, _ in waves], "wave_seconds": [round(t, 3) for _, t in waves],
                          "batch_state_seconds": [s for _, s in logged],
                          "batch_strikes": [sum(n for k, n in c.items() if k != "scheduled") for c, _ in logged]}

    if error:
        figures["error"] = error
    elif args.deliver:
        # Made only now, as the bucket is about to fire: it reads from the start of the topic anyway.
        reader = DeliveryReader(env.bootstrap, destination, keep_values=True)
        figures.update(_check_deliveries(reader, plan, args.count, due, args.time_budget))
        reader.close()
    scheduler.stop()
    return figures


def _check_deliveries(reader: DeliveryReader, plan: list[tuple[str, str]], count: int, due: int,
                      time_budget: float) -> dict:
    """After the bucket falls due: exactly the uncancelled schedules, replaced ones with their new value."""
    cancelled = {request_id.encode() for request_id, action in plan if action == "cancel"}
    replaced = {request_id.encode() for request_id, action in plan if action == "replace"}
    expected = count - len(cancelled)
    log(f"waiting for the bucket to fall due in {max(0.0, due / 1000 - time.time()):.0f}s, "
        f"then for {expected:,} deliveries")
    # Polling meanwhile: anything delivered early shows up here, and counts as early below.
    wait_until(lambda: reader.poll(0.5) is not None and time.time() >= due / 1000, due / 1000 - time.time() + 10,
               "the due instant", interval=0, progress=lambda: f"due in {due / 1000 - time.time():.0f}s, "
                                                               f"{len(reader.deliveries):,} delivered already")
    try:
        # The herd scenario delivers 1,000,000 due at once within ~16 s; a minute more is plenty.
        wait_until(lambda: reader.poll(0.5) >= expected, min(time_budget, 60 + expected / 10_000),
                   "the deliveries", interval=0, progress=lambda: f"{len(reader.deliveries):,} of {expected:,}")
    except TimeoutError as exc:
        log(f"  {exc}: checking what arrived")
    # A few seconds more, so that anything delivered beyond the expected count is seen and counted.
    settle_until = time.time() + 5
    while time.time() < settle_until:
        reader.poll(0.5)
    values = reader.values
    missing = sum(1 for i in range(count) if (key := f"strikes-{i}".encode()) not in values and key not in cancelled)
    untouched_wrong = sum(1 for key, value in values.items()
                          if key not in replaced and key not in cancelled and value != b"payload")
    figures = reader.lateness_figures()
    appended = sorted(a for a, _ in reader.deliveries)
    figures = {"delivered": figures["delivered"], "expected_deliveries": expected, "early": figures["early"],
               "duplicates": figures["duplicates"], "missing": missing,
               "cancelled_delivered": sum(1 for key in cancelled if key in values),
               "replaced_with_new_value": sum(1 for key in replaced if values.get(key) == STRUCK_VALUE),
               "replaced_with_old_value": sum(1 for key in replaced if values.get(key) == b"payload"),
               "versions_delivered_twice": len(reader.keys_delivered_twice),
               "untouched_with_wrong_value": untouched_wrong,
               "due_to_last_delivery_s": round((appended[-1] - due) / 1000, 2) if appended else None}
    problems = [name for name in ("early", "duplicates", "missing", "cancelled_delivered", "replaced_with_old_value",
                                  "versions_delivered_twice", "untouched_with_wrong_value") if figures[name]]
    if figures["delivered"] != expected:
        problems.append(f"delivered {figures['delivered']:,} != {expected:,}")
    if figures["replaced_with_new_value"] != len(replaced):
        problems.append("replaced_with_new_value")
    figures["check"] = "passed" if not problems else "FAILED: " + ", ".join(problems)
    if problems:
        figures["error"] = "delivery check failed: " + ", ".join(problems)
    return figures


SCENARIOS = {"steady": steady, "ingest": ingest, "herd": herd, "pending": pending, "restart": restart,
             "strikes": strikes}

# The target sizes, as a single scenario runs them by default.
TARGETS = {
    "steady": {"rate": 1000, "duration": 60},
    "ingest": {"count": 1_000_000},
    "herd": {"count": 1_000_000},
    "pending": {"count": 10_000_000},
    "restart": {"count": 1_000_000},
    "strikes": {"count": 1_000_000, "strikes": 500_000, "wave": 5_000},
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
    ("strikes", {}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"], help="which scenario ('all' = make bench)")
    parser.add_argument("--rate", type=float, default=1000, help="steady: schedules per second (default 1000)")
    parser.add_argument("--duration", type=float, default=60, help="steady: seconds of load (default 60)")
    parser.add_argument("--lead", type=float, default=None,
                        help="steady: due this many seconds after sending (default 3); herd, strikes --deliver: "
                             "the instant all are due, in seconds from the start of ingest (default: enough to "
                             "ingest them first, and for strikes to send the strikes too)")
    parser.add_argument("--count", type=int, default=None,
                        help="ingest/herd/pending/restart/strikes: number of schedules (default 1,000,000; "
                             "pending 10,000,000)")
    parser.add_argument("--strikes", type=int, default=None,
                        help="strikes: cancels and replaces (half each) of distinct pending schedules "
                             "(default 500,000)")
    parser.add_argument("--wave", type=int, default=None,
                        help="strikes: requests sent at a time, each wave once the previous one is committed "
                             "(default 5,000)")
    parser.add_argument("--deliver", action="store_true",
                        help="strikes: make the bucket due just after the strikes (see --lead), then check what "
                             "is delivered: the uncancelled schedules, replaced ones with their new value")
    parser.add_argument("--dialect", choices=DIALECT_NAMES, default="native",
                        help="ingest: write the requests in this dialect, to a topic of their own")
    parser.add_argument("--with-dialects", action="store_true",
                        help="steady, ingest: the job also reads an idle topic of every other dialect")
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
    if name == "strikes":
        for key in ("strikes", "wave"):
            if getattr(scenario_args, key) is None:
                setattr(scenario_args, key, defaults[key])
        if scenario_args.deliver and args.lead is None:
            # Ingest with ids ran at 2,400-4,800/s here and strikes at 350-500/s in 1,000-request waves
            # (smoke runs on the shared machine); slower than that and the run stops with a hint.
            scenario_args.lead = 60 + scenario_args.count / 2500 + scenario_args.strikes / STRIKES_PER_S_PLANNED
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    log(f"{name}: work folder {workdir}")
    env = Environment(workdir, args.bootstrap_servers)
    try:
        figures = SCENARIOS[name](env, scenario_args)
    finally:
        env.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    details = figures.pop("details", None)
    log(f"{name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    parameters = {k: v for k, v in vars(scenario_args).items()
                  if k not in ("scenario", "keep", "bootstrap_servers", "command", "handler")
                  and isinstance(v, (int, float, str, bool, type(None)))}
    parameters["scheduler_args"] = list(scenario_args.scheduler_args)
    path = write_result(name, parameters, figures, details=details)
    log(f"{name}: written to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return figures


def main(args: argparse.Namespace) -> int:
    plan = PLAN if args.scenario == "all" else [(args.scenario, {})]
    if args.scenario in ("strikes", "all"):
        count = args.count if args.count is not None else TARGETS["strikes"]["count"]
        strikes_ = args.strikes if args.strikes is not None else TARGETS["strikes"]["strikes"]
        wave = args.wave if args.wave is not None else TARGETS["strikes"]["wave"]
        if not 0 < strikes_ <= count or wave < 1:
            log(f"strikes: need 0 < --strikes <= --count and --wave >= 1 "
                f"(got --count {count:,}, --strikes {strikes_:,}, --wave {wave:,})")
            return 2
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
