"""`kafka-scheduler demo` (what `make run` runs): broker if needed, scheduler, one message arriving."""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone

from confluent_kafka import Consumer

from .broker import LocalBroker, port_open
from .client import SchedulerClient, format_instant
from .topics import ensure_topics, wait_for_broker

log = logging.getLogger("kafka_scheduler.demo")

DEMO_TOPIC = "demo-deliveries"
READY_MARKER = "running: reading"


def _start_scheduler(args: argparse.Namespace) -> tuple[subprocess.Popen, threading.Event]:
    command = [sys.executable, "-m", "kafka_scheduler", "run", "--bootstrap-servers", args.bootstrap_servers,
               "--app-id", args.app_id]
    if args.checkpoint_dir:
        command += ["--checkpoint-dir", args.checkpoint_dir]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    ready = threading.Event()

    def echo() -> None:
        for line in process.stdout:
            sys.stderr.write("  [scheduler] " + line)
            if READY_MARKER in line:
                ready.set()

    threading.Thread(target=echo, daemon=True).start()
    return process, ready


def demo(args: argparse.Namespace) -> int:
    host, _, port = args.bootstrap_servers.rpartition(":")
    broker = None
    if not port_open(host, int(port)):
        if host not in ("127.0.0.1", "localhost"):
            log.error("no broker answers at %s", args.bootstrap_servers)
            return 1
        log.info("no broker at %s: starting a local one (data in %s)", args.bootstrap_servers, args.data_dir)
        broker = LocalBroker(int(port), args.data_dir).start()
    scheduler = None
    try:
        admin = wait_for_broker(args.bootstrap_servers)
        ensure_topics(admin, [DEMO_TOPIC], partitions=1)
        log.info("starting the scheduler (Spark takes a few seconds to start)")
        scheduler, ready = _start_scheduler(args)
        while not ready.wait(0.5):
            if scheduler.poll() is not None:
                log.error("the scheduler exited with code %s", scheduler.returncode)
                return 1

        consumer = Consumer({"bootstrap.servers": args.bootstrap_servers, "group.id": f"demo-{uuid.uuid4()}",
                             "auto.offset.reset": "latest", "enable.auto.commit": False})
        consumer.subscribe([DEMO_TOPIC])
        consumer.poll(2)  # join the group before the message can arrive
        marker = uuid.uuid4().hex[:8]
        with SchedulerClient(args.bootstrap_servers, app_id=args.app_id) as client:
            due = client.schedule(DEMO_TOPIC, f"+{args.delay}s", key=f"demo-{marker}",
                                  value=f"hello from kafka-scheduler ({marker})", request_id=f"demo-{marker}")
        log.info("scheduled demo-%s for %s (in %.0fs) to topic %s", marker, format_instant(due), args.delay,
                 DEMO_TOPIC)
        deadline = time.monotonic() + args.delay + 60
        arrived = None
        while arrived is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error() and message.key() == f"demo-{marker}".encode():
                arrived = message
        consumer.close()
        if arrived is None:
            log.error("the demo message did not arrive within %.0fs of its due time", 60)
            return 1
        arrival = datetime.fromtimestamp(arrived.timestamp()[1] / 1000, timezone.utc)
        log.info("ARRIVED on %s: key=%s value=%r due %s, arrived %s (%.2fs after due)", DEMO_TOPIC,
                 arrived.key().decode(), arrived.value().decode(), format_instant(due), format_instant(arrival),
                 (arrival - due).total_seconds())
        if args.once:
            return 0
        log.info("the scheduler keeps running; in another shell try:\n"
                 "  .venv/bin/kafka-scheduler schedule --to %s --at +10s --value hi --id my-1\n"
                 "  .venv/bin/kafka-scheduler cancel --id my-1\n"
                 "Ctrl-C stops the scheduler%s.", DEMO_TOPIC, " and the broker" if broker else "")
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(0.5) and scheduler.poll() is None:
            pass
        return 0
    finally:
        if scheduler is not None and scheduler.poll() is None:
            scheduler.send_signal(signal.SIGTERM)
            try:
                scheduler.wait(150)
            except subprocess.TimeoutExpired:
                scheduler.kill()
        if broker is not None:
            broker.stop()
