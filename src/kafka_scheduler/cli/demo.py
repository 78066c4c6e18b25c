"""`kafka-scheduler demo` (what `make run` runs): broker if needed, scheduler, one message arriving, and then
every delivery to the demo topic as it arrives, with its due time and lateness."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from .. import protocol
from ..client.encoders import epoch_millis_up
from ..client.scheduler_client import SchedulerClient, format_instant, parse_due
from ..config import REQUESTS_SUFFIX, Config
from ..harness.job_process import FIRST_BATCH_LINE, JobProcess
from ..kafka.client_log import quiet_client_config
from ..kafka.local_broker import LocalBroker, port_open
from ..kafka.topics import ensure_topics, wait_for_broker
from .engine_noise import EngineNoiseFilter, debug_enabled

log = logging.getLogger("kafka_scheduler.cli.demo")

DEMO_TOPIC = "demo-deliveries"
ARRIVAL_TIMEOUT_S = 180.0  # a first batch on a busy laptop can take a minute or two
STATUS_PAGE_LINE = re.compile(r"status page: (http://\S+)")  # the scheduler's line (ops.http_server.serve)


def status_page_url(line: str) -> str | None:
    """The status page's address, from the scheduler line that announces it (none with --metrics-port 0)."""
    found = STATUS_PAGE_LINE.search(line)
    return found.group(1) if found else None


def _start_scheduler(args: argparse.Namespace) -> tuple[JobProcess, dict]:
    """The scheduler as a child process (the harness's JobProcess), its log in a file beside the broker's data; what
    it logs is echoed here but for the engines' noise. Its own session: Ctrl-C reaches the demo only, which stops the
    scheduler with SIGTERM before the broker."""
    noise = EngineNoiseFilter(everything=debug_enabled())
    seen: dict = {}

    def echo(line: str) -> None:
        if noise.shows(line):
            sys.stderr.write("  [scheduler] " + line + "\n")
        if "status_page" not in seen and (url := status_page_url(line)):
            seen["status_page"] = url

    checkpoint_dir = args.checkpoint_dir or Config(app_id=args.app_id).checkpoint_dir
    scheduler = JobProcess(
        args.bootstrap_servers,
        args.app_id,
        Path(checkpoint_dir),
        Path(args.data_dir).parent / "scheduler.log",
        own_session=True,
        on_line=echo,
    )
    return scheduler.start(wait=False), seen


