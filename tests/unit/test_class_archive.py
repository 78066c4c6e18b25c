"""The driver JVM's class archive (engine/spark/class_archive.py): which file a JVM starts on or writes, what becomes
of a partial one, and how a finished one is moved into place. The JVM here is stood in for by a real process that
writes its file as it exits, as the JVM does (test_class_archive.py of the integration tests runs the real one)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from kafka_scheduler.config import add_arguments, resolve
from kafka_scheduler.engine.spark import class_archive, session
from kafka_scheduler.engine.spark.class_archive import ClassArchive, archive_file, folder_of


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_archive_is_named_by_what_it_holds_for(tmp_path):
    one = archive_file(tmp_path, "-Xmx1g -Dx=1")
    assert one == archive_file(tmp_path, " -Xmx1g   -Dx=1 ")  # the same options, spaced otherwise
    assert one != archive_file(tmp_path, "-Xmx2g -Dx=1")
    assert one.parent == tmp_path and one.suffix == ".jsa"


def test_the_setting_names_a_folder_or_none(tmp_path):
    assert folder_of("off") is None and folder_of("") is None and folder_of(None) is None
    assert folder_of("auto").name == "jvm-archive"
    assert folder_of(str(tmp_path)) == tmp_path


def test_without_an_archive_the_jvm_writes_one_of_its_own_and_with_one_it_starts_on_it(tmp_path):
    first = ClassArchive.plan(tmp_path, "-Xmx1g")
    assert first.writing is not None and first.writing != first.path and not first.path.exists()
    assert f"-XX:ArchiveClassesAtExit={first.writing}" in first.jvm_options().split()
    assert "SharedArchiveFile" not in first.jvm_options()

    first.path.write_bytes(b"archive")
    second = ClassArchive.plan(tmp_path, "-Xmx1g")
    assert second.writing is None
    assert f"-XX:SharedArchiveFile={first.path}" in second.jvm_options().split()
    assert "-Xlog:cds=off" in second.jvm_options().split()  # a refused archive says nothing in the job's output


def test_a_partial_archive_of_an_ended_writer_is_deleted_and_a_live_ones_kept(tmp_path):
    path = archive_file(tmp_path, "-Xmx1g")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = path.with_name(f"{path.name}.{ended.stdout.strip()}.partial")
    being_written = path.with_name(f"{path.name}.{os.getpid()}.partial")
    abandoned.write_bytes(b"half")
    being_written.write_bytes(b"half")
    ClassArchive.plan(tmp_path, "-Xmx1g")
    assert not abandoned.exists()
    assert being_written.exists()


def _jvm_standin(writes: Path, code: int) -> subprocess.Popen:
    """A process that, like the driver's JVM, runs until its standard input closes and writes the archive as it
    exits."""
    program = f"import sys; sys.stdin.read(); open({str(writes)!r}, 'wb').write(b'classes'); sys.exit({code})"
    return subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE)


def test_an_archive_written_at_exit_is_moved_into_place(tmp_path):
    archive = ClassArchive.plan(tmp_path, "-Xmx1g")
    archive.finish(_jvm_standin(archive.writing, 0))
    assert archive.path.read_bytes() == b"classes"
    assert list(tmp_path.iterdir()) == [archive.path]


def test_an_archive_of_a_jvm_that_failed_is_not_kept(tmp_path):
    archive = ClassArchive.plan(tmp_path, "-Xmx1g")
    archive.finish(_jvm_standin(archive.writing, 3))
    assert list(tmp_path.iterdir()) == []


def test_a_job_started_on_an_archive_writes_none(tmp_path):
    archive = ClassArchive.plan(tmp_path, "-Xmx1g")
    archive.path.write_bytes(b"archive")
    archive = ClassArchive.plan(tmp_path, "-Xmx1g")
    process = _jvm_standin(tmp_path / "not-expected", 0)
    archive.finish(process)  # leaves the JVM to the session's own stop
    process.stdin.close()
    process.wait(30)
    assert (tmp_path / "not-expected").exists() and sorted(tmp_path.iterdir()) == sorted(
        [archive.path, tmp_path / "not-expected"]
    )


def _no_jvm_started_here(monkeypatch) -> None:
    """As in a job's driver before its session starts (the unit tests' own session may run in this process)."""
    from pyspark import SparkContext

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(SparkContext, "_gateway", None)


def test_only_the_driver_jvm_gets_the_archive_and_not_under_spark_submit(tmp_path, monkeypatch):
    _no_jvm_started_here(monkeypatch)
    config = resolve(parse("--class-archive", str(tmp_path)), environ={})
    archive = session.plan_class_archive(config)
    assert archive is not None and archive.path.parent == tmp_path
    settings = session.spark_settings(config, class_archive=archive)
    assert archive.jvm_options() in settings["spark.driver.extraJavaOptions"]
    assert "ArchiveClassesAtExit" not in settings["spark.executor.extraJavaOptions"]

    assert session.plan_class_archive(resolve(parse("--class-archive", "off"), environ={})) is None
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    assert session.plan_class_archive(config) is None


def test_a_second_job_in_a_driver_whose_jvm_runs_plans_no_archive(tmp_path, monkeypatch):
    from pyspark import SparkContext

    _no_jvm_started_here(monkeypatch)
    monkeypatch.setattr(SparkContext, "_gateway", object())  # started by a first job (bench/shared_driver.py)
    assert session.plan_class_archive(resolve(parse("--class-archive", str(tmp_path)), environ={})) is None


def test_another_heap_or_submit_option_is_another_archive(tmp_path, monkeypatch):
    _no_jvm_started_here(monkeypatch)
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    config = resolve(parse("--class-archive", str(tmp_path)), environ={})
    plain = session.plan_class_archive(config).path
    bigger = resolve(parse("--class-archive", str(tmp_path), "--driver-memory", "4g"), environ={})
    assert session.plan_class_archive(bigger).path != plain
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:+UseSerialGC")
    assert session.plan_class_archive(config).path != plain
    assert resolve(parse(), environ={}).class_archive == class_archive.AUTO
