"""CPU of jobs run one after another in one driver process that keeps its Spark session, against the same jobs each
in a process of its own (as the test suite starts them today): what a test job host, one driver and JVM per test
worker running the jobs of the tests that need no process of their own, would save a job start.

    .venv/bin/python -m bench.shared_driver [--runs 3]

Both with the suite's JVM options, class archive and interpreted Spark. Each job as in bench/job_start_cpu.py: 20
schedules due 5 s after its query runs, read back, then a graceful stop. Own process: `bench.job_start_cpu`'s run
(the job's process tree, sampled every 0.2 s). Shared: a host process (this module with --host) runs ``--runs`` + 1
jobs in turn on one broker, each on a checkpoint of its own, through `pipeline.Scheduler` with ``keep_session``; its
tree's CPU is read before a job starts and after it stopped (the host lives on, so Python workers that ended are
counted in the JVM's figure). The host's first job starts the JVM and is reported apart. Prints the figures and
writes bench/results/<stamp>-shared-driver.json.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.harness import write_result
from bench.job_start_cpu import one_run
from kafka_scheduler.harness import process_tree
from kafka_scheduler.kafka.local_broker import LocalBroker, free_port
from kafka_scheduler.kafka.topics import admin_client, ensure_topics
from tests import jvm_archive
from tests.conftest import TEST_JVM_OPTIONS, TEST_SUBMIT_OPTIONS

ROOT = Path(__file__).resolve().parents[1]


def host(bootstrap: str, work: Path) -> None:
    """Jobs in this process, one at a time: ``start APP`` on stdin starts one (``running APP`` once its query
    runs), ``stop`` stops it gracefully (``stopped APP EXIT-CODE``)."""
    from kafka_scheduler.cli.main import build_parser, setup_logging
    from kafka_scheduler.config import resolve
    from kafka_scheduler.pipeline import Scheduler

    setup_logging()  # as `kafka-scheduler run` logs
    for line in sys.stdin:
        command, _, app_id = line.strip().partition(" ")
        if command != "start":
            continue
        args = build_parser().parse_args(
            [
                "run",
                "--bootstrap-servers",
                bootstrap,
                "--app-id",
                app_id,
                "--checkpoint-dir",
                str(work / app_id / "checkpoint"),
            ]
        )
        scheduler = Scheduler(resolve(args), keep_session=True)
        outcome: list[int] = []
        job = threading.Thread(target=lambda job=scheduler, out=outcome: out.append(job.run()), daemon=True)
        job.start()
        while scheduler.query is None and job.is_alive():
            time.sleep(0.05)
        print(f"running {app_id}", flush=True)
        if sys.stdin.readline().strip() == "stop":
            scheduler.stop()
        job.join(300)
        print(f"stopped {app_id} {outcome[0] if outcome else 'none'}", flush=True)


class Host:
    def __init__(self, bootstrap: str, work: Path, submit_options: str):
        env = {
            **os.environ,
            "SPARK_SUBMIT_OPTS": submit_options,
            "SPARK_LAUNCHER_OPTS": TEST_JVM_OPTIONS,
            "KAFKA_SCHEDULER_METRICS_PORT": "0",
            "PYTHONPATH": str(ROOT),
        }
        self.log = open(work / "host.log", "w")  # noqa: SIM115 - the host writes to it for as long as it lives
        # Unbuffered bytes: select() then tells truly whether a reply waits (a buffered reader may hold one).
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.shared_driver", "--host", bootstrap, str(work)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            bufsize=0,
            cwd=ROOT,
            env=env,
        )
        self.replies = b""

    def say(self, line: str, answer: str, timeout: float = 300) -> str:
        """Send ``line``; the first reply line that starts with ``answer``, within ``timeout`` seconds."""
        self.process.stdin.write(line.encode() + b"\n")
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.replies:
                reply, self.replies = self.replies.split(b"\n", 1)
                if reply.decode().startswith(answer):
                    return reply.decode().strip()
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                raise TimeoutError(f"no {answer!r} from the host in {timeout:.0f} s (see {self.log.name})")
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the host ended (see {self.log.name})")
            self.replies += chunk

    def cpu(self) -> dict[str, float]:
        totals = {"jvm": 0.0, "python": 0.0}
        for group, _, seconds in process_tree.tree_cpu(self.process.pid).values():
            totals["jvm" if group == "jvm" else "python"] += seconds
        return totals

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(120)
        self.log.close()


def shared_run(broker: LocalBroker, host_: Host) -> dict:
    app_id = f"shared-{uuid.uuid4().hex[:6]}"
    destination = f"{app_id}-out"
    ensure_topics(admin_client(broker.bootstrap_servers), [destination], 1)
    before, started = host_.cpu(), time.monotonic()
    host_.say(f"start {app_id}", f"running {app_id}")
    running_s = round(time.monotonic() - started, 1)
    jvm_archive.deliver_a_few(broker.bootstrap_servers, f"{app_id}-schedule-requests", destination, lead_s=5.0)
    delivered_s = round(time.monotonic() - started, 1)
    stopped = host_.say("stop", f"stopped {app_id}")
    if not stopped.endswith(" 0"):
        raise RuntimeError(f"the job ended with {stopped!r}")
    after = host_.cpu()
    return {
        "running_s": running_s,
        "delivered_s": delivered_s,
        "total_cpu": {kind: round(after[kind] - before[kind], 1) for kind in after},
    }


def summary(results: list[dict]) -> dict:
    return {
        "delivered_s_median": statistics.median(r["delivered_s"] for r in results),
        "jvm_cpu_total_median": statistics.median(r["total_cpu"]["jvm"] for r in results),
        "python_cpu_total_median": statistics.median(r["total_cpu"]["python"] for r in results),
        "cpu_total_median": statistics.median(r["total_cpu"]["jvm"] + r["total_cpu"]["python"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="jobs of each kind (default 3), alternating")
    parser.add_argument("--host", nargs=2, metavar=("BOOTSTRAP", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host:
        host(args.host[0], Path(args.host[1]))
        return
    archive = jvm_archive.ensure(TEST_JVM_OPTIONS, build=True)
    if archive is None:
        raise SystemExit("no class archive: see the line above")
    options = f"{TEST_SUBMIT_OPTIONS} {jvm_archive.options(archive)}"
    own, shared = [], []
    with TemporaryDirectory(prefix="shared-driver-") as work:
        broker = LocalBroker(free_port(), Path(work) / "broker")
        broker.start()
        shared_host = Host(broker.bootstrap_servers, Path(work), options)
        try:
            first = shared_run(broker, shared_host)
            print(f"shared driver, its first job (the JVM's start): {first}", flush=True)
            for i in range(args.runs):
                own.append(one_run(broker, Path(work), options))
                print(f"own process, run {i + 1}: {own[-1]}", flush=True)
                shared.append(shared_run(broker, shared_host))
                print(f"shared driver, job {i + 2}: {shared[-1]}", flush=True)
        finally:
            shared_host.close()
            broker.stop()
    figures = {
        "own process": summary(own),
        "shared driver, after its first job": summary(shared),
        "shared driver, its first job": summary([first]),
    }
    for name, values in figures.items():
        print(f"{name}: {values}")
    path = write_result(
        "shared-driver",
        {"runs": args.runs, "schedules": jvm_archive.SCHEDULES, "submit_options": options},
        figures,
        details={"own process": own, "shared driver": [first, *shared]},
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
