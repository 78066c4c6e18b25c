"""What every benchmark scenario needs: a broker, the real scheduler job, a fast producer of
native requests, a consumer that timestamps deliveries, process memory and CPU time, the job's
log lines as they appear, and the results file.

Lateness is measured on the broker's clock: destination topics use LogAppendTime, so a
delivered record's timestamp is when the broker appended it; each request carries its
due time (epoch ms) in a user header, which the scheduler passes through.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import subprocess
import time
import uuid
import zipfile
from array import array
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from kafka_scheduler.client.encoders import encode, format_instant
from kafka_scheduler.engine.spark.checkpoint import committed_offsets, last_committed_batch
from kafka_scheduler.harness.job_process import JobProcess
from kafka_scheduler.harness.topic_reader import TopicReader
from kafka_scheduler.harness.waiting import wait_until as harness_wait_until
from kafka_scheduler.kafka.local_broker import LocalBroker, free_port
from kafka_scheduler.kafka.topics import wait_for_broker

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
DUE_HEADER = "bench-due-ms"
# The default --lead of herd and mixed leaves time to ingest the herd at this rate: ingest with ids ran at 11-17k/s
# (2026-11-29 to 12-02), and the fresh-clone bench mixed of 2026-12-02 gave up at 11,241/s against 12,000 planned.
INGEST_PLANNED_PER_S = 8_000
SENT_HEADER = "bench-sent-ms"  # only on requests whose send time is measured apart (steady's already-due ones)


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} bench: {message}", flush=True)


def wait_until(
    condition: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.2,
    progress: Callable[[], str] | None = None,
    every: float = 10.0,
):
    """The harness's wait, its progress said in the bench's log."""
    return harness_wait_until(condition, timeout, what, interval=interval, progress=progress, every=every, say=log)


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


# ---------------------------------------------------------------- machine and results


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": java[0] if java else "?",
    }


def git_commit() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return (result.stdout.strip() or "unknown") + ("-dirty" if dirty else "")


def write_result(scenario: str, parameters: dict, figures: dict, notes: str = "", details: dict | None = None) -> Path:
    """``details``: raw series (e.g. one time per wave) kept in the file but too long to print."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{stamp}-{scenario}.json"
    record = {
        "scenario": scenario,
        "finished_at": stamp,
        "git_commit": git_commit(),
        "machine": machine(),
        "parameters": parameters,
        "figures": figures,
        "notes": notes,
    }
    if details:
        record["details"] = details
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


# ---------------------------------------------------------------- processes


def cpu_between(before: dict, after: dict, seconds: float) -> dict:
    """Percent of one core used between two ``process_tree_cpu`` samples, in all and per group and process."""
    groups = {"jvm": 0.0, "python_driver": 0.0, "python_workers": 0.0, "other": 0.0}
    processes = []
    for key, (group, command, used) in after.items():
        delta = used - (before[key][2] if key in before else 0.0)
        groups[group] += delta
        processes.append(
            {"pid": key[0], "group": group, "command": command, "cpu_s": round(delta, 2), "new": key not in before}
        )
    # A process that ended without being reaped inside the tree: its time since ``before`` is lost, say so.
    gone = [
        {"pid": key[0], "group": group, "command": command}
        for key, (group, command, _) in before.items()
        if key not in after
    ]
    total = sum(groups.values())
    return {
        "cpu_percent_of_one_core": round(100 * total / seconds, 2),
        "cpu_seconds": round(total, 2),
        **{f"cpu_percent_{g}": round(100 * v / seconds, 2) for g, v in groups.items()},
        "processes": sorted(processes, key=lambda p: -p["cpu_s"]),
        "ended_processes": gone,
    }


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def checkpoint_breakdown(path: Path) -> dict:
    """Where a checkpoint's bytes are, to find what grows: the state store's changelogs, snapshots (zip) and
    RocksDB files (sst) apart, the query's logs, and how many state versions partition 0 keeps."""
    kinds: Counter = Counter()
    versions = set()
    for file in Path(path).rglob("*"):
        if not file.is_file() or file.name.endswith(".crc"):
            continue
        parts = file.relative_to(path).parts
        if parts[0] == "state":
            kind = file.suffix.lstrip(".") if file.suffix in (".changelog", ".zip", ".sst") else "state_other"
            if file.suffix in (".changelog", ".zip") and parts[-2] == "0":
                versions.add(file.stem.split("_")[0])
        else:
            kind = parts[0]
        kinds[kind] += file.stat().st_size
    return {
        **{f"{kind}_mib": round(size / 2**20, 1) for kind, size in sorted(kinds.items())},
        "state_versions_of_partition_0": len(versions),
    }


