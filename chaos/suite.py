"""Runs the crash suite against a local broker and the real `kafka-scheduler run` job.

    kafka-scheduler chaos [--pace full|keep-up] [--count N] [--kills 5] [--broker-restarts 1] [--minutes 4]
                          [--seed S] [--keep] [--scheduler-arg=--exactly-once] [--expect-no-duplicates]

See chaos/plan.py for what is sent and when, chaos/checker.py for the rules, docs/chaos.md for the method.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import shutil
import tempfile
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from bench.harness import git_commit, machine
from kafka_scheduler.client.encoders import DIALECTS, effective_due, encode
from kafka_scheduler.engine.spark.checkpoint import committed_offsets, last_committed_batch
from kafka_scheduler.harness.job_process import JobProcess
from kafka_scheduler.harness.topic_reader import TopicReader
from kafka_scheduler.harness.waiting import wait_until
from kafka_scheduler.kafka.local_broker import LocalBroker, free_port
from kafka_scheduler.kafka.topics import wait_for_broker

from .checker import DELIVERY_ID, Delivery, Sent, Verdict, check, value_for, version_of
from .plan import FULL_COUNT, KEEP_UP_PER_S, PACES, Plan, make_plan, paced

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "chaos" / "results"
DESTINATIONS = 2
PARTITIONS = 2
SETTLE_TIMEOUT_S = 600.0  # after the last due time, how long to wait for the expected deliveries
# ... or less: once every request is committed, the job has committed a batch since its last start, and neither a
# commit nor a delivery came for this long, nothing more is coming (a run that lost something ends sooner).
QUIET_S = 60.0


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} chaos: {message}", flush=True)


# ---------------------------------------------------------------- watching the checkpoint


class CommitWatcher(threading.Thread):
    """Notes, for each committed batch, when it was first seen and the input offsets it covers, so that a
    request's ``committed_ms`` (the first time a commit covered it) can be looked up afterwards."""

    def __init__(self, checkpoint: Path, interval: float = 0.1):
        super().__init__(daemon=True, name="chaos-commit-watcher")
        self.checkpoint, self.interval = checkpoint, interval
        self.seen: dict[tuple[str, int], tuple[list[int], list[int]]] = {}  # (topic, partition) -> (ms, offsets)
        self.latest: dict[tuple[str, int], int] = {}
        self.last_commit = time.time()
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        last = None
        while not self.stopping.wait(self.interval):
            batch = last_committed_batch(self.checkpoint)
            if batch is None or batch == last:
                continue
            now = int(time.time() * 1000)
            try:
                offsets = committed_offsets(self.checkpoint)
            except (OSError, ValueError):  # the offsets file of a batch being committed: read it next round
                continue
            last = batch
            self.last_commit = time.time()
            with self._lock:
                for topic, partitions in offsets.items():
                    for partition, offset in partitions.items():
                        times, ends = self.seen.setdefault((topic, partition), ([], []))
                        # Offsets only grow; a redone batch (after a kill) repeats its predecessor's ends.
                        if not ends or offset > ends[-1]:
                            times.append(now)
                            ends.append(offset)
                            self.latest[(topic, partition)] = offset

    def committed_ms(self, topic: str, partition: int, offset: int) -> int | None:
        with self._lock:
            times, ends = self.seen.get((topic, partition), ([], []))
            index = bisect.bisect_right(ends, offset)  # the first end beyond the record: the batch covered it
            return times[index] if index < len(times) else None

    def covers(self, ends: dict[tuple[str, int], int]) -> bool:
        with self._lock:
            return all(self.latest.get(tp, 0) >= end for tp, end in ends.items())


# ---------------------------------------------------------------- sending


@dataclass
class Outgoing:
    planned: object  # PlannedRequest
    topic: str
    key: bytes
    value: bytes | None
    headers: list
    due_ms: int | None
    partition: int | None = None
    offset: int | None = None
    error: str | None = None


def padding(sid: str, version: str) -> int:
    """Values of 8-71 bytes of padding: versions differ in length as well as in content."""
    return zlib.crc32(f"{sid}|{version}".encode()) % 64 + 8


