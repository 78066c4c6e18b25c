"""bench soak: an hour of production-like load, watched for drift (issue 18, target 5).

    kafka-scheduler bench soak [--duration 3600] [--rate 500] [--window 300] [--warm-up 600]
                               [--herd-every 600] [--herd-count 100000] [--due-max 600] [--grace 30]

Load, from T0 (a warmed-up job with its metrics port open) for --duration seconds:

* --rate new schedules per second with ids, each due --due-min..--due-max s (2..600) after it is sent, uniformly;
  10% of them are replaced (new due time, new value) and 5% cancelled, each follow-up sent at a random time
  between 1 s after the schedule and SUPERSEDE_LEAD_S before the due time it supersedes (an id whose due time
  leaves no room gets no follow-up). Replaces and cancels come on top of --rate.
* a herd of --herd-count schedules with ids due at one instant every --herd-every seconds (the first at half that),
  sent as fast as the producer goes HERD_LEAD_S before its instant (at most half the period);
* /metrics and /api/status scraped every --scrape-every seconds (15), each answer timed; a scrape of /metrics makes
  the job count its pending schedules from the state store now and then, as a watched job does;
* every sample (same period): resident memory of each process of the job (driver, JVM, each Python worker), the
  checkpoint's size on disk.

Figures per --window of due time (300 s): lateness p50/p99/max of the versions that must be delivered, early
(any delivery before its version's due time), lost (a version that must be delivered and was not, --grace after
its due time), stale versions and cancelled schedules delivered although the replace or cancel was seen committed
before their due time (the crash suite's rule, chaos/checker.py: a version superseded by a request committed
only after its due time may go out, counted as ``superseded_late``), duplicates; the herds in their own figures
(first and last delivery after the instant, early, lost); per window of wall time: memory per process group,
checkpoint size, scrapes, batches. Flatness: a least-squares line through the samples after --warm-up (600 s),
its rise over the rest of the run relative to its value at the warm-up's end (target: at most 5%).

Verdicts: each window's lateness p99 within target 2 (250 ms), 0 early, 0 lost, no stale or cancelled version
delivered; memory of every process group and the checkpoint flat; herds 0 early, 0 lost; every scrape answered.
The result JSON goes to bench/results/ with a PNG chart beside it (same name, .png): memory, checkpoint size and
lateness per window (``python -m bench.soak chart FILE.json`` draws it again from a result file).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from confluent_kafka import Producer

from kafka_scheduler.harness import process_tree
from kafka_scheduler.harness.job_process import JobNotRunning
from kafka_scheduler.harness.topic_reader import TopicReader
from kafka_scheduler.kafka.local_broker import free_port

from .harness import Environment, RequestProducer, log, wait_until
from .job_load import warmed_up

DURATION_S = 3600
RATE = 500
WINDOW_S = 300
WARM_UP_S = 600
HERD_EVERY_S = 600
HERD_COUNT = 100_000
HERD_LEAD_S = 120.0  # a herd is sent this long before its instant (at most half the herd period)
DUE_MIN_S, DUE_MAX_S = 2.0, 600.0
GRACE_S = 30.0
SETTLE_S = 300.0
QUIET_S = 15.0  # settled: every request committed and no delivery for this long
SCRAPE_EVERY_S = 15.0
REPLACE_SHARE, CANCEL_SHARE = 0.10, 0.05
SUPERSEDE_LEAD_S = 10.0  # a replace or cancel is sent at least this long before the due time it supersedes
VALUE_BYTES = 100

LATENESS_P99_TARGET_S = 0.25  # issue 18, target 2
LATENESS_MAX_TARGET_S = 1.0
GROWTH_LIMIT = 0.05  # flat: at most 5% over the run after the warm-up

NONE = -1
FOLLOW_NONE, FOLLOW_REPLACE, FOLLOW_CANCEL = 0, 1, 2
_BATCH_LINE = re.compile(
    r"batch (\d+): (?:(\d+) requests \([^)]*\); )?(\d+) delivered.*"
    r"\[state ([\d.]+)s, write ([\d.]+)s\]"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The soak's own options (--duration, --rate are shared with the other scenarios)."""
    group = parser.add_argument_group("soak")
    group.add_argument(
        "--window",
        type=float,
        default=None,
        help=f"soak: length of a window of the figures, seconds (default {WINDOW_S}, or a twelfth "
        f"of --duration when shorter)",
    )
    group.add_argument(
        "--warm-up",
        type=float,
        default=None,
        help=f"soak: memory and checkpoint must be flat after this many seconds (default "
        f"{WARM_UP_S}, or a sixth of --duration when shorter)",
    )
    group.add_argument(
        "--herd-every",
        type=float,
        default=HERD_EVERY_S,
        help=f"soak: a herd every this many seconds, the first at half of it (default {HERD_EVERY_S})",
    )
    group.add_argument(
        "--herd-count",
        type=int,
        default=HERD_COUNT,
        help=f"soak: schedules in each herd, all due at one instant (default {HERD_COUNT:,}; 0: none)",
    )
    group.add_argument(
        "--due-max",
        type=float,
        default=None,
        help=f"soak: schedules are due {DUE_MIN_S:.0f} s to this many seconds after sending (default "
        f"{DUE_MAX_S:.0f}, or a sixth of --duration when shorter: the pending set is full, and "
        f"memory and checkpoint can be flat, once the warm-up has passed)",
    )
    group.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help=f"soak: after the load and the grace, wait at most this long for the job to commit every "
        f"request and deliver what is due (default {SETTLE_S:.0f}); what never arrives is lost",
    )
    group.add_argument(
        "--grace",
        type=float,
        default=GRACE_S,
        help=f"soak: a schedule not delivered this long after its due time is lost (default {GRACE_S:.0f})",
    )
    group.add_argument(
        "--scrape-every",
        type=float,
        default=SCRAPE_EVERY_S,
        help=f"soak: seconds between scrapes of /metrics and /api/status and between memory "
        f"samples (default {SCRAPE_EVERY_S:.0f})",
    )
    group.add_argument("--seed", type=int, default=18, help="soak: seed of the load (default 18)")