class Scheduler(JobProcess):
    """The job of a scenario (the harness's JobProcess), in a folder of its own, with the peak of its memory."""

    def __init__(self, bootstrap: str, app_id: str, workdir: Path, extra_args: tuple = ()):
        super().__init__(
            bootstrap, app_id, workdir / "checkpoint", workdir / "scheduler.log", extra_args, follow_interval=0.02
        )
        self.workdir = workdir
        self.peak_rss: dict[str, int] = {}

    @property
    def checkpoint(self) -> Path:
        return self.checkpoint_dir

    def start(self, wait: bool = True, timeout: float = 300) -> Scheduler:
        return super().start(timeout=timeout, wait=wait)

    def sample_memory(self) -> dict[str, int]:
        sample = self.memory()
        if sum(sample.values()) > sum(self.peak_rss.values() or [0]):
            self.peak_rss = sample
        return sample

    def committed(self, topic: str) -> int:
        return sum(committed_offsets(self.checkpoint).get(topic, {}).values())

    def stop(self, timeout: float = 300) -> int:
        return super().stop(timeout, kill_after=True)


INDEX_LINE = r"index: (\d+) entries"


class LiveState:
    """Rows and bytes of each state variable of a checkpoint's last committed batch, read with Spark's state data
    source as `inspect` reads it: what the state holds, apart from the versions the checkpoint keeps on disk."""

    def __init__(self, checkpoint: Path):
        from kafka_scheduler.config import Config
        from kafka_scheduler.engine.spark.session import build_session

        self.checkpoint = checkpoint
        self.spark = build_session(
            Config(master="local[1]", app_id="bench-state-reader", checkpoint_dir=str(checkpoint))
        )

    def variables(self) -> list[str]:
        """The variables the newest snapshot of partition 0 names (Spark's column families, its timers left out)."""
        snapshots = sorted((self.checkpoint / "state" / "0" / "0").glob("*.zip"), key=lambda z: int(z.stem))
        if not snapshots:  # none uploaded yet (Spark writes them in the background)
            return []
        with zipfile.ZipFile(snapshots[-1]) as snapshot:
            metadata = json.loads(snapshot.read("metadata").decode().split("\n", 1)[1])
        return sorted(
            name for name in metadata["columnFamilyMapping"] if name != "default" and not name.startswith("$")
        )

    def sample(self) -> dict:
        from pyspark.sql import functions as F

        batch = last_committed_batch(self.checkpoint)
        sizes = {"batch": batch}
        for name in self.variables():
            frame = (
                self.spark.read.format("statestore")
                .option("stateVarName", name)
                .option("batchId", batch)
                .load(str(self.checkpoint))
            )
            columns = [F.col(c) for c in frame.columns if c != "partition_id"]
            # The length of each row as JSON: binary columns count as their base64 text, a stable relative size.
            row = frame.select(
                F.count(F.lit(1)).alias("rows"), F.sum(F.length(F.to_json(F.struct(*columns)))).alias("size")
            ).first()
            sizes[name] = {"rows": row.rows, "mib": round((row.size or 0) / 2**20, 1)}
        return sizes

    def close(self) -> None:
        self.spark.stop()


def index_entries(scheduler: Scheduler) -> int | None:
    """The id index's size as the job last logged it (contract: ``index: N entries`` whenever N changes)."""
    found = scheduler.last(INDEX_LINE)
    return int(found[1].group(1)) if found else None


class EndOffsets:
    """The number of records in a topic, from a consumer kept open (cheap enough to poll every 0.2 s)."""

    def __init__(self, bootstrap: str, topic: str):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-offsets"})
        partitions = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.partitions = [TopicPartition(topic, p) for p in partitions]

    def total(self) -> int:
        return sum(self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in self.partitions)

    def close(self) -> None:
        self.consumer.close()


