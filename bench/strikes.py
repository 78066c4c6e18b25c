"""bench strikes: cancels and replaces per second as one time bucket's struck versions pile up.

    kafka-scheduler bench strikes --count 1000000 --strikes 500000 --wave 5000 [--deliver]

A replace or cancel of a pending schedule strikes its old version out of its time
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

import re
import time

from kafka_scheduler.engine.spark.checkpoint import last_committed_batch

from .harness import (
    DeliveryReader,
    Environment,
    RequestProducer,
    log,
    percentile,
    wait_until,
)
from .job_load import FAR_FUTURE_MS, ingest_requests, warmed_up

STRIKES_PER_S_PLANNED = 400  # strikes --deliver: the slowest strike rate its default --lead allows for
STRUCK_VALUE = b"replaced"  # the REPLACEs' value; the ADDs carry RequestProducer's default, b"payload"
_BATCH_LINE = re.compile(r"batch (\d+): (\d+) requests \(([^)]*)\);.*\[state ([\d.]+)s, write ([\d.]+)s\]")


def _strike_plan(count: int, strikes: int):
    """(request id, "cancel" | "replace") for each strike, in sending order: ids spread evenly over the
    pending ones (every one distinct since strikes <= count), cancels and replaces alternating."""
    for j in range(strikes):
        yield f"strikes-{j * count // strikes}", ("cancel" if j % 2 == 0 else "replace")


def _rate_groups(waves: list[tuple[int, float]], groups: int) -> list[float | None]:
    """Requests per second of ``waves`` cut into ``groups`` consecutive slices of (nearly) equal length."""
    rates = []
    for g in range(groups):
        part = waves[g * len(waves) // groups : (g + 1) * len(waves) // groups]
        seconds = sum(t for _, t in part)
        rates.append(round(sum(n for n, _ in part) / seconds) if part and seconds > 0 else None)
    return rates


def _logged_strike_batches(log_text: str, after_batch: int) -> list[tuple[dict, float]]:
    """(outcome counts, state seconds) of the batches after ``after_batch`` that cancelled or replaced
    something, from the scheduler's per-batch log line (see engine.batch_summary.BatchSummary.log_line)."""
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
    scheduler = warmed_up(env, args)
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
        ingest_figures = ingest_requests(
            env, scheduler, destination, args.count, lambda i: due, "strikes", min(args.time_budget, before_due())
        )
    except TimeoutError as exc:
        if args.deliver and time.time() >= due / 1000 - 1:
            raise RuntimeError(f"{exc}: the bucket fell due first; give a longer --lead than {args.lead:.0f}s") from exc
        raise
    log(
        f"phase 1 done: {args.count:,} pending in one bucket; phase 2: {args.strikes:,} strikes "
        f"in waves of {args.wave:,}, each sent once the previous one is committed"
    )

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
        wave = plan[start : start + args.wave]
        wave_started = time.time()
        for request_id, action in wave:
            if action == "cancel":
                producer.cancel(request_id)
            else:
                producer.replace(destination, due, request_id, STRUCK_VALUE)
        producer.flush()
        sent += len(wave)
        try:
            wait_until(
                lambda sent=sent: scheduler.committed(requests) - base >= sent,
                min(deadline - time.time(), before_due()),
                f"wave {number} of {total_waves} to be committed",
                interval=0.05,
                progress=lambda sent=sent: f"{scheduler.committed(requests) - base:,} of {sent:,} committed",
            )
        except TimeoutError as exc:
            # Keep the waves measured so far: a slowdown that outlasts the budget is a result too.
            error = (
                f"{exc} (the bucket fell due first: give a longer --lead than {args.lead:.0f}s)"
                if args.deliver and time.time() >= due / 1000 - 1
                else str(exc)
            )
            log(f"  {error}; the figures cover the {len(waves)} waves committed before")
            break
        waves.append((len(wave), time.time() - wave_started))
        if time.time() >= next_report:
            done_s = time.time() - phase_started
            log(
                f"  wave {number} of {total_waves}: {sent:,} of {len(plan):,} strikes committed, "
                f"{sent / done_s:,.0f}/s so far, last wave {waves[-1][1]:.2f}s ({len(wave) / waves[-1][1]:,.0f}/s)"
            )
            next_report = time.time() + 10
    phase_seconds = time.time() - phase_started
    committed = sum(n for n, _ in waves)
    log(f"phase 2 {'stopped' if error else 'done'}: {committed:,} strikes committed in {phase_seconds:.1f}s")

    edge = max(1, round(len(waves) / 10))  # the first and last 10% of waves, at least one each
    first, last = _rate_groups(waves[:edge], 1)[0], _rate_groups(waves[-edge:], 1)[0]
    wave_times = sorted(t for _, t in waves)
    figures = {
        "pending_in_bucket": args.count,
        "strikes": len(plan),
        "cancels": cancels,
        "replaces": len(plan) - cancels,
        "waves": len(waves),
        "strikes_per_s_overall": round(committed / phase_seconds),
        "strikes_per_s_first_10pct": first,
        "strikes_per_s_last_10pct": last,
        "last_to_first": round(last / first, 2) if first and last else None,
        "strikes_per_s_by_decile": _rate_groups(waves, min(10, len(waves))),
        "wave_s_p50": round(percentile(wave_times, 0.5), 3) if waves else None,
        "wave_s_max": round(wave_times[-1], 3) if waves else None,
        "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"],
    }
    if error:
        figures["strikes_committed"] = committed

    # The scheduler's own account: did every strike strike (no no-ops), and its state time per batch.
    logged = _logged_strike_batches(scheduler.log(), phase2_after_batch)
    outcomes: dict[str, int] = {}
    for counts, _ in logged:
        for name, n in counts.items():
            outcomes[name] = outcomes.get(name, 0) + n
    edge = max(1, round(len(logged) / 10))
    figures.update(
        {
            "batches_with_strikes": len(logged),
            "logged_outcomes": outcomes,
            "batch_state_s_first_10pct": round(sum(s for _, s in logged[:edge]) / edge, 3) if logged else None,
            "batch_state_s_last_10pct": round(sum(s for _, s in logged[-edge:]) / edge, 3) if logged else None,
        }
    )
    figures["details"] = {
        "wave_requests": [n for n, _ in waves],
        "wave_seconds": [round(t, 3) for _, t in waves],
        "batch_state_seconds": [s for _, s in logged],
        "batch_strikes": [sum(n for k, n in c.items() if k != "scheduled") for c, _ in logged],
    }

    if error:
        figures["error"] = error
    elif args.deliver:
        # Made only now, as the bucket is about to fire: it reads from the start of the topic anyway.
        reader = DeliveryReader(env.bootstrap, destination, keep_values=True)
        figures.update(_check_deliveries(reader, plan, args.count, due, args.time_budget))
        reader.close()
    scheduler.stop()
    return figures


