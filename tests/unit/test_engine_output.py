"""The engines' output filtered on the process's own descriptors (cli/engine_output.py): a child process stands in
for Spark's JVM and Python workers, printing onto the stdout and stderr it inherits, as they do; our own lines (log
records, what a command prints) pass untouched; engine errors, unknown lines and a last line without its newline
stay; the descriptors are the real ones again afterwards. Each case runs in a Python of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What the stand-in engine prints on each stream (the noise as Spark's JVM and workers print it: cli/engine_noise.py).
ENGINE_STDERR = """\
an unknown line before anything else
WARNING: Using incubator modules: jdk.incubator.vector
12:00:00 WARN StateStoreProvider: StateStoreCoordinator endpoint not available: Exception thrown in awaitResult:
org.apache.spark.SparkException: Exception thrown in awaitResult:
\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:53)
Starting Streaming TransformWithStateInPandas Python worker.

Streaming TransformWithStateInPandas Python worker received parameters for UDF. State server port/path: 1

%4|1795717880.467|CONFIGWARN|rdkafka#producer-1| [thrd:app]: a librdkafka warning
12:00:01 ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 1)
java.lang.IllegalStateException: a real failure
\tat org.apache.spark.Foo.bar(Foo.scala:1)
12:00:02 WARN TaskSetManager: Lost task 0.0 in stage 1.0
Terminating due to java.lang.OutOfMemoryError: Java heap space
the engine's last words, without a newline"""
ENGINE_STDOUT = "Starting Streaming TransformWithStateInPandas Python worker.\n\nan engine line on stdout\n"

SHOWN_STDERR = """\
an unknown line before anything else
12:00:01 ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 1)
java.lang.IllegalStateException: a real failure
\tat org.apache.spark.Foo.bar(Foo.scala:1)
Terminating due to java.lang.OutOfMemoryError: Java heap space
the engine's last words, without a newline
"""  # ended with a newline at the end, so that what comes next starts a line of its own

SCRIPT = textwrap.dedent("""\
    import logging, os, subprocess, sys
    from kafka_scheduler.cli.engine_output import EngineOutput
    from kafka_scheduler.cli.main import setup_logging

    setup_logging()
    before = [os.fstat(fd) for fd in (1, 2)]
    engine = [sys.executable, "-c", "import sys; sys.stdout.write(sys.argv[1]); sys.stderr.write(sys.argv[2])",
              sys.argv[1], sys.argv[2]]
    with EngineOutput(everything=sys.argv[3] == "everything"):
        logging.getLogger("kafka_scheduler").info("ours, before the engine")
        print("what the command prints", flush=True)
        # librdkafka, in this very process, writes its log straight onto descriptor 2.
        os.write(2, b"%3|1795717880.467|FAIL|rdkafka#producer-1| [thrd:b:9092/bootstrap]: Connect failed\\n")
        subprocess.run(engine, check=True)
    print("what the command prints at its end")
    logging.getLogger("kafka_scheduler").info("ours, after")
    after = [os.fstat(fd) for fd in (1, 2)]
    assert [(s.st_dev, s.st_ino) for s in before] == [(s.st_dev, s.st_ino) for s in after], (before, after)
    """)


def run_command(mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("KAFKA_SCHEDULER_LOG_LEVEL", None)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, ENGINE_STDOUT, ENGINE_STDERR, mode],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )


def without_times(text: str) -> list[str]:
    """Our log records without their time, to compare."""
    return [line[9:] if line[:2].isdigit() and " INFO " in line[:15] else line for line in text.splitlines()]


def test_only_our_lines_and_the_engines_errors_reach_the_output():
    result = run_command("filtered")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "what the command prints\nan engine line on stdout\nwhat the command prints at its end\n"
    assert without_times(result.stderr) == [
        "INFO  ours, before the engine",
        *SHOWN_STDERR.splitlines(),
        "INFO  ours, after",
    ]


def test_debug_shows_everything():
    result = run_command("everything")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"what the command prints\n{ENGINE_STDOUT}what the command prints at its end\n"
    assert "]: Connect failed\n" + ENGINE_STDERR in result.stderr


def test_a_captured_stream_is_left_as_it_is(capsys):
    """sys.stderr not on descriptor 2 (here pytest's capture): left alone, so what is written to it stays there."""
    from kafka_scheduler.cli.engine_output import EngineOutput

    with EngineOutput():
        print("captured", file=sys.stderr)
    assert capsys.readouterr().err == "captured\n"