class Environment:
    """A broker (ours, on a free port, unless one is given) and helpers around it."""

    def __init__(self, workdir: Path, bootstrap: str | None = None):
        self.workdir = workdir
        self.broker = None
        self.schedulers: list[Scheduler] = []
        if bootstrap is None:
            self.broker = LocalBroker(free_port(), workdir / "broker", heap="1g")
            log("starting a local broker")
            self.broker.start()
            bootstrap = self.broker.bootstrap_servers
        self.bootstrap = bootstrap
        self.admin = wait_for_broker(bootstrap)

    def close(self) -> None:
        # A scenario that failed half-way leaves its job running: stop it before its broker goes.
        for scheduler in self.schedulers:
            scheduler.stop()
        if self.broker is not None:
            self.broker.stop()

    def topic(self, prefix: str, partitions: int = 2, log_append_time: bool = True) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        config = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
        for future in self.admin.create_topics([NewTopic(name, partitions, 1, config=config)]).values():
            future.result()
        wait_until(lambda: name in self.admin.list_topics(timeout=10).topics, 30, f"topic {name}")
        return name

    def scheduler(self, app_id: str | None = None, extra_args: tuple = ()) -> Scheduler:
        app_id = app_id or f"bench-{uuid.uuid4().hex[:6]}"
        workdir = self.workdir / app_id
        workdir.mkdir(parents=True, exist_ok=True)
        scheduler = Scheduler(self.bootstrap, app_id, workdir, extra_args)
        self.schedulers.append(scheduler)
        return scheduler

    def end_offsets(self, topic: str) -> int:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-offsets"})
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        total = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
        consumer.close()
        return total


class RequestProducer:
    """Produces requests (ADD, REPLACE, CANCEL) as fast as librdkafka batches them: native ones written out here,
    those of the other dialects with the project's encoders (``dialect``).

    Every request of an id is keyed by the id, so librdkafka's default partitioner (a hash of
    the key) sends them all to one partition and the scheduler reads them in the order sent.
    """

    def __init__(self, bootstrap: str, requests_topic: str, dialect: str = "native"):
        self.topic = requests_topic
        self.dialect = dialect
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "compression.type": "lz4",
                "acks": "all",
                "enable.idempotence": True,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        self.sent = 0
        self.failed = 0

    def _on_delivery(self, err, _msg) -> None:
        if err is not None:
            self.failed += 1

    @staticmethod
    def _message_headers(destination: str, due_ms: int) -> list:
        deliver_at = format_instant(datetime.fromtimestamp(due_ms / 1000, UTC))
        return [
            (DUE_HEADER, str(due_ms).encode()),
            ("x-scheduler-deliver-to", destination.encode()),
            ("x-scheduler-deliver-at", deliver_at.encode()),
        ]

    def _produce(self, key: bytes | None, value: bytes | None, headers: list) -> None:
        while True:
            try:
                self.producer.produce(self.topic, key=key, value=value, headers=headers, on_delivery=self._on_delivery)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.sent += 1
        if self.sent % 10_000 == 0:
            self.producer.poll(0)

    def _encoded(
        self, action: str, destination: str | None, due_ms: int | None, request_id: str, value: bytes | None
    ) -> None:
        due = None if due_ms is None else datetime.fromtimestamp(due_ms / 1000, UTC)
        headers = (
            []
            if due_ms is None or (self.dialect == "etf1" and action == "cancel")
            else [(DUE_HEADER, str(due_ms).encode())]
        )
        record = encode(
            self.dialect, action, request_id=request_id, topic=destination, due=due, value=value, headers=headers
        )
        self._produce(record.key, record.value, list(record.headers or ()))

    def add(
        self,
        destination: str,
        due_ms: int,
        request_id: str | None,
        value: bytes = b"payload",
        sent_ms: int | None = None,
    ) -> None:
        if self.dialect != "native":
            self._encoded("schedule", destination, due_ms, request_id, value)
            return
        # No action header: ADD is the default, and the existing scenarios' figures were taken without it.
        headers = self._message_headers(destination, due_ms)
        if sent_ms is not None:
            headers.append((SENT_HEADER, str(sent_ms).encode()))
        if request_id is not None:
            headers.append(("x-scheduler-request-id", request_id.encode()))
        self._produce(request_id.encode() if request_id else None, value, headers)

    def replace(self, destination: str, due_ms: int, request_id: str, value: bytes) -> None:
        if self.dialect != "native":
            self._encoded("replace", destination, due_ms, request_id, value)
            return
        headers = self._message_headers(destination, due_ms)
        headers += [("x-scheduler-action", b"REPLACE"), ("x-scheduler-request-id", request_id.encode())]
        self._produce(request_id.encode(), value, headers)

    def cancel(self, request_id: str, keyed_apart: bool = False) -> None:
        """``keyed_apart``: keyed unlike the id's other requests, so it most likely goes to another partition."""
        if self.dialect != "native":
            self._encoded("cancel", None, None, request_id, None)
            return
        # The key is not delivered (nothing is); it is there to route the cancel to the id's partition, or, keyed
        # apart, to another one most likely.
        self._produce(
            (request_id + "/cancel" if keyed_apart else request_id).encode(),
            None,
            [("x-scheduler-action", b"CANCEL"), ("x-scheduler-request-id", request_id.encode())],
        )

    def flush(self) -> None:
        self.producer.flush(120)
        if self.failed:
            raise RuntimeError(f"{self.failed} requests were not acknowledged by the broker")