class Sender(threading.Thread):
    """Produces the planned requests, each at its send time, and notes where each one landed."""

    def __init__(self, bootstrap: str, plan: Plan, t0_ms: int, inputs: dict[str, str], destinations: list[str]):
        super().__init__(daemon=True, name="chaos-sender")
        self.t0_ms = t0_ms
        # Long timeouts: requests sent while the broker restarts wait in the producer and go when it is back
        # (its refused connections meanwhile are expected: not logged).
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 600_000,
                "log_level": 0,
                "queue.buffering.max.messages": 2_000_000,
            }
        )
        topic_of = {dialect: topic for topic, dialect in inputs.items()}
        self.outgoing = [self._encode(r, topic_of[r.dialect], destinations) for r in plan.requests]
        self.sent = 0
        self.failure: BaseException | None = None

    def _encode(self, request, topic: str, destinations: list[str]) -> Outgoing:
        due_ms = None
        due = None
        value = None
        if request.due_s is not None:
            due = effective_due(
                request.dialect, datetime.fromtimestamp((self.t0_ms + round(request.due_s * 1000)) / 1000, UTC)
            )
            due_ms = round(due.timestamp() * 1000)
            value = value_for(request.sid, request.version, padding(request.sid, request.version))
        record = encode(
            request.dialect,
            request.action,
            request_id=request.sid,
            topic=destinations[request.destination] if due else None,
            due=due,
            key=request.sid if due else None,
            value=value,
        )
        # A native cancel has no key of its own; the id as key routes it to the partition of the id's other requests.
        return Outgoing(
            request, topic, record.key or request.sid.encode(), record.value, list(record.headers or ()), due_ms
        )

    def run(self) -> None:
        try:
            for item in self.outgoing:
                send_at = self.t0_ms / 1000 + item.planned.at_s
                while (delay := send_at - time.time()) > 0:
                    self.producer.poll(min(delay, 0.1))
                self._produce(item)
            remaining = self.producer.flush(900)
            if remaining:
                raise RuntimeError(f"{remaining} requests still unacknowledged after 900 s")
        except BaseException as exc:
            self.failure = exc

    def _produce(self, item: Outgoing) -> None:
        def on_delivery(err, msg):
            if err is not None:
                item.error = str(err)
            else:
                item.partition, item.offset = msg.partition(), msg.offset()

        while True:
            try:
                self.producer.produce(
                    item.topic, key=item.key, value=item.value, headers=item.headers, on_delivery=on_delivery
                )
                break
            except BufferError:
                self.producer.poll(0.05)
        self.sent += 1
        self.producer.poll(0)


# ---------------------------------------------------------------- reading deliveries


class DeliveryCollector(threading.Thread):
    """Reads the destination topics from the start, for the whole run (read_committed, as an exactly-once consumer)."""

    def __init__(self, bootstrap: str, topics: list[str]):
        super().__init__(daemon=True, name="chaos-deliveries")
        self.reader = TopicReader(bootstrap, topics, committed=True, settings={"log_level": 0})
        self.reader.take = self.take
        self.deliveries: list[Delivery] = []
        self.versions: set[tuple[str, str]] = set()
        self.read_to: dict[tuple[str, int], int] = {}
        self.last_delivery = time.time()
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.reader.poll()
            positions = self.reader.positions()
            with self._lock:
                self.read_to.update(positions)
        self.reader.close()

    def take(self, message) -> None:
        delivery_ids = [v for k, v in message.headers() or [] if k == DELIVERY_ID]
        delivery = Delivery(
            message.key(),
            message.value(),
            message.timestamp()[1],
            delivery_ids[0] if len(delivery_ids) == 1 else None,
            f"{message.topic()}-{message.partition()}@{message.offset()}",
        )
        with self._lock:
            self.deliveries.append(delivery)
            self.last_delivery = time.time()
            key = version_of(message.value())
            if key:
                self.versions.add(key)

    def has(self, keys: set) -> bool:
        with self._lock:
            return keys <= self.versions

    def caught_up(self, bootstrap: str) -> bool:
        """Read up to the current end of every destination partition."""
        probe = TopicReader(
            bootstrap, sorted({tp.topic for tp in self.reader.partitions}), committed=True, settings={"log_level": 0}
        )
        try:
            ends = probe.ends()
        finally:
            probe.close()
        with self._lock:
            return all(end == 0 or self.read_to.get(tp, 0) >= end for tp, end in ends.items())


# ---------------------------------------------------------------- faults


