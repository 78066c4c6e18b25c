"""engine/spark/cpu_priority.py on a real process with threads: every thread takes the nice value, one already
nicer keeps its own, and what the process starts afterwards inherits it (as the JVM's task threads and Python
workers do). Linux only (threads have their own nice values there)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kafka_scheduler.engine.spark.cpu_priority import lower_engine_priority, lower_priority, threads_of

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread nice values: Linux")

# Four threads: one idle, one already nicer than the test asks, and one started only once stdin says so (after the
# test set the others' priority); then prints its threads' nice values.
CHILD = """
import os, sys, threading
done = threading.Event()
def nicer():
    os.setpriority(os.PRIO_PROCESS, 0, 15)
    done.wait()
threading.Thread(target=nicer, daemon=True).start()
threading.Thread(target=done.wait, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
threading.Thread(target=done.wait, daemon=True).start()
print(sorted(os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")), flush=True)
"""


def wait_for_threads(pid: int, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(threads_of(pid)) < count:
        assert time.monotonic() < deadline, f"process {pid} did not start {count} threads"
        time.sleep(0.01)


def test_every_thread_and_every_later_one_takes_the_nice_value():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        wait_for_threads(child.pid, 3)
        assert lower_priority(child.pid, 10) == 2  # the main thread and the idle one; the nicer one keeps 15
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "[10, 10, 10, 15]\n"  # main, idle, the late one (inherited), the nicer
    finally:
        child.kill()
        child.wait()


def test_zero_no_process_of_its_own_and_a_cluster_leave_things_as_they_are():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        lower_engine_priority(child, 0)
        lower_engine_priority(None, 10)
        lower_engine_priority(child, 10, local=False)  # a cluster's: the driver's JVM runs no tasks
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        lower_engine_priority(child, 12)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == max(12, os.getpriority(os.PRIO_PROCESS, 0))
    finally:
        child.kill()
        child.wait()


def test_a_process_that_has_ended_is_no_error():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert lower_priority(child.pid, 10) == 0
