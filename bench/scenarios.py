"""The benchmark scenarios, by name (SCENARIOS), their arguments and the plan of `make bench`; and four of them here
(steady, ingest, herd, pending), the others in modules of their own. Each runs against a broker and the real
`kafka-scheduler run` job, prints its figures and appends a JSON result to bench/results/.

    kafka-scheduler bench steady --rate 1000 --duration 60 [--lead 2] [--pending 1000000]
    kafka-scheduler bench soak [--duration 3600] (bench/soak.py)
    kafka-scheduler bench ingest --count 1000000 [--no-ids | --mix] [--spread DAYS]
    kafka-scheduler bench herd --count 10000000 [--no-ids] [--lead S]
    kafka-scheduler bench pending --count 10000000
    kafka-scheduler bench restart --count 1000000   (bench/restart.py)
    kafka-scheduler bench idle [--count 10000] [--duration 60]   (bench/idle.py)
    kafka-scheduler bench strikes --count 1000000 --strikes 500000 --wave 5000 [--deliver]   (bench/strikes.py)
    kafka-scheduler bench cron --count 1000000 [--minutes 10]   (bench/cron_firings.py)
    kafka-scheduler bench hostile --count 1000000   (bench/hostile.py)
    kafka-scheduler bench mixed --count 1000000 [--ordinary-rate 200] [--cancels-keyed-apart]   (bench/mixed.py)
    kafka-scheduler bench backlog --count 1000000 [--ordinary-rate 200] [--cancels-keyed-apart]   (bench/backlog.py)
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

hostile: --count generated hostile records in every dialect through the job, counters checked (bench/hostile.py;
not part of `make bench`).
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
from kafka_scheduler.kafka.local_broker import free_port
from kafka_scheduler.protocol import DIALECT_NAMES

from . import mixed as mixed_scenario
from . import ordinary as ordinary_traffic
from . import soak as soak_module
from .backlog import backlog
from .cron_firings import cron
from .harness import (
    INGEST_PLANNED_PER_S,
    DeliveryReader,
    EndOffsets,
    Environment,
    RequestProducer,
    batch_profile,
    directory_bytes,
    index_entries,
    log,
    percentile,
    wait_until,
    write_result,
)
from .hostile import hostile
from .idle import idle
from .job_load import FAR_FUTURE_MS, ingest_requests, settle_and_count, warmed_up
from .restart import restart
from .strikes import STRIKES_PER_S_PLANNED, strikes


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
    settle_and_count(reader, total, args.lead + 120, "all deliveries")
    appended = reader.appended()
    figures = reader.lateness_figures()
    figures["deliveries_per_s"] = (
        round((len(appended) - 1) / max(1e-9, (appended[-1] - appended[0]) / 1000)) if len(appended) > 1 else None
    )
    figures.update(_send_to_delivery(reader.sent_deliveries, "already_due"))
    figures.update(
        {
            "lateness_p99_by_10s_s": reader.lateness_p99_by_window(10),
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


# Start-up milestones in the job's log (pipeline.py), in the order they appear.
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
    "backlog": backlog,
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
    "mixed": {"count": 1_000_000, "after": 30},
    "backlog": {"count": 1_000_000, "after": 40},
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
    ("backlog", {}),
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
        help="ingest/herd/pending/restart/strikes/hostile/cron/mixed/backlog: number of requests (default 1,000,000; "
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
    ordinary_traffic.add_arguments(parser)
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
    if getattr(scenario_args, "after", None) is None:
        scenario_args.after = defaults.get("after", 30)
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