@dataclass
class Options:
    count: int | None = FULL_COUNT  # None: as many as the pace allows (plan.paced)
    kills: int = 5
    broker_restarts: int = 1
    minutes: float = 4.0
    seed: int | None = None
    scheduler_args: tuple = ()
    expect_no_duplicates: bool = False
    keep: bool = False
    dialects: tuple = DIALECTS
    workdir: Path | None = None
    results_dir: Path | None = RESULTS_DIR
    restart_allowance_s: float | None = None  # least time between faults (default: plan.RESTART_ALLOWANCE_S)
    pace: str = "full"  # plan.PACES: "keep-up" sends few enough per second that the job stays ahead of its due times


@dataclass
class Outcome:
    verdict: Verdict
    figures: dict
    faults: list = field(default_factory=list)
    result_path: Path | None = None

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.figures.get("unexpected_exits")


class Run:
    def __init__(self, options: Options):
        self.options = options
        self.seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1_000_000)
        self.workdir = options.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
        self.broker: LocalBroker | None = None
        self.scheduler: JobProcess | None = None
        self.faults: list[dict] = []
        self.unexpected_exits: list[str] = []
        self.expected_down = False
        self.batch_at_start: int | None = None

    # The job must keep running between our own kills; if it stops by itself, that is noted and it is restarted.
    def guard(self) -> None:
        if self.expected_down or self.scheduler.process.poll() is None:
            return
        code = self.scheduler.process.returncode
        tail = self.scheduler.log()[-1500:]
        log(f"the job exited by itself (code {code}); restarting it. Log tail:\n{tail}")
        self.unexpected_exits.append(f"exit code {code} at {time.strftime('%H:%M:%S')}")
        self.start_scheduler()

    def start_scheduler(self) -> float:
        started = time.monotonic()
        self.expected_down = True
        self.batch_at_start = last_committed_batch(self.workdir / "checkpoint")
        self.scheduler.start(timeout=300)
        self.expected_down = False
        return time.monotonic() - started

    def committed_since_start(self) -> bool:
        batch = last_committed_batch(self.workdir / "checkpoint")
        return batch is not None and (self.batch_at_start is None or batch > self.batch_at_start)

    def sleep_until(self, instant_s: float) -> None:
        while time.time() < instant_s:
            self.guard()
            time.sleep(min(0.05, max(0.0, instant_s - time.time())))

    def execute(self) -> Outcome:
        o = self.options
        plan_kwargs = {} if o.restart_allowance_s is None else {"allowance_s": o.restart_allowance_s}
        count, spread_s = paced(o.count, o.pace, o.kills, o.broker_restarts, o.minutes * 60, **plan_kwargs)
        self.count = count
        plan = make_plan(
            count, o.kills, o.broker_restarts, spread_s, self.seed, list(o.dialects), DESTINATIONS, **plan_kwargs
        )
        log(
            f"pace {o.pace}: {count / plan.end_s:,.0f} schedules/s ({len(plan.requests) / plan.end_s:,.0f} "
            f"requests/s) over {plan.end_s:.0f}s"
        )
        log(
            f"seed {self.seed}; work folder {self.workdir}; {len(plan.requests):,} requests for {count:,} "
            f"schedules ({', '.join(f'{k} {v:,}' for k, v in plan.counts.items() if k != 'schedules')}); faults at "
            + ", ".join(f"{f.at_s:.1f}s {f.kind}" for f in plan.faults)
            + f"; last due at {plan.end_s:.0f}s"
        )
        self.broker = LocalBroker(free_port(), self.workdir / "broker", heap="512m")
        log(f"starting a broker on port {self.broker.port}")
        self.broker.start()
        bootstrap = self.broker.bootstrap_servers
        admin = wait_for_broker(bootstrap)
        app_id = f"chaos-{uuid.uuid4().hex[:6]}"
        destinations = [f"chaos-out-{i}" for i in range(DESTINATIONS)]
        inputs = {f"{app_id}-schedule-requests": "native"} if "native" in o.dialects else {}
        inputs.update({f"chaos-in-{d}": d for d in o.dialects if d != "native"})
        topics = [
            NewTopic(t, PARTITIONS, 1, config={"message.timestamp.type": "LogAppendTime"}) for t in destinations
        ] + [NewTopic(t, PARTITIONS, 1) for t in inputs]
        for future in admin.create_topics(topics).values():
            future.result()
        flags = tuple(a for topic, dialect in inputs.items() for a in ("--input", f"{topic}:{dialect}"))
        self.scheduler = JobProcess(
            bootstrap, app_id, self.workdir / "checkpoint", self.workdir / "scheduler.log", (*flags, *o.scheduler_args)
        )
        log("starting the job")
        first_start = self.start_scheduler()
        log(f"job running after {first_start:.0f}s")
        watcher = CommitWatcher(self.workdir / "checkpoint")
        watcher.start()
        collector = DeliveryCollector(bootstrap, destinations)
        collector.start()
        t0_ms = (math.ceil(time.time()) + 2) * 1000
        sender = Sender(bootstrap, plan, t0_ms, inputs, destinations)
        sender.start()
        t0 = t0_ms / 1000
        try:
            for fault in plan.faults:
                self.sleep_until(t0 + fault.at_s)
                self.inject(fault, t0, sender)
            expected = {(r.sid, r.version) for r in self.last_requests(plan) if r.action != "cancel"}
            log(
                f"faults done; waiting for the sender, then for {len(expected):,} expected deliveries "
                f"(the last is due at {plan.end_s:.0f}s)"
            )
            wait_until(lambda: not sender.is_alive(), SETTLE_TIMEOUT_S, "the sender", guard=self.guard)
            if sender.failure:
                raise RuntimeError(f"sending failed: {sender.failure}")
            errors = [item.error for item in sender.outgoing if item.error]
            if errors:
                raise RuntimeError(f"{len(errors)} requests were refused by the broker, e.g. {errors[0]}")
            ends: dict[tuple[str, int], int] = {}
            for item in sender.outgoing:
                tp = (item.topic, item.partition)
                ends[tp] = max(ends.get(tp, 0), item.offset + 1)
            self.sleep_until(t0 + plan.end_s)

            def settled() -> bool:
                if not (watcher.covers(ends) and self.committed_since_start()):
                    return False
                if collector.has(expected):
                    return True
                if time.time() - max(watcher.last_commit, collector.last_delivery) > QUIET_S:
                    log(
                        f"every request committed, nothing new for {QUIET_S:.0f}s, some expected deliveries "
                        f"missing: checking what arrived"
                    )
                    return True
                return False

            try:
                wait_until(settled, SETTLE_TIMEOUT_S, "every expected delivery", interval=1.0, guard=self.guard)
            except TimeoutError as exc:  # a timeout: what did arrive is checked all the same
                log(f"{exc}: checking what arrived")
            # Stragglers: anything still held or being written (a forbidden delivery would come now too).
            time.sleep(5)
            self.expected_down = True
            self.scheduler.stop()
            wait_until(lambda: collector.caught_up(bootstrap), 120, "reading every delivery", interval=0.5)
        finally:
            collector.stopping.set()
            watcher.stopping.set()
            collector.join(30)
            self.expected_down = True
            if self.scheduler.process is not None and self.scheduler.process.poll() is None:
                self.scheduler.stop()
            self.broker.stop()

        sent = [self.sent_record(item, watcher) for item in sender.outgoing]
        verdict = check(sent, collector.deliveries, expect_no_duplicates=o.expect_no_duplicates)
        figures = {
            "count": count,
            "pace": o.pace,
            "schedules_per_s": round(count / plan.end_s, 1),
            "kills": sum(f["kind"] != "broker" for f in self.faults),
            "broker_restarts": sum(f["kind"] == "broker" for f in self.faults),
            **{k: v for k, v in verdict.figures.items() if k != "schedules"},
            "unexpected_exits": len(self.unexpected_exits),
            "seed": self.seed,
            "dialects": list(o.dialects),
            "requests_by_kind": plan.counts,
            "first_start_s": round(first_start, 1),
            "run_s": round(time.time() - t0, 1),
        }
        outcome = Outcome(verdict, figures, self.faults)
        if o.keep:
            self.write_logs(sent, collector.deliveries)
        return outcome

    @staticmethod
    def last_requests(plan: Plan):
        last = {}
        for request in plan.requests:
            if request.sid not in last or request.seq > last[request.sid].seq:
                last[request.sid] = request
        return last.values()

    def inject(self, fault, t0: float, sender: Sender) -> None:
        started = time.time()
        if fault.kind == "broker":
            log(f"{started - t0:.1f}s: stopping the broker")
            self.broker.stop()
            down = time.time()
            time.sleep(3)
            self.broker.start(timeout=120)
            log(f"broker back after {time.time() - down:.1f}s")
            self.faults.append(
                {
                    "kind": "broker",
                    "planned_s": fault.at_s,
                    "at_s": round(started - t0, 2),
                    "down_s": round(time.time() - down, 1),
                }
            )
            return
        # A kill before the job has committed anything since its last start would only repeat its start-up (on a
        # loaded machine, a restart can outlast the planned gap): wait for one commit first.
        wait_until(
            self.committed_since_start, 600, "a commit since the job's last start", interval=0.05, guard=self.guard
        )
        killed = self.scheduler.kill_tree()
        at = time.time() - t0
        sent_share = sender.sent / max(1, len(sender.outgoing))
        log(
            f"{at:.1f}s: killed the job ({fault.kind}; {killed} processes; last commit: batch "
            f"{last_committed_batch(self.workdir / 'checkpoint')}); restarting it on the same checkpoint"
        )
        self.expected_down = True
        restart = self.start_scheduler()
        log(f"job running again after {restart:.0f}s")
        self.faults.append(
            {
                "kind": fault.kind,
                "planned_s": fault.at_s,
                "at_s": round(at, 2),
                "late_s": round(at - fault.at_s, 2),
                "requests_sent_share": round(sent_share, 3),
                "restart_s": round(restart, 1),
            }
        )

    @staticmethod
    def sent_record(item: Outgoing, watcher: CommitWatcher) -> Sent:
        r = item.planned
        committed = None if item.offset is None else watcher.committed_ms(item.topic, item.partition, item.offset)
        if r.action == "cancel":
            return Sent(r.sid, r.seq, "cancel", committed_ms=committed)
        return Sent(
            r.sid,
            r.seq,
            r.action,
            r.version,
            item.due_ms,
            r.sid.encode(),
            value_for(r.sid, r.version, padding(r.sid, r.version)),
            committed,
        )

    def write_logs(self, sent: list[Sent], deliveries: list[Delivery]) -> None:
        with open(self.workdir / "requests.jsonl", "w") as out:
            for s in sent:
                out.write(
                    json.dumps(
                        {
                            "sid": s.sid,
                            "seq": s.seq,
                            "action": s.action,
                            "due_ms": s.due_ms,
                            "committed_ms": s.committed_ms,
                        }
                    )
                    + "\n"
                )
        with open(self.workdir / "deliveries.jsonl", "w") as out:
            for d in deliveries:
                out.write(
                    json.dumps(
                        {
                            "where": d.where,
                            "key": (d.key or b"").decode(errors="replace"),
                            "value": (d.value or b"")[:40].decode(errors="replace"),
                            "appended_ms": d.appended_ms,
                            "delivery_id": None if d.delivery_id is None else d.delivery_id.decode(),
                        }
                    )
                    + "\n"
                )