def _check_deliveries(
    reader: DeliveryReader, plan: list[tuple[str, str]], count: int, due: int, time_budget: float
) -> dict:
    """After the bucket falls due: exactly the uncancelled schedules, replaced ones with their new value."""
    cancelled = {request_id.encode() for request_id, action in plan if action == "cancel"}
    replaced = {request_id.encode() for request_id, action in plan if action == "replace"}
    expected = count - len(cancelled)
    log(
        f"waiting for the bucket to fall due in {max(0.0, due / 1000 - time.time()):.0f}s, "
        f"then for {expected:,} deliveries"
    )
    # Polling meanwhile: anything delivered early shows up here, and counts as early below.
    wait_until(
        lambda: reader.poll(0.5) is not None and time.time() >= due / 1000,
        due / 1000 - time.time() + 10,
        "the due instant",
        interval=0,
        progress=lambda: f"due in {due / 1000 - time.time():.0f}s, {len(reader.deliveries):,} delivered already",
    )
    try:
        # The herd scenario delivers 1,000,000 due at once within ~16 s; a minute more is plenty.
        wait_until(
            lambda: reader.poll(0.5) >= expected,
            min(time_budget, 60 + expected / 10_000),
            "the deliveries",
            interval=0,
            progress=lambda: f"{len(reader.deliveries):,} of {expected:,}",
        )
    except TimeoutError as exc:
        log(f"  {exc}: checking what arrived")
    # A few seconds more, so that anything delivered beyond the expected count is seen and counted.
    settle_until = time.time() + 5
    while time.time() < settle_until:
        reader.poll(0.5)
    values = reader.values
    missing = sum(1 for i in range(count) if (key := f"strikes-{i}".encode()) not in values and key not in cancelled)
    untouched_wrong = sum(
        1 for key, value in values.items() if key not in replaced and key not in cancelled and value != b"payload"
    )
    figures = reader.lateness_figures()
    appended = sorted(a for a, _ in reader.deliveries)
    figures = {
        "delivered": figures["delivered"],
        "expected_deliveries": expected,
        "early": figures["early"],
        "duplicates": figures["duplicates"],
        "missing": missing,
        "cancelled_delivered": sum(1 for key in cancelled if key in values),
        "replaced_with_new_value": sum(1 for key in replaced if values.get(key) == STRUCK_VALUE),
        "replaced_with_old_value": sum(1 for key in replaced if values.get(key) == b"payload"),
        "versions_delivered_twice": len(reader.keys_delivered_twice),
        "untouched_with_wrong_value": untouched_wrong,
        "due_to_last_delivery_s": round((appended[-1] - due) / 1000, 2) if appended else None,
    }
    problems = [
        name
        for name in (
            "early",
            "duplicates",
            "missing",
            "cancelled_delivered",
            "replaced_with_old_value",
            "versions_delivered_twice",
            "untouched_with_wrong_value",
        )
        if figures[name]
    ]
    if figures["delivered"] != expected:
        problems.append(f"delivered {figures['delivered']:,} != {expected:,}")
    if figures["replaced_with_new_value"] != len(replaced):
        problems.append("replaced_with_new_value")
    figures["check"] = "passed" if not problems else "FAILED: " + ", ".join(problems)
    if problems:
        figures["error"] = "delivery check failed: " + ", ".join(problems)
    return figures
