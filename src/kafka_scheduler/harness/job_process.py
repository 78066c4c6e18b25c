"""The scheduler job as a child process, watched from outside: the one harness of the demo (`make run`), the
integration tests, the benchmarks and the crash suite.

``JobProcess`` runs ``kafka-scheduler run`` (or ``submit``) with its output appended to a log file, follows the log
as it grows (each line with the wall time it appeared, and an optional callback per line), and knows the job's
milestones by the lines it logs: ``running: reading`` once the query runs, ``first batch done`` once a batch has
committed. It stops the job with SIGTERM (graceful) or kills its whole process tree (a crash).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..config import TICKS_SUFFIX
from ..engine.contract import TICK_WAKE
from . import process_tree
from .waiting import wait_until

RUNNING_LINE = "running: reading"  # pipeline.Scheduler logs it once the query has started
FIRST_BATCH_LINE = "first batch done"  # ... and this once the first batch has committed
DEFAULT_LAUNCHER = (sys.executable, "-m", "kafka_scheduler")


class JobNotRunning(AssertionError):
    """The job exited when it should be running (an AssertionError, so a test reports it as a failure)."""


class LogFollower(threading.Thread):
    """Tails a log file from an offset: every complete line with the wall time it was seen, handed to ``on_line``
    as it comes. Ends once the process has exited and the file holds nothing more."""

    def __init__(
        self,
        path: Path,
        offset: int,
        process: subprocess.Popen,
        interval: float,
        on_line: Callable[[str], None] | None = None,
    ):
        super().__init__(daemon=True, name="job-log-follower")
        self.path, self.offset, self.process, self.interval, self.on_line = path, offset, process, interval, on_line
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.start()

    def run(self) -> None:
        pending = b""
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            while True:
                ended = self.process.poll() is not None
                chunk = handle.read()
                now = time.time()
                if chunk:
                    *complete, pending = (pending + chunk).split(b"\n")
                    lines = [line.decode(errors="replace") for line in complete]
                    with self._lock:
                        self.lines.extend((now, line) for line in lines)
                    if self.on_line is not None:
                        for line in lines:
                            self.on_line(line)
                elif ended:
                    return
                else:
                    time.sleep(self.interval)

    def snapshot(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self.lines)

    def first(self, pattern: str) -> tuple[float, re.Match] | None:
        """(wall time, match) of the first line matching ``pattern``, or None."""
        regex = re.compile(pattern)
        for seen, line in self.snapshot():
            match = regex.search(line)
            if match:
                return seen, match
        return None

    def last(self, pattern: str) -> tuple[float, re.Match] | None:
        regex = re.compile(pattern)
        for seen, line in reversed(self.snapshot()):
            match = regex.search(line)
            if match:
                return seen, match
        return None


class JobProcess:
    """``kafka-scheduler run`` (or ``subcommand``, e.g. submit) as a child process, its output appended to
    ``log_path`` (a restart appends to the same file; ``log()`` is what the current run logged)."""

    def __init__(
        self,
        bootstrap: str,
        app_id: str,
        checkpoint_dir: Path,
        log_path: Path,
        extra_args: Sequence = (),
        launcher: Sequence[str] = DEFAULT_LAUNCHER,
        subcommand: str = "run",
        env: dict | None = None,
        own_session: bool = False,
        follow_interval: float = 0.05,
        on_line: Callable[[str], None] | None = None,
    ):
        """``own_session``: in a session of its own, so a Ctrl-C to the caller's terminal does not reach it (the
        caller stops it). ``on_line``: called with each line the job logs, as it appears."""
        self.app_id = app_id
        self.bootstrap = bootstrap
        self.checkpoint_dir = Path(checkpoint_dir)
        self.log_path = Path(log_path)
        self.command = [
            *launcher,
            subcommand,
            "--bootstrap-servers",
            bootstrap,
            "--app-id",
            app_id,
            "--checkpoint-dir",
            str(checkpoint_dir),
            *map(str, extra_args),
        ]
        self.env = env
        self.own_session = own_session
        self.follow_interval = follow_interval
        self.on_line = on_line
        self.process: subprocess.Popen | None = None
        self.follower: LogFollower | None = None
        self.started_at = 0.0  # wall time of the last start
        self._log_offset = 0

    # ------------------------------------------------------------ starting and stopping

    def start(self, timeout: float = 180.0, wait: bool = True) -> JobProcess:
        """Start the process; with ``wait``, until it logs that its query runs."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.started_at = time.time()
        env = {**(os.environ if self.env is None else self.env), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=self.own_session,
            )
        self.follower = LogFollower(self.log_path, self._log_offset, self.process, self.follow_interval, self.on_line)
        if wait:
            self.wait_for_line(RUNNING_LINE, timeout, f"scheduler {self.app_id} to start")
        return self

    def stop(self, timeout: float = 180.0, kill_after: bool = False) -> int:
        """SIGTERM (a graceful stop) and wait; the exit code. Still running at ``timeout``: killed, and then
        ``kill_after`` returns its code, otherwise a JobNotRunning names the hang with the log's end."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
            if kill_after:
                return code
            raise JobNotRunning(
                f"scheduler {self.app_id} did not stop within {timeout:.0f}s:\n{self.log()[-3000:]}"
            ) from None

    def kill_tree(self, timeout: float = 60.0) -> int:
        """SIGKILL the job's whole process tree at once (driver, JVM, Python workers), as a machine crash would,
        and wait until every one of them is gone; how many processes were killed."""
        pids = process_tree.kill_tree(self.process.pid)
        self.process.wait()
        wait_until(lambda: process_tree.all_gone(pids), timeout, "the killed job's processes to end")
        return len(pids)

    def wait_ended(self, timeout: float) -> int:
        return self.process.wait(timeout)

    # ------------------------------------------------------------ what it logged

    def log(self) -> str:
        """What this run (since the last start) has logged."""
        return self.log_since(self._log_offset)

    def log_since(self, mark: int) -> str:
        """What was logged after byte ``mark`` of the log file."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(mark)
            return log.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def first(self, pattern: str) -> tuple[float, re.Match] | None:
        """(wall time, match) of this run's first line matching ``pattern``, or None."""
        return self.follower.first(pattern) if self.follower else None

    def last(self, pattern: str) -> tuple[float, re.Match] | None:
        return self.follower.last(pattern) if self.follower else None

    def wait_for_line(self, text: str, timeout: float, what: str) -> None:
        """Until this run logs a line containing ``text``; JobNotRunning if the job exits first."""
        wait_until(lambda: text in self.log(), timeout, what, guard=self.assert_running)

    # ------------------------------------------------------------ while it runs

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def assert_running(self) -> None:
        """Fail at once, with the exit code and the end of the log, if the job has exited."""
        if self.running:
            return
        code = None if self.process is None else self.process.returncode
        log = self.log()
        raise JobNotRunning(
            f"scheduler {self.app_id} is not running (exit code {code}); errors logged: "
            f"{logged_errors(log)[:3] or '-'}\n--- log tail:\n{log[-3000:]}"
        )

    def wake(self) -> None:
        """Make the job run a micro-batch soon: a wake-up tick, as its own driver writes them."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "log_level": 3})
        producer.produce(self.app_id + TICKS_SUFFIX, value=TICK_WAKE)
        producer.flush(30)

    def memory(self) -> dict[str, int]:
        """Resident bytes of the job's processes per kind (process_tree.GROUPS); empty once it has exited."""
        return process_tree.tree_rss(self.process.pid) if self.running else {}

    def cpu(self) -> dict:
        """A CPU sample of the job's process tree (process_tree.tree_cpu); empty once it has exited."""
        return process_tree.tree_cpu(self.process.pid) if self.running else {}


def logged_errors(log: str) -> list[str]:
    """Exception summaries in a log (a traceback's last line, a Java exception's first), first ones first: the
    root cause tends to come before the failures it causes."""
    causes: list[str] = []
    for line in log.splitlines():
        match = re.match(r"[\w.$]*(Error|Exception): .*", line)
        summary = match and "".join(c if c.isprintable() else "?" for c in match.group(0)[:240])
        if summary and summary not in causes:
            causes.append(summary)
    return causes