def run_suite(options: Options) -> Outcome:
    run = Run(options)
    try:
        outcome = run.execute()
    finally:
        if run.broker is not None:
            run.broker.stop()
        if not options.keep and options.workdir is None:
            shutil.rmtree(run.workdir, ignore_errors=True)
    if options.results_dir is not None:
        outcome.result_path = write_result(options, outcome)
    return outcome


def write_result(options: Options, outcome: Outcome) -> Path:
    options.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.results_dir / f"{stamp}-chaos.json"
    parameters = {
        "count": outcome.figures["count"],
        "pace": options.pace,
        "kills": options.kills,
        "broker_restarts": options.broker_restarts,
        "minutes": options.minutes,
        "scheduler_args": list(options.scheduler_args),
        "expect_no_duplicates": options.expect_no_duplicates,
    }
    record = {
        "scenario": "chaos",
        "finished_at": stamp,
        "git_commit": git_commit(),
        "machine": machine(),
        "parameters": parameters,
        "figures": outcome.figures,
        "faults": outcome.faults,
        "passed": outcome.ok,
        "failures": outcome.verdict.failures,
        "examples": outcome.verdict.examples,
    }
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


SUMMARY = (
    "count",
    "kills",
    "broker_restarts",
    "expected",
    "delivered",
    "on_time",
    "lost",
    "early",
    "duplicates",
    "cancelled_delivered",
    "stale_version",
    "wrong_content",
    "unknown_delivery",
    "duplicate_id_mismatch",
    "superseded_late",
    "unexpected_exits",
)


