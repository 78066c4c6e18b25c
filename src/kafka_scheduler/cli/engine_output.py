"""What a command that starts the engines prints: its own lines, and of what the engines print only what matters.

Spark's JVM and its Python workers are child processes: they print onto the standard output and error they inherit,
file descriptors 1 and 2, not through anything of ours. So for the length of a command, ``EngineOutput`` puts a pipe
on each of those descriptors, before the engines start, and a thread reads each pipe and writes on to the real
stream the lines ``EngineNoiseFilter`` shows (engine_noise.py: the one place that decides). Our own Python output
(``sys.stdout``, ``sys.stderr`` and the log handlers on them) is pointed straight at the real streams: nothing of
ours passes the filter, so nothing of ours can be lost to it. ``KAFKA_SCHEDULER_LOG_LEVEL=DEBUG`` leaves the
descriptors alone: everything shows.

At the end the pipes are drained (what the engines printed before the end is written, a last line without its
newline too) and the real streams put back on 1 and 2. The engines' JVM lives until this process exits and keeps
its end of the pipes: the threads go on forwarding what it prints until then.
"""

from __future__ import annotations

import array
import fcntl
import io
import logging
import os
import sys
import termios
import threading
import time

from .engine_noise import EngineNoiseFilter

QUIET_S = 0.1  # the pipes are drained once nothing came for this long ...
DRAIN_TIMEOUT_S = 2.0  # ... or after this long, whatever a chatty engine still prints
LONGEST_LINE = 1 << 20  # a line without a newline is judged and written once it is this long


def _bytes_waiting(fd: int) -> int:
    waiting = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, waiting)
    return waiting[0]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Pump(threading.Thread):
    """Reads a pipe line by line and writes the lines the filter shows to ``real_fd``, until the pipe's writers are
    all gone (or the process ends: a daemon thread)."""

    def __init__(self, read_fd: int, real_fd: int, name: str):
        super().__init__(daemon=True, name=f"engine-output-{name}")
        self.read_fd, self.real_fd = read_fd, real_fd
        self.noise = EngineNoiseFilter()
        self.lock = threading.Lock()  # held while a chunk is handled, and by drain() for the partial line
        self.reads = 0
        self.waiting = False  # blocked in read with nothing handled since
        self.writable = True  # False once the real stream refused a write (a closed pipe): lines are dropped
        self._partial = b""

    def run(self) -> None:
        while True:
            self.waiting = True
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                chunk = b""
            self.reads += 1
            self.waiting = False
            with self.lock:
                if not chunk:  # every writer is gone
                    self._flush_partial(ended=True)
                    os.close(self.read_fd)
                    return
                *lines, self._partial = (self._partial + chunk).split(b"\n")
                for line in lines:
                    self._emit(line + b"\n")
                if len(self._partial) >= LONGEST_LINE:
                    self._flush_partial(ended=False)

    def _flush_partial(self, ended: bool) -> None:
        """Judge and write what has come of a line without its newline yet; ``ended``: nothing more of it is awaited
        now, so it is ended with a newline (what comes next starts a line of its own)."""
        if self._partial:
            self._emit(self._partial + (b"\n" if ended else b""))
            self._partial = b""

    def _emit(self, line: bytes) -> None:
        if not self.noise.shows(line.decode(errors="replace").rstrip("\r\n")) or not self.writable:
            return
        try:
            _write_all(self.real_fd, line)
        except OSError:
            self.writable = False  # keep reading: a child must never block on a full pipe

    def idle(self) -> bool:
        """Nothing waiting in the pipe, nothing being handled."""
        if not self.is_alive():
            return True
        try:
            return self.waiting and _bytes_waiting(self.read_fd) == 0
        except OSError:  # closed at the end of the pipe
            return True

    def drain(self) -> None:
        """Wait (at most DRAIN_TIMEOUT_S) until the pipe has been idle for QUIET_S, then write out a last line
        that has no newline yet."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            reads = self.reads
            if self.idle():
                time.sleep(QUIET_S)
                if self.idle() and self.reads == reads:
                    break
            else:
                time.sleep(0.01)
        with self.lock:
            self._flush_partial(ended=True)


class _Route:
    """One standard descriptor (1 or 2) on a pipe through a pump, and the Python stream ``sys.<name>`` pointed
    straight at the real stream."""

    def __init__(self, fd: int, name: str):
        self.fd, self.name = fd, name
        self.real_fd = os.dup(fd)  # not inherited: children get only the pipe
        self.stream = getattr(sys, name)
        if self.stream is not None:
            self.stream.flush()
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)  # inheritable: the engines' processes print into the pipe
        os.close(write_fd)
        self.pump = _Pump(read_fd, self.real_fd, name)
        self.pump.start()
        self.direct = None
        if self.stream is not None and _fileno(self.stream) == fd:  # not a test's capture, for one
            self.direct = io.TextIOWrapper(
                io.BufferedWriter(io.FileIO(self.real_fd, "w", closefd=False)),
                encoding=self.stream.encoding,
                errors=self.stream.errors,
                line_buffering=self.stream.line_buffering,
                write_through=getattr(self.stream, "write_through", False),
            )
            setattr(sys, name, self.direct)
            _repoint_handlers(self.stream, self.direct)

    def restore(self) -> None:
        self.pump.drain()  # our own lines keep going straight out meanwhile
        if self.direct is not None:
            self.direct.flush()
            setattr(sys, self.name, self.stream)
            _repoint_handlers(self.direct, self.stream)
        os.dup2(self.real_fd, self.fd)
        # real_fd stays open: a handler set up meanwhile may still write through ``direct``, and a closed number
        # could be reused by another file.


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _repoint_handlers(old, new) -> None:
    """Log handlers writing to ``old`` (set up before the routing, e.g. on sys.stderr) write to ``new``."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in logging.root.manager.loggerDict)]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                handler.setStream(new)


class EngineOutput:
    """``with EngineOutput():`` the engines' output filtered for its length (see the module's docstring).
    ``everything``: leave the descriptors alone (KAFKA_SCHEDULER_LOG_LEVEL=DEBUG)."""

    def __init__(self, everything: bool = False):
        self.everything = everything
        self.routes: list[_Route] = []

    def __enter__(self) -> EngineOutput:
        if self.everything:
            return self
        try:
            for fd, name in ((1, "stdout"), (2, "stderr")):
                self.routes.append(_Route(fd, name))
        except OSError:  # a descriptor closed (a daemon's), out of descriptors: the output as it is
            self._restore()
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        while self.routes:
            self.routes.pop().restore()
