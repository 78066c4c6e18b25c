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

from confluent_kafka import Producer

from kafka_scheduler.harness import process_tree
from kafka_scheduler.harness.job_process import JobNotRunning
from kafka_scheduler.harness.topic_reader import TopicReader
from kafka_scheduler.kafka.local_broker import free_port

from .harness import Environment, RequestProducer, log, wait_until
from .job_load import warmed_up
from .soak_figures import (
    FOLLOW_CANCEL,
    FOLLOW_REPLACE,
    Ledger,
    chart,
    summarize,
)

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


soak.chart = chart


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "chart":
        print(chart(Path(sys.argv[2])))
    else:
        print("usage: python -m bench.soak chart bench/results/<time>-soak.json", file=sys.stderr)
        sys.exit(2)
