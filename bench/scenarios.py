"""The benchmark scenarios. Each runs against a broker and the real `kafka-scheduler run` job,
prints its figures and appends a JSON result to bench/results/.

    kafka-scheduler bench steady --rate 1000 --duration 60 [--lead 2] [--pending 1000000]
    kafka-scheduler bench soak [--duration 3600] (bench/soak.py)
    kafka-scheduler bench ingest --count 1000000 [--no-ids | --mix] [--spread DAYS]
    kafka-scheduler bench herd --count 10000000 [--no-ids] [--lead S]
    kafka-scheduler bench pending --count 10000000
    kafka-scheduler bench restart --count 1000000
    kafka-scheduler bench idle [--count 10000] [--duration 60]
    kafka-scheduler bench strikes --count 1000000 --strikes 500000 --wave 5000 [--deliver]
    kafka-scheduler bench hostile --count 1000000
    kafka-scheduler bench mixed --count 1000000 [--ordinary-rate 200] [--after 30]   (bench/mixed.py)
    make bench            # `bench all`: the PLAN below, at the issues' target sizes

steady: --rate requests/s with ids for --duration s, each due --lead s after it is sent, except
every 50th (2%) sent already due (due 1 s before sending). Lateness (broker append time - due
time) p50/p99/max of the others; the already-due ones apart as send-to-delivery p50/p99/max
(`already_due_*`); early and lost counted over all. --pending N first files N schedules with ids due a month
ahead (the state's size must not slow a batch down). Where the batches' time went: `[state s, write s]` of the job's
batch lines, and with KAFKA_SCHEDULER_LOG_LEVEL=DEBUG Spark's durationMs per step (harness.batch_profile).

ingest: --count ADDs with unique ids (default) or none (--no-ids), due a month ahead (1 ms apart, or
spread evenly over --spread days, as reminders are); or --mix:
of every 20 requests 4 replace and 1 cancels an id sent before and still pending (picked at
random), the rest add new ids. Accepted/s overall (all requests, first sent to last committed)
and between the first and last commit; with --mix also the job's logged outcome counts.

herd: --count schedules (ids unless --no-ids) all due at one instant --lead s after the start;
the default --lead leaves time to ingest at 8,000/s, and the run stops early with a message if
the pace between commits cannot make it. Deliveries are counted on the broker while they come
and read back afterwards: first/last delivery after the instant, lateness, early, lost,
duplicates; then up to 60 s for the job's `index: N entries` line to reach 0
(`index_entries_after`; null if the job does not log it).

restart: --count pending far ahead and one due 15 s later; stop the job, let that one fall due,
start it again: first overdue delivery after process start, and the start-up steps as the log
lines appeared (`spark: starting`, `running:`, `first batch done`) and the JVM process showed.

idle: a warmed-up job, --count schedules due an hour ahead, committed, 10 s quiet, then the CPU
time (utime + stime from /proc, reaped children included) of the job's whole process tree over
--duration s: `cpu_percent_of_one_core`, per group (JVM, driver Python, Python workers) and per
process (in `details`), and the micro-batches run meanwhile; then 20 requests, one every 5 s,
each due --lead (3) s after sending: wake-up lateness p50/max, early, lost.

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

hostile: --count generated hostile records in every dialect through the job, counters checked (bench/hostile.py;
not part of `make bench`).

cron: --count crons (CRON_ADD, unique ids, Kaspr's headers written out by hand) all firing every minute
(`* * * * *`), watched for --minutes minutes from the first whole minute after they are all committed: per minute,
how many of them fired (each once: duplicates and losses counted exactly), none early, the first and last delivery
after the minute; once a minute, the live state (rows and bytes of each state variable, read as `inspect` reads
them), the id index and the job's memory (they should stay flat from minute 2 on: firings leave nothing behind),
and the checkpoint's size on disk by kind (it also keeps --state-batches-kept batches' versions). Deliveries are
counted on the broker while they come (end offsets) and read back at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from kafka_scheduler.engine.spark.checkpoint import last_committed_batch
from kafka_scheduler.harness.process_tree import jvm_running, tree_cpu
from kafka_scheduler.kafka.local_broker import free_port
from kafka_scheduler.protocol import DIALECT_NAMES

from . import mixed as mixed_scenario
from . import soak as soak_module
from .harness import (
    INGEST_PLANNED_PER_S,
    CronProducer,
    DeliveryReader,
    EndOffsets,
    Environment,
    FiringReader,
    LiveState,
    RequestProducer,
    batch_profile,
    checkpoint_breakdown,
    cpu_between,
    directory_bytes,
    index_entries,
    log,
    percentile,
    wait_until,
    write_result,
)
from .hostile import hostile
from .job_load import ingest_requests, warmed_up

FAR_FUTURE_MS = 30 * 86_400_000  # "due far in the future": a month ahead


def _ids(prefix: str, count: int):
    return (f"{prefix}-{i}" for i in range(count))


def _dialect_inputs(env: Environment, args) -> tuple[tuple, dict[str, str]]:
    """Scheduler flags and the inputs (topic -> dialect) besides the native requests topic: a topic of
    ``--dialect`` (requests go there), and with ``--with-dialects`` an idle topic of every other dialect."""
    wanted = [] if args.dialect == "native" else [args.dialect]
    if args.with_dialects:
        wanted += [d for d in DIALECT_NAMES if d not in ("native", *wanted)]
    inputs = {env.topic(d.replace("-", ""), log_append_time=False): d for d in wanted}
    return tuple(a for t, d in inputs.items() for a in ("--input", f"{t}:{d}")), inputs


ALREADY_DUE_EVERY = 50  # steady: every 50th request (2%) is already due when sent
ALREADY_DUE_BY_MS = 1000  # ... due this long before it is sent


def _settle_and_count(reader: DeliveryReader, expected: int, timeout: float, what: str) -> None:
    """Wait for ``expected`` deliveries; on a timeout keep going (what is missing is counted as lost),
    and read a few seconds more so that duplicates arriving late are counted too."""
    try:
        wait_until(
            lambda: reader.poll() >= expected, timeout, what, progress=lambda: f"{reader.count:,} of {expected:,}"
        )
    except TimeoutError as exc:
        log(f"  {exc}: counting what arrived")
    settle_until = time.time() + 3
    while time.time() < settle_until:
        reader.poll(0.5)


def _send_to_delivery(sent: list[tuple[int, int, int]], prefix: str) -> dict:
    """Figures of deliveries measured from their send time: (append ms, due ms, sent ms) each."""
    delays = sorted((appended - sent_ms) / 1000 for appended, _, sent_ms in sent)
    return {
        f"{prefix}_delivered": len(delays),
        f"{prefix}_early": sum(1 for appended, due, _ in sent if appended < due),
        f"{prefix}_send_to_delivery_p50_s": round(percentile(delays, 0.5), 3) if delays else None,
        f"{prefix}_send_to_delivery_p99_s": round(percentile(delays, 0.99), 3) if delays else None,
        f"{prefix}_send_to_delivery_max_s": round(delays[-1], 3) if delays else None,
    }


def steady(env: Environment, args) -> dict:
    flags, _ = _dialect_inputs(env, argparse.Namespace(dialect="native", with_dialects=args.with_dialects))
    scheduler = warmed_up(env, args, inputs=flags)
    if args.pending:  # the state's size must not slow a batch down: this many due a month ahead, with ids
        far = int(time.time() * 1000) + FAR_FUTURE_MS
        ingest_requests(
            env, scheduler, env.topic("pending"), args.pending, lambda i: far + i, "pending", args.time_budget
        )
    after_batch = last_committed_batch(scheduler.checkpoint) or -1
    destination = env.topic("steady")
    reader = DeliveryReader(env.bootstrap, destination)
    producer = RequestProducer(env.bootstrap, f"{scheduler.app_id}-schedule-requests")
    total = int(args.rate * args.duration)
    log(
        f"steady: {args.rate}/s for {args.duration}s, each due {args.lead}s after it is sent, "
        f"every {ALREADY_DUE_EVERY}th already due {ALREADY_DUE_BY_MS / 1000:.0f}s before"
    )
    started = time.time()
    already_due = 0
    for i, request_id in enumerate(_ids("steady", total)):
        target = started + i / args.rate
        while time.time() < target:
            reader.poll(0)
            time.sleep(min(0.002, max(0.0, target - time.time())))
        now_ms = int(time.time() * 1000)
        if i % ALREADY_DUE_EVERY == ALREADY_DUE_EVERY // 2:
            producer.add(destination, now_ms - ALREADY_DUE_BY_MS, request_id, sent_ms=now_ms)
            already_due += 1
        else:
            producer.add(destination, int(now_ms + args.lead * 1000), request_id)
        if i % max(1, int(args.rate)) == 0:
            producer.producer.poll(0)
            scheduler.sample_memory()
    producer.flush()
    _settle_and_count(reader, total, args.lead + 120, "all deliveries")
    appended = reader.appended()
    figures = reader.lateness_figures()
    figures["deliveries_per_s"] = (
        round((len(appended) - 1) / max(1e-9, (appended[-1] - appended[0]) / 1000)) if len(appended) > 1 else None
    )
    figures.update(_send_to_delivery(reader.sent_deliveries, "already_due"))
    figures.update(
        {
            "sent": total,
            "already_due_sent": already_due,
            "early_all": figures["early"] + figures["already_due_early"],
            "lost": total - reader.count,
            "pending": args.pending,
        }
    )
    figures.update(batch_profile(scheduler.log(), after_batch))
    reader.close()
    scheduler.stop()
    return figures


MIX_REPLACE_SLOTS = (5, 10, 15, 19)  # ingest --mix: of every 20 requests, 4 replace (20%) ...
MIX_CANCEL_SLOTS = (7,)  # ... 1 cancels (5%), the rest add


def _mix_sender(destination: str, far: int, counts: Counter) -> Callable[[RequestProducer, int], None]:
    """ingest --mix: adds with new ids; replaces and cancels of ids picked at random among those added and not
    cancelled yet (every request of an id goes to the id's partition, so the add is read first)."""
    rng = random.Random(7)
    pending: list[str] = []

    def send(producer: RequestProducer, i: int) -> None:
        slot = i % 20
        if pending and slot in MIX_REPLACE_SLOTS:
            producer.replace(destination, far + i, pending[rng.randrange(len(pending))], b"replaced")
            counts["replace"] += 1
        elif pending and slot in MIX_CANCEL_SLOTS:
            j = rng.randrange(len(pending))
            pending[j], pending[-1] = pending[-1], pending[j]
            producer.cancel(pending.pop())
            counts["cancel"] += 1
        else:
            request_id = f"mix-{i}"
            producer.add(destination, far + i, request_id)
            pending.append(request_id)
            counts["add"] += 1

    return send


def _logged_outcomes(log_text: str, after_batch: int) -> dict[str, int]:
    """Outcome counts summed over the job's batch lines after ``after_batch`` (BatchSummary.log_line)."""
    outcomes: Counter = Counter()
    for match in re.finditer(r"batch (\d+): (\d+) requests \(([^)]*)\)", log_text):
        if int(match.group(1)) > after_batch:
            for part in match.group(3).split(","):
                n, _, name = part.strip().partition(" ")
                if n.isdigit():
                    outcomes[name] += int(n)
    return dict(sorted(outcomes.items()))


def ingest(env: Environment, args) -> dict:
    flags, inputs = _dialect_inputs(env, args)
    scheduler = warmed_up(env, args, inputs=flags)
    destination = env.topic("ingest")
    far = int(time.time() * 1000) + FAR_FUTURE_MS
    if args.dialect != "native" and args.no_ids:
        raise RuntimeError(f"--no-ids: every {args.dialect} request carries an id (the record key)")
    if args.mix and (args.no_ids or args.dialect != "native"):
        raise RuntimeError("--mix: native requests with ids only (replaces and cancels need the ids)")
    if args.mix and args.spread:
        raise RuntimeError("--spread: adds only (--mix picks its own due times)")
    requests = next((t for t, d in inputs.items() if d == args.dialect), None)
    after_batch = last_committed_batch(scheduler.checkpoint) or -1
    counts: Counter = Counter()
    # As native: due times 1 ms apart (Karafka and ETF1 round them up to whole seconds: the same buckets); with
    # --spread, apart by the spread over the count (over 30 days, 300,000 ids fall ~8.6 s apart: a second each).
    step_ms = args.spread * 86_400_000 / args.count if args.spread else 1
    figures = ingest_requests(
        env,
        scheduler,
        destination,
        args.count,
        lambda i: far + int(i * step_ms),
        "mix" if args.mix else "ingest",
        args.time_budget,
        args.no_ids,
        requests,
        args.dialect,
        send=_mix_sender(destination, far, counts) if args.mix else None,
    )
    figures["spread_days"] = args.spread
    if args.mix:
        figures.update({"adds": counts["add"], "replaces": counts["replace"], "cancels": counts["cancel"]})
        # The job's own account: a replace or cancel that found nothing to act on shows as a no-op.
        figures["logged_outcomes"] = _logged_outcomes(scheduler.log(), after_batch)
    figures["index_entries"] = index_entries(scheduler)
    figures.update(batch_profile(scheduler.log(), after_batch))
    scheduler.stop()
    return figures


INDEX_SETTLE_S = 60  # herd: how long the index may take to forget the delivered schedules
HERD_LEAD_SPARE_S = 30  # herd: its default lead is the time to ingest it at the planned rate plus this


def herd(env: Environment, args) -> dict:
    scheduler = warmed_up(env, args)
    destination = env.topic("herd", partitions=4)
    due = int(time.time() * 1000 + args.lead * 1000)
    log(
        f"herd: {args.count:,} due {args.lead:.0f}s from now, "
        f"{'without ids' if args.no_ids else 'with unique request ids'}"
    )
    too_slow = (
        f" before the herd falls due: --lead {args.lead:.0f}s for {args.count:,} needs about "
        f"{args.count / max(1.0, args.lead - HERD_LEAD_SPARE_S):,.0f}/s "
        f"(the default plans for {INGEST_PLANNED_PER_S:,}/s; "
        f"the issue targets >= 30,000/s with ids); give a longer --lead to measure the herd anyway"
    )
    ingest_figures = ingest_requests(
        env,
        scheduler,
        destination,
        args.count,
        lambda i: due,
        "herd",
        max(1.0, due / 1000 - 1 - time.time()),
        args.no_ids,
        finish_by=due / 1000 - 1,
        too_slow=too_slow,
    )
    if time.time() * 1000 > due:
        raise RuntimeError("ingest took longer than --lead: the herd was not all pending at its due instant")
    at_due = index_entries(scheduler)
    log(f"all {args.count:,} pending (index: {at_due} entries); due in {(due - time.time() * 1000) / 1000:.1f}s")
    # Counted on the broker, read afterwards: a consumer reading millions meanwhile would take a core from the job.
    offsets = EndOffsets(env.bootstrap, destination)
    wait_until(
        lambda: offsets.total() >= args.count,
        args.lead + args.time_budget,
        "the herd to be delivered",
        progress=lambda: f"{offsets.total():,} of {args.count:,}",
    )
    delivered_at = time.time()
    offsets.close()

    index_after = index_entries(scheduler)
    if index_after is not None:
        log(f"all delivered; waiting up to {INDEX_SETTLE_S}s for the id index to empty (now {index_after:,})")
        try:
            wait_until(
                lambda: index_entries(scheduler) == 0,
                INDEX_SETTLE_S,
                "the index to empty",
                progress=lambda: f"index: {index_entries(scheduler)} entries",
            )
        except TimeoutError as exc:
            log(f"  {exc}")
        index_after = index_entries(scheduler)
    last_line = scheduler.last(r"index: \d+ entries")

    reader = DeliveryReader(env.bootstrap, destination, compact=True)
    # Until the topic is read to its end: nothing new for 5 s (the reader counts duplicates apart).
    reader.read_until_quiet()
    appended = reader.appended()
    figures = reader.lateness_figures()
    figures.update(
        {
            "due_to_last_delivery_s": round((appended[-1] - due) / 1000, 2),
            "due_to_first_delivery_s": round((appended[0] - due) / 1000, 2),
            "deliveries_per_s": round(len(appended) / max(1e-9, (appended[-1] - appended[0]) / 1000)),
            "lost": args.count - reader.count,
            "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"],
            "index_entries_at_due": at_due,
            "index_entries_after": index_after,
            "index_last_logged_after_all_delivered_s": round(last_line[0] - delivered_at, 1)
            if last_line and index_after is not None
            else None,
        }
    )
    reader.close()
    scheduler.stop()
    return figures