def settle_arguments(args: argparse.Namespace) -> None:
    """Defaults that follow --duration, so that a short run has useful windows and a warm-up."""
    if args.window is None:
        args.window = min(WINDOW_S, args.duration / 12)
    if args.warm_up is None:
        args.warm_up = min(WARM_UP_S, args.duration / 6)
    if args.due_max is None:
        args.due_max = max(DUE_MIN_S + 1, min(DUE_MAX_S, args.duration / 6))
    if args.rate is None:
        args.rate = RATE


# ---------------------------------------------------------------- what was asked, in arrays


class Ledger:
    """Every ordinary schedule and herd member as sent, and what was delivered of it; numpy arrays (an hour at
    500/s is 1.8 million ids), written by the sender and the delivery reader, read by the checks."""

    def __init__(self, capacity: int, herds: int, herd_count: int):
        self.capacity = capacity
        self.sent = 0
        self.due = np.zeros((capacity, 2), dtype=np.int64)  # due ms of v0 and v1 (0: no v1)
        self.follow = np.zeros(capacity, dtype=np.int8)  # FOLLOW_*
        self.follow_committed = np.full(capacity, NONE, dtype=np.int64)  # ms the follow-up was first seen committed
        self.follow_where: dict[int, tuple[str, int, int]] = {}  # id -> (topic, partition, offset) until looked up
        self.delivered = np.full((capacity, 2), NONE, dtype=np.int64)  # first append ms per version
        self.copies = np.zeros((capacity, 2), dtype=np.int32)
        self.herd_due = np.zeros(herds, dtype=np.int64)
        self.herd_sent = np.zeros(herds, dtype=np.int64)  # how many of each herd were sent
        self.herd_delivered = np.full((herds, max(herd_count, 1)), NONE, dtype=np.int64)
        self.herd_copies = np.zeros((herds, max(herd_count, 1)), dtype=np.int32)
        self.unknown = 0  # deliveries naming nothing sent

    def deliver(self, key: bytes, value: bytes, appended_ms: int) -> None:
        try:
            version = int(value[1:2]) if value and value[:1] == b"v" else 0
            if key[:1] == b"s":
                row, slots, copies = int(key[1:]), self.delivered, self.copies
                column = version
                if row >= self.sent or column > 1:
                    raise ValueError
            elif key[:1] == b"h":
                herd, member = key[1:].split(b"-")
                row, column = int(herd), int(member)
                slots, copies = self.herd_delivered, self.herd_copies
            else:
                raise ValueError
        except (ValueError, IndexError, TypeError):
            self.unknown += 1
            return
        copies[row, column] += 1
        if slots[row, column] == NONE or appended_ms < slots[row, column]:
            slots[row, column] = appended_ms


class Deliveries(TopicReader):
    """Reads the destination from its start in a thread of its own, into the ledger."""

    def __init__(self, bootstrap: str, topic: str, ledger: Ledger, committed: bool):
        super().__init__(bootstrap, [topic], committed=committed)
        self.ledger = ledger
        self.read = 0
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="soak-deliveries")
        self.thread.start()

    def take(self, message) -> None:
        self.read += 1
        self.ledger.deliver(message.key() or b"", message.value() or b"", message.timestamp()[1])

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.poll(0.2)
        except BaseException as exc:
            self.failure = exc

    def finish(self, timeout: float = 120.0) -> None:
        """Stop the thread, then read to the end the destination has now, here (librdkafka's consumer is not to be
        called from two threads at once: a watermark query while the thread consumes hung for good), and close."""
        self.stopping.set()
        self.thread.join(30)
        try:
            self.read_to_end(timeout)
        finally:
            self.close()


def _value(key: str, version: int) -> bytes:
    return f"v{version}|{key}|".encode().ljust(VALUE_BYTES, b".")


class Requests:
    """Native requests with ids, the way a service sends them (linger 5 ms); the offsets of the replaces and
    cancels are noted, so that the time a batch covering them was committed can be looked up."""

    def __init__(self, bootstrap: str, topic: str, destination: str, ledger: Ledger):
        self.topic, self.destination, self.ledger = topic, destination, ledger
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "acks": "all",
                "enable.idempotence": True,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 1_000_000,
                "log_level": 3,
            }
        )
        self.failed = 0

    def _produce(self, key: str, value: bytes | None, headers: list, on_delivery=None) -> None:
        def delivered(err, msg):
            if err is not None:
                self.failed += 1
            elif on_delivery is not None:
                on_delivery(msg)

        while True:
            try:
                self.producer.produce(self.topic, key=key.encode(), value=value, headers=headers, on_delivery=delivered)
                return
            except BufferError:
                self.producer.poll(0.05)

    def add(self, row: int, due_ms: int) -> None:
        key = f"s{row}"
        headers = RequestProducer._message_headers(self.destination, due_ms)
        self._produce(key, _value(key, 0), headers + [("x-scheduler-request-id", key.encode())])

    def _noted(self, row: int):
        def note(msg) -> None:
            self.ledger.follow_where[row] = (msg.topic(), msg.partition(), msg.offset())

        return note

    def replace(self, row: int, due_ms: int) -> None:
        key = f"s{row}"
        headers = RequestProducer._message_headers(self.destination, due_ms)
        headers += [("x-scheduler-action", b"REPLACE"), ("x-scheduler-request-id", key.encode())]
        self._produce(key, _value(key, 1), headers, self._noted(row))

    def cancel(self, row: int) -> None:
        key = f"s{row}"
        self._produce(
            key, None, [("x-scheduler-action", b"CANCEL"), ("x-scheduler-request-id", key.encode())], self._noted(row)
        )

    def poll(self) -> None:
        self.producer.poll(0)

    def flush(self) -> None:
        self.producer.flush(120)


