"""A class-data-sharing archive of the Spark driver JVM (JDK 17's dynamic AppCDS), written once and mapped at every
later start.

A job's JVM loads, verifies and links some 18,000 classes as it starts, on the same cores as the JIT compilers and
the Python workers' imports. Started on an archive of them it maps them instead: a restart with 1,000,000 pending
reached its first overdue delivery sooner (docs/measurements.md, "A restart's JVM: the JIT and a class archive").
The archive is written by the JVM itself as it exits (``-XX:ArchiveClassesAtExit``) after a graceful stop of a job
that started without one, into a name of its own, and moved into place once the JVM has ended: a job killed
meanwhile leaves a partial file that the next start deletes, and a start never reads a file still being written.

An archive holds for one JVM, one class path and one set of JVM options: its file name carries a hash of them
(``archive_file``), so a change of any of them makes a new one and a JVM never meets an archive it would refuse.
Should it refuse one anyway, it starts as without (its CDS messages are off, so the job's output stays as it was).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ...kafka.jars import cache_root, jar_paths, java_binary

log = logging.getLogger(__name__)

OFF = "off"
AUTO = "auto"
QUIET_CDS_LOGS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
PARTIAL = ".partial"
JVM_EXIT_TIMEOUT_S = 120  # writing the archive takes seconds (docs/measurements.md); a JVM stuck longer is left


def _jvm_identity() -> list[str]:
    """What names one JVM build without starting it: its binary, and its module image's size and time (a JDK
    update replaces the image)."""
    java = java_binary()
    java = java.resolve() if java.exists() else java
    modules = java.parent.parent / "lib" / "modules"
    stat = modules.stat() if modules.exists() else None
    return [str(java), f"{stat.st_size}:{stat.st_mtime_ns}" if stat else "no module image"]


def archive_file(folder: Path, jvm_options: str) -> Path:
    """The archive in ``folder`` for this JVM, Python environment (whose Spark jars make the class path), connector
    jars and JVM options."""
    import pyspark

    spark_jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    key = "\n".join(
        [
            *_jvm_identity(),
            sys.prefix,
            pyspark.__version__,
            *spark_jars,
            *(p.name for p in jar_paths("spark-kafka")),
            " ".join(jvm_options.split()),
        ]
    )
    return folder / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def use_options(archive: Path) -> str:
    """JVM options that start a JVM on ``archive``."""
    return f"-XX:SharedArchiveFile={archive} {QUIET_CDS_LOGS}"


def folder_of(setting: str | None) -> Path | None:
    """The folder a ``--class-archive`` setting names; None when off."""
    if not setting or setting == OFF:
        return None
    return cache_root() / "jvm-archive" if setting == AUTO else Path(setting).expanduser()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class ClassArchive:
    """The archive a job's driver JVM starts on, or writes at its exit (``writing``)."""

    path: Path
    writing: Path | None  # the partial file the JVM writes as it exits; None: it starts on ``path``

    @classmethod
    def plan(cls, folder: Path, jvm_options: str) -> ClassArchive | None:
        """Start on the archive if there is one; else write one at exit. None if the folder cannot be used."""
        path = archive_file(folder, jvm_options)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _remove_abandoned(path)
        except OSError as exc:
            log.info("jvm: no class archive (%s: %s)", folder, exc.strerror or exc)
            return None
        if path.exists():
            return cls(path, None)
        return cls(path, path.with_name(f"{path.name}.{os.getpid()}{PARTIAL}"))

    def jvm_options(self) -> str:
        if self.writing is None:
            return use_options(self.path)
        return f"-XX:ArchiveClassesAtExit={self.writing} {QUIET_CDS_LOGS}"

    def start_line(self) -> str:
        if self.writing is None:
            return f"jvm: starting on the class archive {self.path}"
        return f"jvm: no class archive yet; a graceful stop writes {self.path}"

    def finish(self, jvm_process) -> None:
        """After the session stopped: let the JVM end (it exits when its stdin closes) and, if it wrote the
        archive, move it into place. ``jvm_process``: the Popen of the JVM the driver launched."""
        if self.writing is None or jvm_process is None:
            return
        started = time.monotonic()
        log.info("jvm: writing the class archive for faster starts (once)")
        try:
            if jvm_process.stdin is not None:
                jvm_process.stdin.close()
            code = jvm_process.wait(JVM_EXIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.info("jvm: class archive not written (%s); the next graceful stop tries again", exc)
            return
        written = self.writing.exists() and self.writing.stat().st_size > 0
        if code != 0 or not written:
            self.writing.unlink(missing_ok=True)
            log.info("jvm: class archive not written (JVM exit code %s); the next graceful stop tries again", code)
            return
        os.replace(self.writing, self.path)
        log.info(
            "jvm: class archive written in %.1fs (%d MB): later starts map its classes",
            time.monotonic() - started,
            self.path.stat().st_size // 2**20,
        )


def _remove_abandoned(path: Path) -> None:
    """Partial archives of ``path`` whose writer has ended: a JVM killed while writing, or a job killed first."""
    for partial in path.parent.glob(f"{path.name}.*{PARTIAL}"):
        pid = partial.name[len(path.name) + 1 : -len(PARTIAL)]
        if pid.isdigit() and not _alive(int(pid)):
            partial.unlink(missing_ok=True)
