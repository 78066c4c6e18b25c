"""A process and everything below it, read from /proc: the job's Python driver, Spark's JVM, the Python workers.

What the job harness (job_process.py) measures of a running job and what the crash suite kills: memory per kind of
process, CPU time, and the whole tree at once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GROUPS = ("jvm", "python_driver", "python_workers", "other")


def parent_of(pid: int) -> int | None:
    """The parent's pid (None: the process has ended)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _process_table() -> dict[int, list[int]]:
    """Children of every process, by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        ppid = parent_of(int(entry.name))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the JVM, Spark's Python daemon and its workers)."""
    children = _process_table()
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children.get(current, []))
    return found


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def group_of(pid: int, root: int, command: str) -> str:
    return (
        "jvm"
        if command.split(" ")[0].endswith("java")
        else "python_driver"
        if pid == root
        else "python_workers"
        if "python" in command
        else "other"
    )


def command_lines(root: int) -> dict[int, str]:
    """The command line of each process in ``root``'s tree. One that ends between the listing and the read is left
    out: Spark's Python workers come and go all the time."""
    found = {}
    for current in descendants(root):
        try:
            found[current] = command_line(current)
        except OSError:
            continue
    return found


def pids_of(root: int, group: str) -> list[int]:
    """The processes of one group (GROUPS) in ``root``'s tree that run now."""
    return [pid for pid, command in command_lines(root).items() if group_of(pid, root, command) == group]


def spark_jvm(root: int) -> int:
    """The pid of Spark's JVM in ``root``'s tree. A process the JVM is spawning shows the JVM's own command line
    until it execs (the fork shares the JVM's memory), so a java whose parent is a java is not counted."""
    jvms = pids_of(root, "jvm")
    [jvm] = [pid for pid in jvms if parent_of(pid) not in jvms]
    return jvm


def jvm_running(pid: int) -> bool:
    """Whether a java process is in ``pid``'s tree yet."""
    return bool(pids_of(pid, "jvm"))


def tree_rss(pid: int) -> dict[str, int]:
    """Resident bytes of ``pid`` and its descendants, per group (GROUPS)."""
    groups = dict.fromkeys(GROUPS, 0)
    for current in descendants(pid):
        try:
            command = command_line(current)
            rss = next(
                (
                    int(line.split()[1]) * 1024
                    for line in Path(f"/proc/{current}/status").read_text().splitlines()
                    if line.startswith("VmRSS:")
                ),
                0,
            )
        except (OSError, ValueError, IndexError):
            continue
        groups[group_of(current, pid, command)] += rss
    return groups


def tree_cpu(pid: int) -> dict[tuple[int, int], tuple[str, str, float]]:
    """CPU seconds (user + system) of ``pid`` and its descendants: (pid, start tick) -> (group, command, seconds).

    Each process's figure includes its reaped children (cutime + cstime), so the difference of two
    samples' sums counts a Python worker that ended in between too: its time moved to its parent.
    """
    sample = {}
    for current in descendants(pid):
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            command = command_line(current)
        except (OSError, ValueError, IndexError):
            continue
        # Fields 14-17 of proc(5) (utime, stime, cutime, cstime) and 22 (starttime); the split starts at field 3.
        ticks = sum(int(v) for v in fields[11:15])
        sample[(current, int(fields[19]))] = (group_of(current, pid, command), command[:160], ticks / CLOCK_TICKS)
    return sample


def signal_tree(pid: int, sig: int) -> list[int]:
    """Send ``sig`` to ``pid`` and every process below it at once, as systemd's ``KillMode=control-group`` does to
    a service; returns the pids."""
    pids = descendants(pid)
    for current in pids:
        try:
            os.kill(current, sig)
        except ProcessLookupError:
            pass
    return pids


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every process below it at once, as a machine crash would; returns the pids."""
    return signal_tree(pid, signal.SIGKILL)


def state_of(pid: int) -> str | None:
    """The process's state letter (R, S, D, Z, ...); None when it has ended and been reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def all_gone(pids: list[int]) -> bool:
    """Whether none of ``pids`` runs any more (a zombie waiting for its parent counts as gone)."""
    return all(state_of(pid) in (None, "Z") for pid in pids)