def summary(outcome: Outcome) -> str:
    return ", ".join(f"{name.replace('_', '-')}={outcome.figures[name]:,}" for name in SUMMARY)


# ---------------------------------------------------------------- command line


DESCRIPTION = """\
The crash suite. Starts a local broker and the scheduler job, sends --count schedules in every dialect
(native, karafka, etf1, sky-avro, sky-json) spread over --minutes, with replaces and cancels (each sent at
least 10 s before the due time it acts on) and some already due when sent; kills the job's whole process
tree with SIGKILL --kills times (while it ingests a burst, while it writes a herd due at one instant, while
it writes steady deliveries) and restarts it on the same checkpoint; stops and starts the broker
--broker-restarts times on the same data and port. Then reads every delivery and checks it against the
request log: every schedule not cancelled delivered at least once, none before its due time, none after a
replace or cancel that the job had committed before that due time, each with the content of its latest
version, duplicates counted and each pair with the same x-scheduler-delivery-id.

Prints the figures, writes them to chaos/results/<UTC time>-chaos.json and exits 1 on any loss, early
delivery or broken rule (and on duplicates with --expect-no-duplicates). Method: docs/chaos.md.
"""


MODES = ("at-least-once", "exactly-once", "both")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pace",
        choices=PACES,
        default="full",
        help=f"full: --count schedules (default {FULL_COUNT:,}, ~300 requests/s; the job falls "
        f"behind on 2 cores); keep-up: at most {KEEP_UP_PER_S:.0f} schedules per second of the "
        f"plan (default --count follows: ~20,000), so the job stays ahead of its due times "
        f"between the faults and deliveries are written at their instant, where an early one "
        f"would show; the same faults either way (make chaos runs keep-up)",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help=f"schedule ids (default {FULL_COUNT:,} at --pace full; at keep-up "
        f"{KEEP_UP_PER_S:.0f} per second of the plan, and a larger count stretches the plan)",
    )
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs of the job (default 5)")
    parser.add_argument("--broker-restarts", type=int, default=1, help="broker stops and starts (default 1)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=4.0,
        help="spread of the due times (default 4); stretched to leave each fault ~50 s, the "
        "time the job takes to restart",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the plan (default: random, printed)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work folder (broker data, checkpoint, job log, requests.jsonl and deliveries.jsonl)",
    )
    parser.add_argument(
        "--scheduler-arg",
        dest="scheduler_args",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `kafka-scheduler run`, e.g. --scheduler-arg=--lookahead=5s",
    )
    parser.add_argument(
        "--expect-no-duplicates",
        action="store_true",
        help="fail on any duplicate delivery (implied by --mode exactly-once)",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="both",
        help="delivery mode of the job: at-least-once, exactly-once (the job runs with "
        "--exactly-once and any duplicate fails the run), or both, one run after the other "
        "(default)",
    )