def pending(env: Environment, args) -> dict:
    port = free_port()  # the status page's state count is measured too
    scheduler = env.scheduler(extra_args=(*args.scheduler_args, "--metrics-port", str(port))).start()
    destination = env.topic("pending")
    far = int(time.time() * 1000) + FAR_FUTURE_MS
    ingest_figures = ingest_requests(
        env, scheduler, destination, args.count, lambda i: far + i, "pending", args.time_budget, args.no_ids
    )
    log("sampling memory for 20 s more (idle batches, RocksDB flushes)")
    settle_until = time.time() + 20
    wait_until(lambda: scheduler.sample_memory() is not None and time.time() > settle_until, 60, "settling", interval=1)
    peak = dict(scheduler.peak_rss)
    checkpoint_bytes = directory_bytes(scheduler.checkpoint)
    log("counting the pending schedules from the checkpoint (the read a scrape or the status page starts)")
    started = time.monotonic()
    during: list[int] = [0]  # the job's largest RSS while it counts

    def counted() -> dict | None:
        during[0] = max(during[0], sum(scheduler.sample_memory().values()))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/upcoming", timeout=30) as answer:
            upcoming = json.loads(answer.read())
        return upcoming if upcoming.get("state") == "ready" else None

    upcoming = wait_until(
        counted,
        args.time_budget,
        "the state count",
        interval=0.5,
        progress=lambda: f"{time.monotonic() - started:.0f}s",
    )
    count_s = time.monotonic() - started
    if upcoming["total"] != args.count:
        raise RuntimeError(f"the state count found {upcoming['total']} pending, not {args.count}")
    log(f"counted {upcoming['total']:,} pending in {count_s:.1f}s")
    scheduler.stop()
    return {
        "state_count_s": round(count_s, 1),
        "rss_total_during_count_mib": round(during[0] / 2**20),
        "peak_rss_total_mib": round(sum(peak.values()) / 2**20),
        **{f"peak_rss_{k}_mib": round(v / 2**20) for k, v in peak.items()},
        "checkpoint_bytes_per_pending": round(checkpoint_bytes / args.count, 1),
        "checkpoint_mib": round(checkpoint_bytes / 2**20, 1),
        "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"],
    }


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