def send_herd(bootstrap: str, topic: str, destination: str, ledger: Ledger, herd: int, count: int) -> None:
    """All members of herd ``herd`` as fast as the producer goes (a bulk notification)."""
    producer = RequestProducer(bootstrap, topic)
    due = int(ledger.herd_due[herd])
    for member in range(count):
        key = f"h{herd}-{member}"
        producer.add(destination, due, key, value=_value(key, 0))
    producer.flush()
    ledger.herd_sent[herd] = count


# ---------------------------------------------------------------- the job's processes and checkpoint


def process_memory(root: int) -> dict:
    """Resident bytes of each process of the job: per group, the number of Python workers and the largest."""
    groups = dict.fromkeys(process_tree.GROUPS, 0)
    workers = []
    for pid in process_tree.descendants(root):
        try:
            command = process_tree.command_line(pid)
            rss = next(
                (
                    int(line.split()[1]) * 1024
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")
                ),
                0,
            )
        except (OSError, ValueError, IndexError):
            continue
        group = process_tree.group_of(pid, root, command)
        groups[group] += rss
        if group == "python_workers":
            workers.append(rss)
    return {**groups, "workers": len(workers), "largest_worker": max(workers, default=0)}


# G1 reports its heap in one line ("garbage-first heap total ..K, used ..K"), the serial collector (the test suite's
# JVMs) per generation ("def new generation", "tenured generation").
_HEAP_LINE = re.compile(r"(?:heap|generation)\s+total (\d+)K, used (\d+)K")