class DeliveryWatch:
    """Reads the demo topic from now on, and the request topic from its start to learn each delivery's due time:
    a delivery's ``x-scheduler-delivery-id`` is the topic-partition-offset of the request it comes from."""

    def __init__(self, bootstrap_servers: str, app_id: str):
        self.requests_topic = app_id + REQUESTS_SUFFIX
        self._broker_down_noted = False
        self._bootstrap_servers = bootstrap_servers
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"demo-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "error_cb": self._on_error,
                **quiet_client_config(),
            }
        )
        self._requests: dict[str, tuple[str | None, datetime]] = {}
        assignment = []
        for topic in (DEMO_TOPIC, self.requests_topic):
            metadata = self.consumer.list_topics(topic, timeout=30).topics[topic]
            for partition in metadata.partitions:
                tp = TopicPartition(topic, partition)
                # From the demo topic's current end: what arrived before this run is not news.
                tp.offset = (
                    self.consumer.get_watermark_offsets(tp, timeout=30)[1] if topic == DEMO_TOPIC else OFFSET_BEGINNING
                )
                assignment.append(tp)
        self.consumer.assign(assignment)

    def _on_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            if not self._broker_down_noted:
                log.warning("lost the broker at %s: %s", self._bootstrap_servers, error.str())
                self._broker_down_noted = True
        elif error.code() != KafkaError._TRANSPORT:  # a dropped connection is retried; all down is said above
            log.warning("demo consumer: %s", error.str())

    def _learn_request(self, message) -> None:
        headers = dict(message.headers() or [])
        action = (headers.get(protocol.ACTION) or b"ADD").decode(errors="replace").upper()
        if action == "CANCEL" or headers.get(protocol.DELIVER_TO) != DEMO_TOPIC.encode():
            return
        try:
            due = parse_due(headers[protocol.DELIVER_AT].decode())
        except Exception:
            return
        due = datetime.fromtimestamp(epoch_millis_up(due) / 1000, UTC)  # as the scheduler reads it
        request_id = headers.get(protocol.REQUEST_ID)
        self._requests[f"{message.topic()}-{message.partition()}-{message.offset()}"] = (
            request_id.decode(errors="replace") if request_id is not None else None,
            due,
        )

    def poll(self, timeout: float):
        """The next delivery on the demo topic within ``timeout`` (printed), or None."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.consumer.poll(max(0.0, deadline - time.monotonic()))
            if message is None:
                return None
            if message.error():
                continue
            if message.topic() == self.requests_topic:
                self._learn_request(message)
                continue
            self._print(message)
            return message

    def _print(self, message) -> None:
        headers = dict(message.headers() or [])
        delivery_id = (headers.get(protocol.DELIVERY_ID) or b"").decode(errors="replace")
        request_id, due = self._requests.get(delivery_id, (None, None))  # a redelivery has the same id
        arrived = datetime.fromtimestamp(message.timestamp()[1] / 1000, UTC)
        when = f"due {format_instant(due)}, {(arrived - due).total_seconds():.2f}s late" if due else "due time unknown"
        log.info(
            "delivered %s%s to %s at %s (%s): %s",
            f"id={request_id} " if request_id else "",
            f"key={_text(message.key())}",
            message.topic(),
            format_instant(arrived),
            when,
            _text(message.value()),
        )

    def close(self) -> None:
        self.consumer.close()


def _text(data: bytes | None, limit: int = 80) -> str:
    if data is None:
        return "null"
    text = data.decode(errors="replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


def demo(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    host, _, port = args.bootstrap_servers.rpartition(":")
    broker = scheduler = watch = None
    try:
        if not port_open(host, int(port)):
            if host not in ("127.0.0.1", "localhost"):
                log.error("no broker answers at %s", args.bootstrap_servers)
                return 1
            log.info("no broker at %s: starting a local one (data in %s)", args.bootstrap_servers, args.data_dir)
            broker = LocalBroker(int(port), args.data_dir, own_session=True).start()
        admin = wait_for_broker(args.bootstrap_servers)
        ensure_topics(admin, [DEMO_TOPIC], partitions=1)
        del admin  # no client left to retry connecting while the broker stops at the end
        if stop.is_set():
            return 0
        log.info("starting the scheduler (Spark takes a few seconds to start)")
        scheduler, seen = _start_scheduler(args)
        # The demo message is scheduled once the first batch has committed: Spark, the state store and the Python
        # workers are up, so what comes next is the scheduler's steady pace, not its cold start.
        while FIRST_BATCH_LINE not in scheduler.log():
            if stop.wait(0.2):
                return 0
            if not scheduler.running:
                log.error(
                    "the scheduler exited with code %s; its log: %s", scheduler.process.returncode, scheduler.log_path
                )
                return 1

        watch = DeliveryWatch(args.bootstrap_servers, args.app_id)
        marker = uuid.uuid4().hex[:8]
        with SchedulerClient(
            args.bootstrap_servers, app_id=args.app_id, producer_config=quiet_client_config()
        ) as client:
            due = client.schedule(
                DEMO_TOPIC,
                f"+{args.delay}s",
                key=f"demo-{marker}",
                value=f"hello from kafka-scheduler ({marker})",
                request_id=f"demo-{marker}",
            )
        log.info("scheduled demo-%s for %s (in %.0fs) to %s", marker, format_instant(due), args.delay, DEMO_TOPIC)
        deadline = time.monotonic() + args.delay + ARRIVAL_TIMEOUT_S
        arrived = False
        while not arrived:
            if stop.is_set():
                return 0
            if time.monotonic() > deadline:
                log.error("the demo message did not arrive within %.0fs of its due time", ARRIVAL_TIMEOUT_S)
                return 1
            message = watch.poll(0.5)
            arrived = message is not None and message.key() == f"demo-{marker}".encode()
        if args.once:
            return 0
        page = seen.get("status_page")
        log.info(
            "the scheduler keeps running; every delivery to %s shows here. In another shell try:\n"
            "  .venv/bin/kafka-scheduler schedule --to %s --at +10s --value hi --id my-1\n"
            "  .venv/bin/kafka-scheduler cancel --id my-1\n"
            "%sCtrl-C stops the scheduler%s.",
            DEMO_TOPIC,
            DEMO_TOPIC,
            f"The status page (pending schedules, upcoming deliveries, health, look-up by id): {page}\n"
            if page
            else "",
            " and the broker" if broker else "",
        )
        while not stop.is_set():
            watch.poll(0.5)
            if not scheduler.running:
                log.error(
                    "the scheduler exited with code %s; its log: %s", scheduler.process.returncode, scheduler.log_path
                )
                return 1
            if broker is not None and broker.process.poll() is not None:
                log.error("the broker exited with code %s; see %s", broker.process.returncode, broker.log_file)
                return 1
        return 0
    finally:
        if watch is not None:
            watch.close()
        if scheduler is not None and scheduler.running:
            log.info("stopping the scheduler%s", " and the broker" if broker else "")
            scheduler.stop(150, kill_after=True)
            scheduler.follower.join(5)  # its last lines (how it stopped) before ours
        if broker is not None:
            broker.stop()
