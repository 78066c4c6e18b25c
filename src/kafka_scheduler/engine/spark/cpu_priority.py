"""The Spark JVM the driver starts in local mode runs at a lower CPU priority than the driver's own process.

On one host (local mode, the bench, a small deployment) the JVM runs a batch's bulk work, and its Python workers the
state step, beside the driver's read of the inputs as they arrive (early_cancels.CancelWatcher) and its timed
writer. A batch accepting a backlog of 1,000,000 took both cores, and the read, one Python thread that must see
every record to find the urgent ones, fell 13-14 s behind: every schedule due meanwhile waited that long, since the
timed writer holds back what is due after what has been read. With the JVM at nice 10 it fell 6 s behind, and the
batches were no slower (docs/measurements.md, "The driver's read ahead of the bulk work"). A higher nice value for
the JVM's threads lets the driver's threads run first whenever they are ready; when the driver is idle the JVM has
the CPU as before.

Linux gives each thread its own nice value and a new thread (a JVM thread, a forked Python worker) takes its
creator's: setting every thread of the JVM right after it starts, before its first job, covers what it starts later.
Raising a nice value needs no privilege; lowering it back does, so it is set once.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

MAX_PASSES = 5  # a JVM that is still starting threads settles within a pass or two


def threads_of(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (Linux); [pid] where /proc does not list them (the process as a whole)."""
    try:
        return sorted(int(name) for name in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return [pid]


def lower_priority(pid: int, niceness: int) -> int:
    """Give every thread of process ``pid`` at least nice value ``niceness`` (one already nicer keeps its own).
    Returns how many threads were set; a thread that ended meanwhile, or one the system refuses, is skipped. A thread
    that one not set yet starts meanwhile has its creator's value: the threads are listed again until none is new."""
    changed = 0
    seen: set[int] = set()
    for _ in range(MAX_PASSES):
        new = [thread for thread in threads_of(pid) if thread not in seen]
        if not new:
            break
        seen.update(new)
        for thread in new:
            try:
                if os.getpriority(os.PRIO_PROCESS, thread) < niceness:
                    os.setpriority(os.PRIO_PROCESS, thread, niceness)
                    changed += 1
            except OSError:  # ended meanwhile, or refused
                continue
    return changed


def lower_engine_priority(jvm_process, niceness: int, local: bool = True) -> None:
    """The job's Spark JVM (``session.driver_jvm_process``: None under spark-submit, which started the JVM as this
    process's parent) and what it starts later at nice value ``niceness``; 0 leaves them at the driver's. Only with a
    ``local`` master: on a cluster the JVM the driver starts runs no tasks, and the executors are elsewhere."""
    if niceness <= 0 or not local:
        return
    if jvm_process is None or not hasattr(os, "setpriority"):
        log.debug("engine priority: no JVM of this process's own to set")
        return
    changed = lower_priority(jvm_process.pid, niceness)
    log.debug("engine priority: %d thread(s) of the Spark JVM (pid %d) at nice %d", changed, jvm_process.pid, niceness)
