"""Only the driver stops the job: the engine's processes stay deaf to SIGTERM.

A stop sent to the whole process group (``kill -- -PGID``, some supervisors) or to every process of a service
(systemd's default ``KillMode=control-group``) reaches Spark's JVM and its Python workers at the same moment as the
Python driver. The JVM would run its shutdown hooks and stop the SparkContext under the driver, and the workers would
die mid-batch: the batch in flight fails, the log fills with py4j tracebacks, and its records are written again by
the batch's re-run. Instead the driver alone acts on the signal: it lets the batch in flight commit, stops the query,
then the session; the JVM exits when the driver does (PySpark's gateway ends on the driver's EOF), and the workers
with it.

A child inherits an ignored signal across exec, and HotSpot leaves a shutdown signal alone when it starts with it
ignored; a blocked signal stays blocked in the JVM and in the Python daemon and workers it spawns. So SIGTERM is
blocked and ignored in the driver while Spark's JVM is launched, and restored afterwards: on Linux a signal that is
blocked is never discarded as ignored, so one that arrives meanwhile is delivered to the driver's handler once
unblocked.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def engine_deaf_to_sigterm() -> Iterator[None]:
    """Processes started inside (Spark's JVM, and what it starts) ignore SIGTERM; the caller's handler is kept and
    gets any SIGTERM that arrives meanwhile. Only from the main thread (signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    # Setting SIG_IGN discards a pending SIGTERM: one that came in the instant before is noted and sent again.
    arrived = signal.SIGTERM in signal.sigpending()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        if arrived:
            os.kill(os.getpid(), signal.SIGTERM)