class DeliveryReader(TopicReader):
    """Consumes a destination topic; keeps (broker append time, due time) per delivery, and with
    ``keep_values`` the value delivered under each key (the bench keys every request by its id).

    Deliveries of requests sent with a send time (``SENT_HEADER``) are kept apart in ``sent_deliveries``
    as (append time, due time, send time), out of the lateness figures. ``compact``: append and due
    times in two int64 arrays instead of a list of tuples, for herds of millions.
    """

    def __init__(self, bootstrap: str, topic: str, keep_values: bool = False, compact: bool = False):
        super().__init__(bootstrap, [topic])
        self.compact = compact
        self.deliveries: list[tuple[int, int]] = []
        self.appended_ms = array("q")
        self.due_ms = array("q")
        self.sent_deliveries: list[tuple[int, int, int]] = []
        self.delivery_ids: set[bytes] = set()
        self.duplicates = 0
        self.values: dict[bytes, bytes] | None = {} if keep_values else None
        # Keys delivered again under another delivery id: two versions of one schedule both fired.
        self.keys_delivered_twice: set[bytes] = set()

    @property
    def count(self) -> int:
        """Distinct deliveries read so far, of every kind."""
        return len(self.delivery_ids)

    def poll(self, seconds: float = 0.2) -> int:
        super().poll(seconds)
        return self.count

    def take(self, message) -> None:
        due = sent = None
        delivery_id = None
        for name, value in message.headers() or []:
            if name == DUE_HEADER:
                due = int(value)
            elif name == SENT_HEADER:
                sent = int(value)
            elif name == "x-scheduler-delivery-id":
                delivery_id = value
        appended = message.timestamp()[1]
        if delivery_id in self.delivery_ids:
            self.duplicates += 1
            return
        self.delivery_ids.add(delivery_id)
        if sent is not None:
            self.sent_deliveries.append((appended, due, sent))
        elif self.compact:
            self.appended_ms.append(appended)
            self.due_ms.append(due)
        else:
            self.deliveries.append((appended, due))
        if self.values is not None:
            key = message.key()
            if key in self.values:
                self.keys_delivered_twice.add(key)
            self.values[key] = message.value()

    def read_until_quiet(self, quiet_s: float = 5.0) -> None:
        """Read until nothing new (deliveries or duplicates) has arrived for ``quiet_s``: the topic read to its end."""
        last_news, seen = time.time(), -1
        while time.time() - last_news < quiet_s:
            self.poll(1.0)
            if self.count + self.duplicates != seen:
                seen, last_news = self.count + self.duplicates, time.time()

    def appended(self) -> list[int]:
        """Append times (ms) of the deliveries in the lateness figures, sorted."""
        return sorted(self.appended_ms if self.compact else (a for a, _ in self.deliveries))

    def _appended_and_due(self):
        return zip(self.appended_ms, self.due_ms) if self.compact else self.deliveries

    def lateness_figures(self) -> dict:
        lateness = sorted((appended - due) / 1000 for appended, due in self._appended_and_due())
        return {
            "delivered": len(lateness),
            "early": sum(1 for value in lateness if value < 0),
            "lateness_p50_s": round(percentile(lateness, 0.50), 3),
            "lateness_p99_s": round(percentile(lateness, 0.99), 3),
            "lateness_max_s": round(lateness[-1], 3) if lateness else None,
            "duplicates": self.duplicates,
        }

    def lateness_p99_by_window(self, window_s: int = 10) -> list[float]:
        """p99 lateness of the deliveries due in each ``window_s`` from the first due time: where in a run the tail
        sits (the start, one slow batch, or spread over all of it)."""
        pairs = list(self._appended_and_due())
        if not pairs:
            return []
        first = min(due for _, due in pairs)
        windows: dict[int, list[float]] = {}
        for appended, due in pairs:
            windows.setdefault((due - first) // (window_s * 1000), []).append((appended - due) / 1000)
        return [
            round(percentile(sorted(windows[i]), 0.99), 3) if i in windows else None for i in range(max(windows) + 1)
        ]

    def close(self) -> None:
        self.consumer.close()


class CronProducer(RequestProducer):
    """CRON_ADDs written out by hand as a Kaspr producer writes them (keyed by the cron id)."""

    def cron(self, destination: str, request_id: str, expr: str, value: bytes = b"tick") -> None:
        self._produce(
            request_id.encode(),
            value,
            [
                ("x-scheduler-action", b"CRON_ADD"),
                ("x-scheduler-deliver-to", destination.encode()),
                ("x-scheduler-request-id", request_id.encode()),
                ("x-scheduler-cron-expr", expr.encode()),
            ],
        )


class FiringReader(TopicReader):
    """Reads a destination of crons whose ids are ``<prefix>-<n>``: per firing instant, how many distinct crons fired
    (a bitmap of n per instant: duplicates and losses are exact without a set of ten million ids), their earliest and
    latest broker append time, and how many were appended before their instant (early)."""

    def __init__(self, bootstrap: str, topic: str, count: int):
        super().__init__(bootstrap, [topic])
        self.n = count
        self.seen: dict[int, bytearray] = {}  # instant (ms) -> bitmap of the crons that fired then
        self.records: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.early: dict[int, int] = {}
        self.duplicates = 0
        self.total = 0

    def take(self, message) -> None:
        instant = None
        for name, value in message.headers() or []:
            if name == "x-scheduler-cron-fire-timestamp":
                instant = int(value) * 1000
        appended = message.timestamp()[1]
        n = int(message.key().rsplit(b"-", 1)[1])
        bitmap = self.seen.get(instant)
        if bitmap is None:
            bitmap = self.seen[instant] = bytearray((self.n + 7) // 8)
            self.first[instant], self.last[instant], self.early[instant], self.records[instant] = appended, 0, 0, 0
        self.total += 1
        self.records[instant] += 1
        if bitmap[n >> 3] & (1 << (n & 7)):
            self.duplicates += 1
        bitmap[n >> 3] |= 1 << (n & 7)
        self.first[instant] = min(self.first[instant], appended)
        self.last[instant] = max(self.last[instant], appended)
        if appended < instant:
            self.early[instant] += 1

    def fired(self, instant: int) -> int:
        bitmap = self.seen.get(instant)
        return 0 if bitmap is None else sum(bin(b).count("1") for b in bitmap)

    def close(self) -> None:
        self.consumer.close()


# ---------------------------------------------------------------- where a batch's time goes

_BATCH_TIMES = re.compile(r"batch (\d+):.*\[state ([\d.]+)s, write ([\d.]+)s\]")
_SPARK_TIMES = re.compile(r"batch (\d+) timings \(ms\): (\{.*\})")


def batch_profile(log_text: str, after_batch: int) -> dict:
    """Where the time of the job's batches after ``after_batch`` went, from its log: the ``[state s, write s]`` of
    each busy batch's line (engine.batch_summary.BatchSummary.log_line), and, when the job ran with
    KAFKA_SCHEDULER_LOG_LEVEL=DEBUG, Spark's ``durationMs`` of every batch (mean and p99 per step, ms)."""
    state, write = [], []
    for match in _BATCH_TIMES.finditer(log_text):
        if int(match.group(1)) > after_batch:
            state.append(float(match.group(2)))
            write.append(float(match.group(3)))
    figures: dict = {"batches_logged": len(state)}
    for name, values in (("state", sorted(state)), ("write", sorted(write))):
        if values:
            figures.update(
                {
                    f"batch_{name}_p50_s": percentile(values, 0.5),
                    f"batch_{name}_p99_s": percentile(values, 0.99),
                    f"batch_{name}_max_s": values[-1],
                }
            )
    steps: dict[str, list[float]] = {}
    for match in _SPARK_TIMES.finditer(log_text):
        if int(match.group(1)) > after_batch:
            try:
                durations = ast.literal_eval(match.group(2))
            except (ValueError, SyntaxError):
                continue
            for step, ms in durations.items():
                steps.setdefault(step, []).append(float(ms))
    if steps:
        figures["spark_batches"] = max(len(v) for v in steps.values())
        figures["spark_ms_mean"] = {k: round(sum(v) / len(v)) for k, v in sorted(steps.items())}
        figures["spark_ms_p99"] = {k: round(percentile(sorted(v), 0.99)) for k, v in sorted(steps.items())}
    return figures
