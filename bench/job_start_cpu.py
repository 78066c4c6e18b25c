"""CPU a job costs from its start to its first deliveries and a graceful stop, with the test suite's JVM options, with
its class archive too (tests/jvm_archive.py), and with Spark interpreted too (tests/conftest.py, TEST_SUBMIT_OPTIONS).
The test suite is bound by CPU, three quarters of it in the Spark JVMs of the jobs it starts; this is the figure that
decides how a change to a job's start pays off.

    .venv/bin/python -m bench.job_start_cpu [--runs 2] [--variants archive,interpreted]

Each run: a job on a broker of its own, 20 schedules due 5 s after the job runs, read back, then SIGTERM. CPU is
read from /proc for every process of the job's tree (sampled every 0.2 s, so a process that lives less than that is
missed), per kind: the JVM, Python (driver and workers). Both variants use the suite's JVM options. Prints the
figures and writes bench/results/<stamp>-job-start-cpu.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.harness import write_result
from kafka_scheduler.harness import process_tree
from kafka_scheduler.harness.job_process import FIRST_BATCH_LINE, RUNNING_LINE, JobProcess
from kafka_scheduler.kafka.local_broker import LocalBroker, free_port
from kafka_scheduler.kafka.topics import admin_client, ensure_topics
from tests import jvm_archive
from tests.conftest import TEST_JVM_OPTIONS, TEST_SUBMIT_OPTIONS


class TreeCpu(threading.Thread):
    """CPU seconds of every process below a root, the last value seen per process, by kind."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root = root
        self.seen: dict[tuple[int, str], tuple[float, str]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for pid in process_tree.descendants(self.root):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    kind = "jvm" if process_tree.command_line(pid).split(" ")[0].endswith("java") else "python"
                except OSError:
                    continue
                cpu = (int(fields[11]) + int(fields[12])) / process_tree.CLOCK_TICKS
                self.seen[(pid, fields[19])] = (cpu, kind)  # (pid, start time): a pid reused is another process
            time.sleep(0.2)

    def by_kind(self) -> dict[str, float]:
        totals = {"jvm": 0.0, "python": 0.0}
        for cpu, kind in list(self.seen.values()):
            totals[kind] += cpu
        return {kind: round(cpu, 1) for kind, cpu in totals.items()}


def one_run(broker: LocalBroker, work: Path, submit_options: str) -> dict:
    app_id = f"cpu-{uuid.uuid4().hex[:6]}"
    destination = f"{app_id}-out"
    ensure_topics(admin_client(broker.bootstrap_servers), [destination], 1)
    job = JobProcess(
        broker.bootstrap_servers,
        app_id,
        work / app_id / "checkpoint",
        work / app_id / "job.log",
        env={**os.environ, "SPARK_SUBMIT_OPTS": submit_options, "SPARK_LAUNCHER_OPTS": TEST_JVM_OPTIONS},
    )
    started = time.monotonic()
    job.start(wait=False)
    sampler = TreeCpu(job.process.pid)
    sampler.start()
    job.wait_for_line(RUNNING_LINE, 180, "the query to run")
    running = (round(time.monotonic() - started, 1), sampler.by_kind())
    jvm_archive.deliver_a_few(broker.bootstrap_servers, f"{app_id}-schedule-requests", destination, lead_s=5.0)
    delivered = (round(time.monotonic() - started, 1), sampler.by_kind())
    job.stop()
    time.sleep(1.0)  # the sampler's last look at the processes as they end
    sampler.stopping.set()
    sampler.join()
    assert FIRST_BATCH_LINE in job.log()
    return {
        "running_s": running[0],
        "running_cpu": running[1],
        "delivered_s": delivered[0],
        "delivered_cpu": delivered[1],
        "total_cpu": sampler.by_kind(),
    }


# Short names (--variants) and the names the figures go by: each adds to the one before.
VARIANTS = {"jvm": "suite JVM options", "archive": "and the class archive", "interpreted": "and Spark interpreted"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each variant, alternating (default 2)")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"which, comma-separated, of {', '.join(VARIANTS)} (default all)"
    )
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or not chosen:
        parser.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(VARIANTS)}")
    archive = jvm_archive.ensure(TEST_JVM_OPTIONS, build=True)
    if archive is None:
        raise SystemExit("no class archive: see the line above")
    options = {
        "jvm": TEST_JVM_OPTIONS,
        "archive": f"{TEST_JVM_OPTIONS} {jvm_archive.options(archive)}",
        "interpreted": f"{TEST_SUBMIT_OPTIONS} {jvm_archive.options(archive)}",
    }
    variants = {VARIANTS[name]: options[name] for name in chosen}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    with TemporaryDirectory(prefix="job-start-cpu-") as work:
        broker = LocalBroker(free_port(), Path(work) / "broker")
        broker.start()
        try:
            for i in range(args.runs):
                for name, options in variants.items():
                    runs[name].append(one_run(broker, Path(work), options))
                    print(f"{name}, run {i + 1}: {runs[name][-1]}", flush=True)
        finally:
            broker.stop()
    figures = {}
    for name, results in runs.items():
        figures[name] = {
            "running_s_median": statistics.median(r["running_s"] for r in results),
            "jvm_cpu_to_running_median": statistics.median(r["running_cpu"]["jvm"] for r in results),
            "delivered_s_median": statistics.median(r["delivered_s"] for r in results),
            "jvm_cpu_total_median": statistics.median(r["total_cpu"]["jvm"] for r in results),
            "python_cpu_total_median": statistics.median(r["total_cpu"]["python"] for r in results),
        }
        print(f"{name}: {figures[name]}")
    path = write_result(
        "job-start-cpu",
        {"runs": args.runs, "schedules": jvm_archive.SCHEDULES, "variants": variants},
        figures,
        details={"runs": runs},
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
