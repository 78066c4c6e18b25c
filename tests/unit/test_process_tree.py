"""The job harness's view of a process tree (harness/process_tree.py), on this test's own processes."""

from __future__ import annotations

import os
import subprocess
import sys

from kafka_scheduler.harness import process_tree
from kafka_scheduler.harness.waiting import wait_until


def test_a_child_is_listed_with_its_command_and_group():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        commands = process_tree.command_lines(os.getpid())
        assert "time.sleep(60)" in commands[child.pid]
        assert child.pid in process_tree.pids_of(os.getpid(), "python_workers")
        assert os.getpid() in process_tree.pids_of(os.getpid(), "python_driver")
        assert child.pid not in process_tree.pids_of(os.getpid(), "jvm")
    finally:
        child.kill()
        child.wait()


def test_a_process_that_ends_between_the_listing_and_the_read_is_left_out(monkeypatch):
    """Spark's Python workers end at any moment; reading one's command line then raises FileNotFoundError."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = process_tree.command_line

        def ended(pid: int) -> str:
            if pid == child.pid:
                raise FileNotFoundError(f"/proc/{pid}/cmdline")
            return real(pid)

        monkeypatch.setattr(process_tree, "command_line", ended)
        assert child.pid in process_tree.descendants(os.getpid())
        assert child.pid not in process_tree.command_lines(os.getpid())
        assert child.pid not in process_tree.pids_of(os.getpid(), "python_workers")
    finally:
        child.kill()
        child.wait()


def test_the_spark_jvm_is_the_java_whose_parent_is_not_a_java(tmp_path):
    """A process the JVM spawns carries the JVM's command line until it execs; it is not a second JVM."""
    java = tmp_path / "java"
    java.symlink_to(sys.executable)
    sleeping = "import time; time.sleep(60)"
    spawning = f"import subprocess, sys; subprocess.Popen([sys.argv[1], '-c', {sleeping!r}]); {sleeping}"
    parent = subprocess.Popen([str(java), "-c", spawning, str(java)])
    try:
        # Rooted at the java itself: the suite's own brokers and jobs are JVMs below this process too.
        wait_until(lambda: len(process_tree.pids_of(parent.pid, "jvm")) == 2, 30, "the java and its child")
        assert process_tree.spark_jvm(parent.pid) == parent.pid
    finally:
        process_tree.kill_tree(parent.pid)
        parent.wait()