def jvm_heap(root: int) -> dict:
    """The job's JVM heap (``jcmd GC.heap_info`` of its JVM's own JDK): in use (garbage included: the lows of a
    window are what stays) and committed, in bytes; empty when it cannot be read. The RSS alone does not tell a
    heap filling up (the run of 2026-11-28 ended out of heap at 1 GB with its RSS near flat)."""
    for pid in process_tree.pids_of(root, "jvm"):
        try:
            jcmd = Path(os.readlink(f"/proc/{pid}/exe")).with_name("jcmd")
            out = subprocess.run([str(jcmd), str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            continue
        parts = _HEAP_LINE.findall(out.stdout)
        if parts:
            return {
                "jvm_heap_committed": sum(int(total) for total, _ in parts) * 1024,
                "jvm_heap_used": sum(int(used) for _, used in parts) * 1024,
            }
    return {}


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path``; files that vanish while it is walked (a batch cleaning up) are skipped."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def scrape(url: str, timeout: float = 10.0) -> tuple[bytes | None, float, str | None]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body = answer.read()
        return body, time.monotonic() - started, None
    except Exception as exc:
        return None, time.monotonic() - started, f"{type(exc).__name__}: {exc}"[:200]


class Sampler(threading.Thread):
    """Every ``every`` seconds: the job's memory and checkpoint size, then a scrape of /metrics and /api/status."""

    def __init__(self, scheduler, port: int, t0: float, every: float):
        super().__init__(daemon=True, name="soak-sampler")
        self.scheduler, self.port, self.t0, self.every = scheduler, port, t0, every
        self.samples: list[dict] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(max(0.0, self.t0 + len(self.samples) * self.every - time.time())):
            if not self.scheduler.running:
                self.samples.append({"t": round(time.time() - self.t0, 1), "job_running": False})
                continue
            sample = {
                "t": round(time.time() - self.t0, 1),
                "job_running": True,
                **process_memory(self.scheduler.process.pid),
                **jvm_heap(self.scheduler.process.pid),
                "checkpoint_bytes": tree_bytes(self.scheduler.checkpoint),
            }
            body, seconds, error = scrape(f"http://127.0.0.1:{self.port}/metrics")
            sample["metrics_s"], sample["metrics_error"] = round(seconds, 3), error
            body, seconds, error = scrape(f"http://127.0.0.1:{self.port}/api/status")
            sample["status_s"], sample["status_error"] = round(seconds, 3), error
            if body is not None:
                try:
                    status = json.loads(body)
                    sample["health"] = status.get("health", {}).get("verdict")
                    sample["pending"] = status.get("pending")
                except ValueError as exc:
                    sample["status_error"] = f"not JSON: {exc}"
            self.samples.append(sample)


# ---------------------------------------------------------------- figures


def _percentiles(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"lateness_p50_s": None, "lateness_p99_s": None, "lateness_max_s": None}
    p50, p99 = np.percentile(values, [50, 99], method="nearest")
    return {
        "lateness_p50_s": round(float(p50), 3),
        "lateness_p99_s": round(float(p99), 3),
        "lateness_max_s": round(float(values.max()), 3),
    }


def ordinary_outcomes(ledger: Ledger) -> dict:
    """Per ordinary id and version: whether it must be delivered, may be, or must not be (chaos/checker.py's rule:
    a version whose replace or cancel was seen committed before its due time must not go out)."""
    n = ledger.sent
    due, delivered, follow = ledger.due[:n], ledger.delivered[:n], ledger.follow[:n]
    committed = ledger.follow_committed[:n]
    has_follow = follow != FOLLOW_NONE
    in_time = has_follow & (committed != NONE) & (committed < due[:, 0])
    # v0: required without a follow-up; forbidden if superseded in time; allowed otherwise.
    required0 = ~has_follow
    forbidden0 = in_time
    allowed0 = has_follow & ~in_time
    required1 = follow == FOLLOW_REPLACE
    return {
        "due": due,
        "delivered": delivered,
        "required0": required0,
        "forbidden0": forbidden0,
        "allowed0": allowed0,
        "required1": required1,
        "cancelled": follow == FOLLOW_CANCEL,
        "replaced": follow == FOLLOW_REPLACE,
        "copies": ledger.copies[:n],
    }


def window_figures(ledger: Ledger, t0_ms: int, start_s: float, end_s: float, checked_ms: int, grace_s: float) -> dict:
    """Figures of the ordinary versions due in [start_s, end_s) after T0; ``checked_ms``: deliveries read up to
    then (a required version not delivered by then, due more than the grace before it, is lost)."""
    o = ordinary_outcomes(ledger)
    lo, hi = t0_ms + int(start_s * 1000), t0_ms + int(end_s * 1000)
    due, delivered = o["due"], o["delivered"]
    figures: dict = {"start_s": round(start_s, 1), "end_s": round(end_s, 1)}
    lateness_parts, lost, beyond_grace, early, due_count = [], 0, 0, 0, 0
    for column, required in ((0, o["required0"]), (1, o["required1"])):
        in_window = (due[:, column] >= lo) & (due[:, column] < hi)
        mask = in_window & required
        due_count += int(mask.sum())
        got = delivered[mask, column]
        dues = due[mask, column]
        arrived = got != NONE
        lateness_parts.append((got[arrived] - dues[arrived]) / 1000)
        missing = ~arrived & (dues + grace_s * 1000 <= checked_ms)
        lost += int(missing.sum())
        beyond_grace += int((arrived & (got - dues > grace_s * 1000)).sum())
        any_delivered = in_window & (delivered[:, column] != NONE)
        early += int((delivered[any_delivered, column] < due[any_delivered, column]).sum())
    lateness = np.sort(np.concatenate(lateness_parts)) if lateness_parts else np.zeros(0)
    in_window0 = (due[:, 0] >= lo) & (due[:, 0] < hi)
    delivered0 = delivered[:, 0] != NONE
    figures.update(
        {
            "due": due_count,
            "delivered": len(lateness),
            **_percentiles(lateness),
            "early": early,
            "lost": lost,
            "beyond_grace": beyond_grace,
            "stale_delivered": int((in_window0 & o["forbidden0"] & o["replaced"] & delivered0).sum()),
            "cancelled_delivered": int((in_window0 & o["forbidden0"] & o["cancelled"] & delivered0).sum()),
            "superseded_late_delivered": int((in_window0 & o["allowed0"] & delivered0).sum()),
            "duplicates": int(
                np.clip(o["copies"][in_window0, 0] - 1, 0, None).sum()
                + np.clip(o["copies"][(due[:, 1] >= lo) & (due[:, 1] < hi), 1] - 1, 0, None).sum()
            ),
        }
    )
    return figures


def herd_figures(ledger: Ledger, herd: int, count: int, t0_ms: int) -> dict:
    due = int(ledger.herd_due[herd])
    sent = int(ledger.herd_sent[herd])
    got = ledger.herd_delivered[herd, :sent]
    arrived = got[got != NONE]
    figures = {
        "instant_s": round((due - t0_ms) / 1000, 1),
        "count": count,
        "sent": sent,
        "delivered": len(arrived),
        "lost": sent - len(arrived),
        "early": int((arrived < due).sum()),
        "duplicates": int(np.clip(ledger.herd_copies[herd, :sent] - 1, 0, None).sum()),
    }
    if len(arrived):
        figures.update(
            {
                "first_after_instant_s": round((int(arrived.min()) - due) / 1000, 3),
                "last_after_instant_s": round((int(arrived.max()) - due) / 1000, 3),
            }
        )
    return figures


def sample_windows(samples: list[dict], windows: list[tuple[float, float]]) -> list[dict]:
    """Memory, checkpoint size and scrapes of the samples taken in each window of wall time."""
    result = []
    for start, end in windows:
        inside = [s for s in samples if start <= s["t"] < end and s.get("job_running")]
        row: dict = {"samples": len(inside)}
        for name in (*process_tree.GROUPS[:3], "checkpoint_bytes", "largest_worker", "jvm_heap_used"):
            values = [s[name] for s in inside if name in s]
            mib = 2**20
            row[f"{name}_mean_mib"] = round(sum(values) / len(values) / mib, 1) if values else None
            row[f"{name}_max_mib"] = round(max(values) / mib, 1) if values else None
            row[f"{name}_min_mib"] = round(min(values) / mib, 1) if values else None
        row["workers_max"] = max((s.get("workers", 0) for s in inside), default=None)
        row["scrapes"] = 2 * len(inside)
        row["scrape_failures"] = sum(bool(s.get("metrics_error")) + bool(s.get("status_error")) for s in inside)
        row["scrape_max_s"] = max((max(s.get("metrics_s", 0), s.get("status_s", 0)) for s in inside), default=None)
        row["health"] = sorted({s["health"] for s in inside if s.get("health")})
        result.append(row)
    return result


def growth(samples: list[dict], name: str, after_s: float, end_s: float) -> dict | None:
    """The least-squares line through ``name``'s samples after ``after_s``: its value there and at ``end_s``, and
    the rise between them relative to the first (None with fewer than 3 samples)."""
    points = [(s["t"], s[name]) for s in samples if s.get("job_running") and s["t"] >= after_s and name in s]
    if len(points) < 3:
        return None
    t = np.array([p[0] for p in points], dtype=float)
    v = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(t, v, 1)
    at_start, at_end = slope * after_s + intercept, slope * end_s + intercept
    return {
        "fit_start_mib": round(at_start / 2**20, 1),
        "fit_end_mib": round(at_end / 2**20, 1),
        "growth_pct": round(100 * (at_end - at_start) / at_start, 2) if at_start > 0 else None,
        "samples": len(points),
    }


def batch_windows(lines: list[tuple[float, str]], t0: float, windows: list[tuple[float, float]]) -> list[dict]:
    """Per window of wall time, the job's logged batches: how many, and the longest state and write step."""
    batches = []
    for seen, line in lines:
        match = _BATCH_LINE.search(line)
        if match:
            batches.append((seen - t0, int(match.group(2) or 0), float(match.group(4)), float(match.group(5))))
    rows = []
    for start, end in windows:
        inside = [b for b in batches if start <= b[0] < end]
        rows.append(
            {
                "batches_logged": len(inside),
                "requests": sum(b[1] for b in inside),
                "batch_max_s": round(max((b[2] + b[3] for b in inside), default=0.0), 2),
                "state_max_s": round(max((b[2] for b in inside), default=0.0), 2),
            }
        )
    return rows


def verdicts(windows: list[dict], herds: list[dict], flat: dict) -> dict:
    # A window whose schedules were all lost has no lateness: missed too.
    late = [
        w["index"]
        for w in windows
        if w["due"] and (w["lateness_p99_s"] is None or w["lateness_p99_s"] > LATENESS_P99_TARGET_S)
    ]
    wrong = [w["index"] for w in windows if w["early"] or w["lost"] or w["stale_delivered"] or w["cancelled_delivered"]]
    grown = {
        name: f["growth_pct"]
        for name, f in flat.items()
        if f and f["growth_pct"] is not None and f["growth_pct"] > 100 * GROWTH_LIMIT
    }
    herd_wrong = [h["instant_s"] for h in herds if h["early"] or h["lost"]]
    scrape_failures = sum(w.get("scrape_failures") or 0 for w in windows)
    return {
        "windows_lateness_p99_met": f"{len(windows) - len(late)} of {len(windows)}",
        "windows_lateness_p99_missed": late,
        "windows_with_early_lost_stale_or_cancelled": wrong,
        "flat": "yes"
        if not grown and all(flat.values())
        else (
            "no: " + ", ".join(f"{k} +{v}%" for k, v in grown.items())
            if grown
            else "not enough samples after the warm-up"
        ),
        "herds_early_or_lost": herd_wrong,
        "scrape_failures": scrape_failures,
        "met": bool(windows)
        and not late
        and not wrong
        and not grown
        and all(flat.values())
        and not herd_wrong
        and not scrape_failures,
    }


def summarize(
    ledger: Ledger,
    samples: list[dict],
    job_log: list[tuple[float, str]],
    t0: float,
    duration: float,
    window: float,
    warm_up: float,
    grace: float,
    checked_ms: int,
    herd_instants: list[float],
    herd_count: int,
) -> dict:
    """The figures of a soak from what it recorded: per window, per herd, flatness, the verdicts; the series go in
    ``details`` (the result file keeps them, the chart draws them)."""
    t0_ms = int(t0 * 1000)
    spans = []
    start = 0.0
    while start < duration - 1e-6:
        spans.append((start, min(duration, start + window)))
        start += window
    windows = []
    memory_rows = sample_windows(samples, spans)
    batch_rows = batch_windows(job_log, t0, spans)
    for index, (start, stop) in enumerate(spans):
        windows.append(
            {
                "index": index,
                **window_figures(ledger, t0_ms, start, stop, checked_ms, grace),
                "herds": [h for h, instant in enumerate(herd_instants) if start <= instant < stop],
                **memory_rows[index],
                **batch_rows[index],
            }
        )
    herds = [herd_figures(ledger, herd, herd_count, t0_ms) for herd in range(len(herd_instants))]
    flat = {name: growth(samples, name, warm_up, duration) for name in (*process_tree.GROUPS[:3], "checkpoint_bytes")}
    verdict = verdicts(windows, herds, flat)
    total = window_figures(ledger, t0_ms, 0, duration, checked_ms, grace)
    running = [s for s in samples if s.get("job_running")]
    figures = {
        "verdict": "met" if verdict["met"] else "missed",
        **{k: v for k, v in verdict.items() if k != "met"},
        "schedules_sent": ledger.sent,
        "replaces_and_cancels_sent": int((ledger.follow[: ledger.sent] != 0).sum()),
        "herds": len(herds),
        "herd_count": herd_count,
        **{f"all_{k}": v for k, v in total.items() if k not in ("start_s", "end_s")},
        "worst_window_lateness_p99_s": max(
            (w["lateness_p99_s"] for w in windows if w["lateness_p99_s"] is not None), default=None
        ),
        "herd_last_after_instant_max_s": max((h.get("last_after_instant_s", 0) for h in herds), default=None),
        "unknown_deliveries": ledger.unknown,
        **{f"growth_{name}_pct": (f or {}).get("growth_pct") for name, f in flat.items()},
        "peak_rss_total_mib": round(
            max((sum(s.get(g, 0) for g in process_tree.GROUPS[:3]) for s in running), default=0) / 2**20
        ),
        "load_average_end": [round(v, 1) for v in os.getloadavg()],
    }
    figures["details"] = {
        "windows": windows,
        "herd_figures": herds,
        "flat": flat,
        "samples": samples,
        "targets": {
            "lateness_p99_s": LATENESS_P99_TARGET_S,
            "growth_pct": 100 * GROWTH_LIMIT,
            "warm_up_s": warm_up,
            "window_s": window,
            "duration_s": duration,
            "herd_instants_s": herd_instants,
        },
    }
    return figures


# ---------------------------------------------------------------- the scenario


def soak(env: Environment, args) -> dict:
    from chaos.suite import CommitWatcher  # the crash suite's watcher: when a commit first covered an offset

    settle_arguments(args)
    port = free_port()
    job_args = argparse.Namespace(
        **{**vars(args), "scheduler_args": (*args.scheduler_args, "--metrics-port", str(port))}
    )
    scheduler = warmed_up(env, job_args)
    requests_topic = f"{scheduler.app_id}-schedule-requests"
    destination = env.topic("soak", partitions=4)
    herd_instants = (
        []
        if args.herd_count <= 0
        else [
            args.herd_every / 2 + k * args.herd_every
            for k in range(int(args.duration // args.herd_every) + 1)
            if args.herd_every / 2 + k * args.herd_every < args.duration
        ]
    )
    capacity = math.ceil(args.rate * args.duration) + 1
    ledger = Ledger(capacity, len(herd_instants), args.herd_count)
    exactly_once = "--exactly-once" in args.scheduler_args
    reader = Deliveries(env.bootstrap, destination, ledger, committed=exactly_once)
    requests = Requests(env.bootstrap, requests_topic, destination, ledger)
    watcher = CommitWatcher(scheduler.checkpoint)
    watcher.start()
    rng = random.Random(args.seed)

    t0 = math.ceil(time.time()) + 1.0
    t0_ms = int(t0 * 1000)
    herd_lead = min(HERD_LEAD_S, args.herd_every / 2)
    for herd, instant in enumerate(herd_instants):
        ledger.herd_due[herd] = t0_ms + int(instant * 1000)
    herd_sends = [(max(0.0, instant - herd_lead), herd) for herd, instant in enumerate(herd_instants)]
    log(
        f"soak: {args.duration:.0f}s: {args.rate:g} schedules/s with ids due {DUE_MIN_S:.0f}-{args.due_max:.0f}s "
        f"ahead ({REPLACE_SHARE:.0%} replaced, {CANCEL_SHARE:.0%} cancelled); "
        + (
            f"herds of {args.herd_count:,} at " + ", ".join(f"{i:.0f}s" for i in herd_instants)
            if herd_instants
            else "no herds"
        )
        + f"; scrapes every {args.scrape_every:.0f}s on port {port}; windows of {args.window:.0f}s, "
        f"flat after {args.warm_up:.0f}s"
    )
    sampler = Sampler(scheduler, port, t0, args.scrape_every)
    sampler.start()
    herd_threads: list[threading.Thread] = []
    follow_ups: list[tuple[float, int, int, int]] = []  # (send at, row, kind, due ms of a replace)
    wait_until(lambda: time.time() >= t0, 5, "T0", interval=0.01)
    end = t0 + args.duration
    next_report = t0 + max(args.window, 60)
    ended: str | None = None  # why the job stopped under the load: the figures then cover the time until then
    while (now := time.time()) < end:
        try:
            scheduler.assert_running()
        except JobNotRunning as exc:
            ended = " ".join(str(exc).split("--- log tail")[0].split())[:500]
            log(f"soak: the job ended at {now - t0:.0f}s: {ended}; the figures cover the time until then")
            break
        while herd_sends and t0 + herd_sends[0][0] <= now:
            _, herd = herd_sends.pop(0)
            log(f"  sending herd {herd} ({args.herd_count:,}, due at {herd_instants[herd]:.0f}s)")
            thread = threading.Thread(
                target=send_herd,
                daemon=True,
                name=f"soak-herd-{herd}",
                args=(env.bootstrap, requests_topic, destination, ledger, herd, args.herd_count),
            )
            thread.start()
            herd_threads.append(thread)
        while follow_ups and follow_ups[0][0] <= now:
            _, row, kind, due_ms = heapq.heappop(follow_ups)
            if kind == FOLLOW_REPLACE:
                ledger.due[row, 1] = due_ms
                requests.replace(row, due_ms)
            else:
                requests.cancel(row)
            ledger.follow[row] = kind
        target = min(capacity, int((now - t0) * args.rate) + 1)
        while ledger.sent < target:
            row = ledger.sent
            sent = time.time()
            due_s = sent + rng.uniform(DUE_MIN_S, args.due_max)
            ledger.due[row, 0] = int(due_s * 1000)
            requests.add(row, int(due_s * 1000))
            ledger.sent += 1
            roll = rng.random()
            room = due_s - SUPERSEDE_LEAD_S - (sent + 1.0)
            if roll < REPLACE_SHARE + CANCEL_SHARE and room > 0:
                at = sent + 1.0 + rng.uniform(0, room)
                if roll < REPLACE_SHARE:
                    heapq.heappush(
                        follow_ups, (at, row, FOLLOW_REPLACE, int((at + rng.uniform(DUE_MIN_S, args.due_max)) * 1000))
                    )
                else:
                    heapq.heappush(follow_ups, (at, row, FOLLOW_CANCEL, 0))
        requests.poll()
        if now >= next_report:
            next_report += max(args.window, 60)
            sample = sampler.samples[-1] if sampler.samples else {}
            log(
                f"  {now - t0:.0f}s: {ledger.sent:,} schedules sent, {reader.read:,} deliveries read; job "
                f"{sum(sample.get(g, 0) for g in process_tree.GROUPS[:3]) / 2**20:,.0f} MiB, checkpoint "
                f"{sample.get('checkpoint_bytes', 0) / 2**20:,.1f} MiB, health {sample.get('health')}"
            )
        time.sleep(0.005)
    if ended is None:
        log(
            f"soak: load done ({ledger.sent:,} schedules, {len(ledger.follow_where):,} replaces and cancels); "
            f"waiting {args.grace:.0f}s for the last window's schedules"
        )
    requests.flush()
    for thread in herd_threads:
        thread.join(300)
    if requests.failed:
        raise RuntimeError(f"{requests.failed} requests were not acknowledged by the broker")
    if ended is None:
        try:
            figures = _settled_figures(
                env, requests_topic, ledger, reader, sampler, watcher, scheduler, t0, end, args, herd_instants
            )
        except JobNotRunning as exc:
            ended = " ".join(str(exc).split("--- log tail")[0].split())[:500]
            log(f"soak: the job ended at {time.time() - t0:.0f}s, after the load: {ended}")
    if ended is not None:
        figures = _ended_figures(
            ended,
            min(time.time() - t0, args.duration + args.grace),
            ledger,
            reader,
            sampler,
            watcher,
            scheduler,
            t0,
            args,
            herd_instants,
        )
    for w in figures["details"]["windows"]:
        log(
            f"  window {w['index']} [{w['start_s']:.0f}-{w['end_s']:.0f}s): due {w['due']:,}, p50 "
            f"{w['lateness_p50_s']}s p99 {w['lateness_p99_s']}s max {w['lateness_max_s']}s, early {w['early']}, "
            f"lost {w['lost']}, stale {w['stale_delivered']}, cancelled {w['cancelled_delivered']}; JVM "
            f"{w['jvm_mean_mib']} MiB, driver {w['python_driver_mean_mib']} MiB, workers "
            f"{w['python_workers_mean_mib']} MiB, checkpoint {w['checkpoint_bytes_mean_mib']} MiB; batch max "
            f"{w['batch_max_s']}s" + (f"; herd {w['herds']}" if w["herds"] else "")
        )
    for h in figures["details"]["herd_figures"]:
        log(
            f"  herd at {h['instant_s']:.0f}s: {h['delivered']:,} of {h['sent']:,}, first "
            f"{h.get('first_after_instant_s')}s, last {h.get('last_after_instant_s')}s, early {h['early']}"
        )
    return figures


def _settled_figures(
    env: Environment,
    requests_topic: str,
    ledger: Ledger,
    reader: Deliveries,
    sampler: Sampler,
    watcher,
    scheduler,
    t0: float,
    end: float,
    args,
    herd_instants: list[float],
) -> dict:
    """After the load: the grace, then the job settles, then the figures of the whole run."""
    wait_until(
        lambda: scheduler.assert_running() or time.time() >= end + args.grace,
        args.grace + 5,
        "the grace after the last window",
        interval=0.5,
    )
    # A job behind its due times is still delivering: until it has committed every request and nothing came for
    # QUIET_S (at most --settle), then the destination is read to its end. Arrived late is lateness; never, lost.
    requests_end = env.end_offsets(requests_topic)
    quiet = {"read": reader.read, "at": time.time()}

    def settled() -> bool:
        scheduler.assert_running()
        if reader.read != quiet["read"]:
            quiet.update(read=reader.read, at=time.time())
        return scheduler.committed(requests_topic) >= requests_end and time.time() - quiet["at"] >= QUIET_S

    try:
        wait_until(settled, args.settle, "the job to commit every request and deliver what is due", interval=1.0)
    except TimeoutError as exc:
        log(f"  {exc}: what has not arrived by now counts as lost")
    return _figures(ledger, reader, sampler, watcher, scheduler, t0, args.duration, args, herd_instants)


def _figures(
    ledger: Ledger,
    reader: Deliveries,
    sampler: Sampler,
    watcher,
    scheduler,
    t0: float,
    duration: float,
    args,
    herd_instants: list[float],
) -> dict:
    """Stop reading and sampling, then the figures of the first ``duration`` seconds."""
    checked_ms = int(time.time() * 1000)
    reader.finish()
    sampler.stopping.set()
    sampler.join(30)
    watcher.stopping.set()
    for row, (topic, partition, offset) in ledger.follow_where.items():
        committed = watcher.committed_ms(topic, partition, offset)
        if committed is not None:
            ledger.follow_committed[row] = committed
    job_log = scheduler.follower.snapshot() if scheduler.follower else []
    scheduler.stop()
    return summarize(
        ledger,
        sampler.samples,
        job_log,
        t0,
        duration,
        args.window,
        args.warm_up,
        args.grace,
        checked_ms,
        [i for i in herd_instants if i < duration],
        args.herd_count,
    )


def _ended_figures(
    ended: str,
    ended_s: float,
    ledger: Ledger,
    reader: Deliveries,
    sampler: Sampler,
    watcher,
    scheduler,
    t0: float,
    args,
    herd_instants: list[float],
) -> dict:
    """The job stopped under the load: the figures of the windows that ended a grace before it did (what was due
    later may have been lost with it), the samples until then, and why it stopped. Always missed."""
    covered = max(0.0, ended_s - args.grace)
    figures = _figures(ledger, reader, sampler, watcher, scheduler, t0, covered, args, herd_instants)
    figures.update(verdict="missed", job_ended_at_s=round(ended_s, 1), job_ended=ended, covered_s=round(covered, 1))
    log(f"soak: figures of the first {covered:.0f}s (the job ended at {ended_s:.0f}s)")
    return figures


# ---------------------------------------------------------------- the chart


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def chart(result_path: Path) -> Path:
    """The PNG beside a soak result file: memory per process group, checkpoint size and lateness per window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(Path(result_path).read_text())
    details = record["details"]
    windows, samples, targets = details["windows"], details["samples"], details["targets"]
    mid = [(w["start_s"] + w["end_s"]) / 120 for w in windows]  # minutes
    edges = [w["start_s"] / 60 for w in windows] + [windows[-1]["end_s"] / 60] if windows else []
    running = [s for s in samples if s.get("job_running")]
    t = [s["t"] / 60 for s in running]
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    memory, checkpoint, lateness = axes
    labels = {"jvm": "JVM", "python_driver": "Python driver", "python_workers": "Python workers (all)"}
    for group, colour in zip(labels, ("tab:blue", "tab:orange", "tab:green")):
        memory.plot(t, [s.get(group, 0) / 2**20 for s in running], color=colour, alpha=0.25, linewidth=0.8)
        if windows:
            memory.step(
                edges,
                [w[f"{group}_mean_mib"] or 0 for w in windows] + [windows[-1][f"{group}_mean_mib"] or 0],
                where="post",
                color=colour,
                linewidth=2,
                label=f"{labels[group]}, mean per window",
            )
    heap = [(s["t"] / 60, s["jvm_heap_used"] / 2**20) for s in running if "jvm_heap_used" in s]
    if heap:
        memory.plot(
            [h[0] for h in heap],
            [h[1] for h in heap],
            color="tab:blue",
            linestyle=":",
            linewidth=1,
            label="JVM heap in use (garbage included)",
        )
    memory.set_ylabel("resident memory (MiB)")
    memory.legend(loc="best", fontsize=8)
    memory.set_ylim(bottom=0)
    checkpoint.plot(
        t,
        [s.get("checkpoint_bytes", 0) / 2**20 for s in running],
        color="tab:purple",
        alpha=0.3,
        linewidth=0.8,
        label="every sample",
    )
    checkpoint.step(
        edges,
        [w["checkpoint_bytes_mean_mib"] or 0 for w in windows]
        + [windows[-1]["checkpoint_bytes_mean_mib"] or 0 for _ in windows[-1:]],
        where="post",
        color="tab:purple",
        linewidth=2,
        label="mean per window",
    )
    checkpoint.set_ylabel("checkpoint size (MiB)")
    checkpoint.legend(loc="best", fontsize=8)
    checkpoint.set_ylim(bottom=0)
    floor = 0.001
    for key, colour, label in (
        ("lateness_p50_s", "tab:green", "p50"),
        ("lateness_p99_s", "tab:orange", "p99"),
        ("lateness_max_s", "tab:red", "max"),
    ):
        lateness.plot(
            mid,
            [max(floor, w[key]) if w[key] is not None else None for w in windows],
            marker="o",
            color=colour,
            label=f"lateness {label} (schedules due in the window)",
        )
    lateness.axhline(
        targets["lateness_p99_s"],
        color="tab:orange",
        linestyle="--",
        linewidth=1,
        label=f"p99 target {targets['lateness_p99_s'] * 1000:.0f} ms",
    )
    lateness.set_yscale("log")
    lateness.set_ylabel("lateness (s, log)")
    lateness.set_xlabel("minutes since the load started")
    for herd in details["herd_figures"]:
        for axis in axes:
            axis.axvline(herd["instant_s"] / 60, color="grey", linestyle=":", linewidth=1)
        if herd.get("last_after_instant_s") is not None:
            lateness.plot(herd["instant_s"] / 60, max(floor, herd["last_after_instant_s"]), marker="^", color="grey")
    lateness.plot([], [], marker="^", color="grey", linestyle=":", label="herd instant; ^ its last delivery")
    lateness.legend(loc="best", fontsize=8)
    for axis in axes:
        axis.axvspan(0, targets["warm_up_s"] / 60, color="grey", alpha=0.08)
        axis.grid(True, alpha=0.3)
    f = record["figures"]
    wrong = f["windows_with_early_lost_stale_or_cancelled"]
    fig.suptitle(
        f"bench soak {record['finished_at']} ({record['git_commit'][:12]}), "
        f"{_span(targets['duration_s'])}: targets {f['verdict']}\n"
        f"lateness p99 <= {targets['lateness_p99_s'] * 1000:.0f} ms in {f['windows_lateness_p99_met']} "
        f"windows; {'windows with early/lost/stale: ' + str(wrong) if wrong else 'nothing early, lost or stale'}"
        f"\nflat after {_span(targets['warm_up_s'])}: {f['flat']}",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(result_path).with_suffix(".png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


soak.chart = chart


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "chart":
        print(chart(Path(sys.argv[2])))
    else:
        print("usage: python -m bench.soak chart bench/results/<time>-soak.json", file=sys.stderr)
        sys.exit(2)
