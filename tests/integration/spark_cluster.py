"""A Spark standalone cluster on loopback for the tests: one master and N workers, each its own JVM, started
from the pip pyspark install (bin/spark-class), as an operator starts them on real machines.

    with LocalSparkCluster(tmp_path, workers=2) as cluster:
        ... kafka-scheduler run --master cluster.master_url ...

Each worker launches the application's executor as a child JVM (CoarseGrainedExecutorBackend); when that
executor dies, the worker tells the master, which has a worker start a replacement. Every process runs in a
session of its own, so stopping kills the whole group, executors included, even after a failed test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

from kafka_scheduler.kafka.local_broker import free_port

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class LocalSparkCluster:
    def __init__(
        self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g", daemon_memory: str = "256m"
    ):
        self.workdir = Path(workdir)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.webui_port = free_port()
        # Loopback only: the driver, master, workers and executors all reach each other on 127.0.0.1.
        self.env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": daemon_memory,
            # No REST submission server: its fixed port (6066) is not needed and may be taken.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_WORKER_DIR": str(self.workdir / "work"),
        }
        self.processes: list[subprocess.Popen] = []
        self.worker_processes: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalSparkCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _launch(self, name: str, *args: str) -> subprocess.Popen:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / f"{name}.log", "ab") as log:
            # spark-class execs the JVM, so the pid is the JVM's; the new session lets stop() reach its children.
            process = subprocess.Popen(
                [str(SPARK_CLASS), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def start(self, timeout: float = 90.0) -> None:
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
        )
        for i in range(self.workers):
            self.worker_processes.append(
                self._launch(
                    f"worker-{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(self.workdir / f"work-{i}"),
                    self.master_url,
                )
            )
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            dead = [p.args[1] for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"spark cluster not up ({self.alive_workers()}/{self.workers} workers; "
                    f"exited: {dead}); logs in {self.workdir}"
                )
            time.sleep(0.3)

    def state(self) -> dict:
        """The master's view (its web UI's JSON): workers, applications, cores in use."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json", timeout=5) as response:
            return json.load(response)

    def alive_workers(self) -> int:
        try:
            return int(self.state().get("aliveworkers", 0))
        except (OSError, ValueError):  # the master's UI is not listening yet, or serves its HTML page at first
            return 0

    def executors(self) -> list[int]:
        """Pids of the executor JVMs the workers launched (their direct children)."""
        workers = {p.pid for p in self.worker_processes if p.poll() is None}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent in workers and EXECUTOR_MAIN in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
        return sorted(found)

    def stop(self) -> None:
        # Workers first (their executors are in their groups), the master last.
        for process in reversed(self.processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for process in reversed(self.processes):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            # An executor outlives its worker's exit when the worker's shutdown hook is slow: end the group.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