# Start-up milestones in the job's log (pipeline.py), in the order they appear.
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
    _settle_and_count(reader, WAKEUPS, args.lead + 60, "the wake-up deliveries")
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


CRON_LAST_TARGET_S = 20.0  # cron: each minute's last firing at most this long after the minute


def cron(env: Environment, args) -> dict:
    """See the module's docstring."""
    scheduler = warmed_up(env, args)
    destination = env.topic("cron", partitions=4)
    log(f"cron: {args.count:,} crons firing every minute, watched for {args.minutes} minutes")
    ingest_figures = ingest_requests(
        env,
        scheduler,
        destination,
        args.count,
        lambda i: 0,
        "cron",
        args.time_budget,
        send=lambda producer, i: CronProducer.cron(producer, destination, f"cron-{i}", "* * * * *"),
    )
    first_minute = (int(time.time()) // 60 + 1) * 60 * 1000
    if first_minute - time.time() * 1000 < 10_000:
        first_minute += 60_000  # a minute that is whole: every cron's first firing is at or before it
    # The firings before it (crons registered early in the ingest) are delivered too; they are left out.
    minutes = [first_minute + 60_000 * k for k in range(args.minutes)]
    offsets = EndOffsets(env.bootstrap, destination)
    samples = []
    live_state: LiveState | None = None
    for k, minute in enumerate(minutes):
        # Counted from the minute itself: the firings of the minutes before it (crons registered during the ingest
        # fired then) are all on the broker by then, and a count taken earlier let a minute's wait end on them.
        time.sleep(max(0.0, minute / 1000 - time.time()))
        at_minute = offsets.total()
        try:
            wait_until(
                lambda at_minute=at_minute, minute=minute: (
                    offsets.total() >= at_minute + args.count or time.time() * 1000 > minute + 120_000
                ),
                (minute + 130_000) / 1000 - time.time(),
                f"minute {k}'s firings",
                progress=lambda at_minute=at_minute: f"{offsets.total() - at_minute:,} of {args.count:,}",
            )
        except TimeoutError as exc:
            log(f"  {exc}")
        index = index_entries(scheduler)
        memory = scheduler.sample_memory()
        # Read while the job waits for the next minute (a read takes seconds; the firings take under five).
        live_state = live_state or LiveState(scheduler.checkpoint)
        state = live_state.sample()
        samples.append(
            {
                "minute": k,
                "delivered_in_minute": offsets.total() - at_minute,
                "live_state": state,
                "live_state_mib": round(sum(v["mib"] for v in state.values() if isinstance(v, dict)), 1),
                "checkpoint_mib": round(directory_bytes(scheduler.checkpoint) / 2**20, 1),
                "checkpoint": checkpoint_breakdown(scheduler.checkpoint),
                "batches": state["batch"],
                "rss_mib": round(sum(memory.values()) / 2**20),
                "index_entries": index,
                **{f"rss_{name}_mib": round(v / 2**20) for name, v in memory.items()},
            }
        )
        log(f"  minute {k}: {samples[-1]}")
    scheduler.stop()
    if live_state:
        live_state.close()
    on_broker = offsets.total()
    offsets.close()
    log(f"reading every delivery back ({on_broker:,} records)")
    reader = FiringReader(env.bootstrap, destination, args.count)
    # To the end offsets (a quiet spell alone once ended the read before the last minute's million), or 60 s quiet.
    last_news, seen = time.time(), -1
    while reader.total < on_broker and time.time() - last_news < 60:
        reader.poll(1.0)
        if reader.total != seen:
            seen, last_news = reader.total, time.time()
    per_minute = []
    for k, minute in enumerate(minutes):
        fired = reader.fired(minute)
        per_minute.append(
            {
                "minute": k,
                "fired": fired,
                "lost": args.count - fired,
                "records": reader.records.get(minute, 0),
                "early": reader.early.get(minute, 0),
                "first_s": round((reader.first[minute] - minute) / 1000, 2) if minute in reader.first else None,
                "last_s": round((reader.last[minute] - minute) / 1000, 2) if minute in reader.last else None,
            }
        )
        log(f"  {per_minute[-1]}")
    reader.close()
    lasts = [m["last_s"] for m in per_minute if m["last_s"] is not None]
    later = [s for s in samples if s["minute"] >= 2]

    def spread(key: str):
        values = [s[key] for s in later if s.get(key) is not None]
        return round(max(values) / max(min(values), 1e-9), 2) if values else None

    return {
        "crons": args.count,
        "minutes": args.minutes,
        "all_fired_every_minute": all(m["lost"] == 0 for m in per_minute),
        "lost": sum(m["lost"] for m in per_minute),
        "duplicates": reader.duplicates,
        "early": sum(m["early"] for m in per_minute),
        "last_after_minute_max_s": max(lasts) if lasts else None,
        "last_after_minute_p50_s": round(percentile(sorted(lasts), 0.5), 2) if lasts else None,
        "minutes_last_within_target": sum(1 for v in lasts if v <= CRON_LAST_TARGET_S),
        "live_state_mib_max_over_min_from_minute_2": spread("live_state_mib"),
        "checkpoint_mib_max_over_min_from_minute_2": spread("checkpoint_mib"),
        "rss_max_over_min_from_minute_2": spread("rss_mib"),
        "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"],
        "details": {"per_minute": per_minute, "samples": samples},
    }