def main(args: argparse.Namespace) -> int:
    if (args.count is not None and args.count < 1) or args.kills < 0 or args.broker_restarts < 0 or args.minutes <= 0:
        log("need --count >= 1, --kills >= 0, --broker-restarts >= 0 and --minutes > 0")
        return 2
    modes = ["at-least-once", "exactly-once"] if args.mode == "both" else [args.mode]
    codes = []
    for mode in modes:
        exactly_once = mode == "exactly-once"
        log(f"mode: {mode}")
        options = Options(
            count=args.count,
            kills=args.kills,
            broker_restarts=args.broker_restarts,
            minutes=args.minutes,
            seed=args.seed,
            pace=args.pace,
            scheduler_args=tuple(args.scheduler_args) + (("--exactly-once",) if exactly_once else ()),
            expect_no_duplicates=args.expect_no_duplicates or exactly_once,
            keep=args.keep,
        )
        codes.append(_report(mode, run_suite(options)))
    if len(modes) > 1:
        log("both modes: " + ", ".join(f"{m} {'PASSED' if c == 0 else 'FAILED'}" for m, c in zip(modes, codes)))
    return max(codes)


def _report(mode: str, outcome: Outcome) -> int:
    log(summary(outcome))
    for fault in outcome.faults:
        log("  fault: " + ", ".join(f"{k}={v}" for k, v in fault.items()))
    if outcome.result_path:
        log(f"written to {outcome.result_path}")
    if not outcome.ok:
        failures = {
            **outcome.verdict.failures,
            **(
                {"unexpected_exits": outcome.figures["unexpected_exits"]}
                if outcome.figures.get("unexpected_exits")
                else {}
            ),
        }
        log(f"FAILED: {failures}")
        for kind, cases in outcome.verdict.examples.items():
            log(f"  {kind}: {cases[:3]}")
        return 1
    log(f"{mode}: PASSED")
    return 0
