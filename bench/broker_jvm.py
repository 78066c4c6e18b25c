"""CPU of the local broker's JVM with Kafka's default collector and JIT, against the test suite's settings (C1 only,
the serial collector: KAFKA_JVM_PERFORMANCE_OPTS, tests/conftest.py): what the suite's brokers, one per worker and
those of the tests that restart or secure one, cost it.

    .venv/bin/python -m bench.broker_jvm [--runs 2] [--messages 20000] [--idle 120]

Each run, the two settings one after the other, each on a broker of its own: the broker's start (from the process's
launch to an answered metadata request; formatting its data folder, a JVM of its own, is counted apart), then a test's
work (a topic of 4 partitions, ``--messages`` records of 200 bytes produced and read back), then ``--idle`` seconds
with nothing to do, as a worker's broker spends most of a run. CPU is the broker process's (process_tree.tree_cpu), the
format's
is the child's from getrusage. Prints the figures and writes bench/results/<stamp>-broker-jvm.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from confluent_kafka import Consumer, Producer

from bench.harness import write_result
from kafka_scheduler.harness import process_tree
from kafka_scheduler.kafka.local_broker import JVM_PERFORMANCE_OPTS_VARIABLE, LocalBroker, free_port
from kafka_scheduler.kafka.topics import admin_client, ensure_topics
from tests.conftest import TEST_BROKER_JVM_OPTIONS

SETTINGS = {"kafka_default": None, "suite": TEST_BROKER_JVM_OPTIONS}
PHASES = ("format", "start", "work", "idle")


def process_cpu_s(pid: int) -> float:
    return sum(seconds for _, _, seconds in process_tree.tree_cpu(pid).values())


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def work(bootstrap: str, messages: int) -> None:
    topic = "bench-broker-jvm"
    ensure_topics(admin_client(bootstrap), [topic], partitions=4)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(messages):
        producer.produce(topic, key=str(n).encode(), value=b"x" * 200)
        if n % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen, deadline = 0, time.monotonic() + 120
    while seen < messages and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(1000, 1.0) if m.error() is None)
    consumer.close()
    if seen < messages:
        raise RuntimeError(f"read {seen} of {messages} records back")


def one_run(options: str | None, messages: int, idle_s: float) -> dict[str, float]:
    if options is None:
        os.environ.pop(JVM_PERFORMANCE_OPTS_VARIABLE, None)
    else:
        os.environ[JVM_PERFORMANCE_OPTS_VARIABLE] = options
    with TemporaryDirectory(prefix="bench-broker-jvm-") as work_dir:
        broker = LocalBroker(free_port(), Path(work_dir) / "broker")
        before_format = children_cpu_s()
        broker._prepare()
        figures = {"format": children_cpu_s() - before_format}
        started = time.monotonic()
        broker.start()
        figures["start_wall_s"] = time.monotonic() - started
        try:
            pid = broker.process.pid
            figures["start"] = process_cpu_s(pid)
            work(broker.bootstrap_servers, messages)
            figures["work"] = process_cpu_s(pid) - figures["start"]
            time.sleep(idle_s)  # the measured phase is the wait itself: a broker with nothing to do
            figures["idle"] = process_cpu_s(pid) - figures["start"] - figures["work"]
        finally:
            broker.stop()
    return {key: round(value, 2) for key, value in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--idle", type=float, default=120.0, help="seconds with nothing to do (default 120)")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for n in range(args.runs):
        for name, options in SETTINGS.items():
            runs[name].append(one_run(options, args.messages, args.idle))
            print(f"run {n + 1} {name}: {runs[name][-1]}", flush=True)
    figures = {
        name: {key: round(statistics.median(r[key] for r in results), 2) for key in (*PHASES, "start_wall_s")}
        for name, results in runs.items()
    }
    for name, medians in figures.items():
        medians["idle_per_minute"] = round(medians["idle"] * 60 / args.idle, 2)
        print(f"{name}: " + ", ".join(f"{key} {value}" for key, value in medians.items()))
    path = write_result(
        "broker-jvm",
        {"runs": args.runs, "messages": args.messages, "idle_s": args.idle, "settings": SETTINGS},
        figures,
        notes="core-seconds of the broker's JVM by phase, medians; format is its own JVM",
        details={"runs": runs},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