SCENARIOS = {
    "steady": steady,
    "ingest": ingest,
    "herd": herd,
    "pending": pending,
    "restart": restart,
    "strikes": strikes,
    "idle": idle,
    "hostile": hostile,
    "cron": cron,
    "soak": soak_module.soak,
    "mixed": mixed_scenario.mixed,
}

# The target sizes, as a single scenario runs them by default.
TARGETS = {
    "steady": {"rate": 1000, "duration": 60},
    "ingest": {"count": 1_000_000},
    "herd": {"count": 10_000_000},
    "pending": {"count": 10_000_000},
    "restart": {"count": 1_000_000},
    "strikes": {"count": 1_000_000, "strikes": 500_000, "wave": 5_000},
    "idle": {"count": 10_000, "duration": 60},
    "hostile": {"count": 1_000_000},
    "cron": {"count": 1_000_000, "minutes": 10},
    "soak": {"duration": 3600, "rate": 500},  # bench/soak.py; not in PLAN (an hour)
    "mixed": {"count": 1_000_000},
}

# What `make bench` (scenario "all") runs: every target of issue 7 with default settings, then pending and strikes.
PLAN = [
    ("steady", {}),
    ("ingest", {}),
    ("ingest", {"no_ids": True}),
    ("ingest", {"mix": True}),
    ("ingest", {"spread": 30}),
    ("herd", {}),
    ("restart", {}),
    ("idle", {}),
    ("pending", {"no_ids": True}),
    ("strikes", {}),
    ("cron", {}),
    ("mixed", {"count": 10_000_000}),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"], help="which scenario ('all' = make bench)")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="steady: schedules per second (default 1000); soak: new schedules per second (500)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="steady: seconds of load; idle: seconds of CPU measurement (default 60 each); soak: "
        "seconds of load (default 3600)",
    )
    parser.add_argument(
        "--lead",
        type=float,
        default=None,
        help="steady: due this many seconds after sending (default 2); idle: the wake-up requests "
        "likewise (default 3); herd, strikes --deliver: the instant all are due, in seconds "
        "from the start of ingest (default: enough to ingest them first, for herd at "
        f"{INGEST_PLANNED_PER_S:,}/s, and for strikes to send the strikes too)",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="ingest/herd/pending/restart/strikes/hostile/cron: number of requests (default 1,000,000; "
        "herd and pending 10,000,000); idle: schedules pending an hour ahead (default 10,000)",
    )
    parser.add_argument("--minutes", type=int, default=None, help="cron: minutes of firings watched (default 10)")
    parser.add_argument(
        "--strikes",
        type=int,
        default=None,
        help="strikes: cancels and replaces (half each) of distinct pending schedules (default 500,000)",
    )
    parser.add_argument(
        "--wave",
        type=int,
        default=None,
        help="strikes: requests sent at a time, each wave once the previous one is committed (default 5,000)",
    )
    parser.add_argument(
        "--deliver",
        action="store_true",
        help="strikes: make the bucket due just after the strikes (see --lead), then check what "
        "is delivered: the uncancelled schedules, replaced ones with their new value",
    )
    parser.add_argument(
        "--mix",
        action="store_true",
        help="ingest: 20%% replaces and 5%% cancels of ids sent before and still pending, the rest "
        "adds with new ids (--count is all of them)",
    )
    parser.add_argument(
        "--spread",
        type=float,
        default=0,
        help="ingest: due times spread evenly over this many days from a month ahead, as reminders "
        "are (default 0: 1 ms apart, a few one-second buckets)",
    )
    parser.add_argument(
        "--dialect",
        choices=DIALECT_NAMES,
        default="native",
        help="ingest: write the requests in this dialect, to a topic of their own",
    )
    parser.add_argument(
        "--with-dialects",
        action="store_true",
        help="steady, ingest: the job also reads an idle topic of every other dialect",
    )
    parser.add_argument(
        "--pending",
        type=int,
        default=0,
        help="steady: first file this many schedules with ids due a month ahead (default 0)",
    )
    parser.add_argument(
        "--no-ids",
        action="store_true",
        help="send ADDs without request ids (they cannot be replaced; they skip the id index)",
    )
    parser.add_argument(
        "--time-budget", type=float, default=1800, help="give up waiting after this many seconds (default 1800)"
    )
    parser.add_argument("--bootstrap-servers", default=None, help="use this broker instead of starting a local one")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (broker data, checkpoints, logs)")
    mixed_scenario.add_arguments(parser)
    parser.add_argument(
        "--scheduler-arg",
        dest="scheduler_args",
        action="append",
        default=[],
        help="extra argument for `kafka-scheduler run`, e.g. --scheduler-arg=--partitions=4",
    )
    soak_module.add_arguments(parser)


def run_one(name: str, args: argparse.Namespace, overrides: dict | None = None) -> dict:
    defaults = TARGETS[name]
    scenario_args = argparse.Namespace(**vars(args))
    scenario_args.scheduler_args = tuple(args.scheduler_args)
    for key, value in (overrides or {}).items():
        setattr(scenario_args, key, value)
    if scenario_args.count is None:
        scenario_args.count = defaults.get("count", 0)
    if scenario_args.duration is None:
        scenario_args.duration = defaults.get("duration", 60)
    if getattr(scenario_args, "minutes", None) is None:
        scenario_args.minutes = defaults.get("minutes", 10)
    if scenario_args.rate is None:
        scenario_args.rate = defaults.get("rate", 1000)
    if name == "steady":
        scenario_args.lead = 2.0 if args.lead is None else args.lead
    elif name == "idle":
        scenario_args.lead = 3.0 if args.lead is None else args.lead
    elif name == "herd" and args.lead is None:
        # Time to produce and ingest them all first; slower than planned and the run stops early, saying so.
        scenario_args.lead = HERD_LEAD_SPARE_S + scenario_args.count / INGEST_PLANNED_PER_S
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
    parameters = {
        k: v
        for k, v in vars(scenario_args).items()
        if k not in ("scenario", "keep", "bootstrap_servers", "command", "handler")
        and isinstance(v, (int, float, str, bool, type(None)))
    }
    parameters["scheduler_args"] = list(scenario_args.scheduler_args)
    path = write_result(name, parameters, figures, details=details)
    log(f"{name}: written to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    if hasattr(SCENARIOS[name], "chart"):  # soak: a PNG beside the JSON
        log(f"{name}: chart {SCENARIOS[name].chart(path)}")
    return figures


def main(args: argparse.Namespace) -> int:
    plan = PLAN if args.scenario == "all" else [(args.scenario, {})]
    if args.scenario in ("strikes", "all"):
        count = args.count if args.count is not None else TARGETS["strikes"]["count"]
        strikes_ = args.strikes if args.strikes is not None else TARGETS["strikes"]["strikes"]
        wave = args.wave if args.wave is not None else TARGETS["strikes"]["wave"]
        if not 0 < strikes_ <= count or wave < 1:
            log(
                f"strikes: need 0 < --strikes <= --count and --wave >= 1 "
                f"(got --count {count:,}, --strikes {strikes_:,}, --wave {wave:,})"
            )
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
