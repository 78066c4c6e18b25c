"""``kafka-scheduler submit``: the job on a Spark cluster, launched through spark-submit.

spark-submit gets the cluster's master, Spark's Kafka connector jars, the package zip (``--py-files``: executors
import the state processor from it) and the interpreter the executors run; its driver is a small script that runs
``kafka-scheduler run`` with the same run options. The driver runs here (client deploy mode): the timed writer, the
metrics server and the Kafka clients live in the driver process, so it reads the same flags, ``KAFKA_SCHEDULER_*``
variables and ``--config`` file as this command.

Spark also starts the executors' Python on the driver's machine, once per query start, to initialize the state
processor there; that process imports the package from the zip too (on the driver JVM's PYTHONPATH).

A SIGINT or SIGTERM to this command goes to the driver's Python process, which stops gracefully after the batch in
flight (a second one ends spark-submit at once).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import MASK, OPTIONS, Config, ConfigError, check_kafka_settings, is_secret, resolve

log = logging.getLogger("kafka_scheduler")

PID_FILE_ENV = "KAFKA_SCHEDULER_DRIVER_PID_FILE"
DRIVER_SCRIPT_NAME = "kafka-scheduler-driver.py"
DRIVER_SCRIPT = '''\
"""The driver of `kafka-scheduler submit`: spark-submit runs a Python file, and this one runs
`kafka-scheduler run` with the options it is given. Written by kafka_scheduler.cli.submit."""

import os
import sys

# spark-submit puts the --py-files zip first on the path. Where the package is installed, import it from there (its
# data files are plain files there); the zip, moved last, serves a driver Python without the package.
shipped = [p for p in sys.path if os.path.basename(p).startswith("kafka_scheduler-") and p.endswith(".zip")]
sys.path[:] = [p for p in sys.path if p not in shipped] + shipped

# Linux: a SIGTERM (a graceful stop) when spark-submit's JVM, the parent, ends, so this process never outlives it.
if sys.platform.startswith("linux"):
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

# kafka-scheduler submit sends its stop request to this process (a graceful stop), not to spark-submit's JVM.
pid_file = os.environ.get("KAFKA_SCHEDULER_DRIVER_PID_FILE")
if pid_file:
    with open(pid_file + ".partial", "w") as file:
        file.write(str(os.getpid()))
    os.replace(pid_file + ".partial", pid_file)

from kafka_scheduler.cli.main import main

raise SystemExit(main(["run", *sys.argv[1:]]))
'''

# Read by the driver's JVM when it starts, which under spark-submit is before the job builds its session: these of the
# job's Spark settings must be handed to spark-submit.
DRIVER_JVM_SETTINGS = ("spark.driver.memory", "spark.driver.extraJavaOptions")
# Spark settings submit sets from its own options or the run settings: --conf may not set them too.
RESERVED_CONFS = {
    "spark.master": "use --master",
    "spark.submit.deployMode": "the driver runs here (client mode): it holds the timed writer and the metrics server",
    "spark.jars": "submit passes the connector jars",
    "spark.submit.pyFiles": "submit passes the package zip",
    "spark.pyspark.python": "use --python",
    "spark.pyspark.driver.python": "the driver runs this command's Python",
    "spark.executor.memory": "use --executor-memory",
    "spark.executor.cores": "use --executor-cores",
    "spark.cores.max": "use --total-executor-cores",
    "spark.driver.memory": "use --driver-memory",
}
_SIZE = re.compile(r"^\d+([kmgtp]b?|b)?$", re.I)


@dataclass(frozen=True)
class Cluster:
    """What spark-submit is told about the cluster and the executors."""

    master: str
    python: str  # the executors' interpreter: needs pandas, pyarrow and protobuf
    driver_python: str
    executor_memory: str | None = None
    executor_cores: int | None = None
    total_executor_cores: int | None = None
    confs: tuple[tuple[str, str], ...] = ()


def spark_submit_command(
    spark_submit: str,
    cluster: Cluster,
    app_name: str,
    jars: Sequence[str],
    package_zip: str,
    driver_script: str,
    driver_settings: Mapping[str, str],
    run_args: Sequence[str],
) -> list[str]:
    """The spark-submit command line: spark-submit's own options, then the driver script and the run options."""
    command = [
        spark_submit,
        "--master",
        cluster.master,
        "--deploy-mode",
        "client",
        "--name",
        app_name,
        "--jars",
        ",".join(jars),
        "--py-files",
        package_zip,
    ]
    if cluster.executor_memory is not None:
        command += ["--executor-memory", cluster.executor_memory]
    if cluster.executor_cores is not None:
        command += ["--executor-cores", str(cluster.executor_cores)]
    if cluster.total_executor_cores is not None:
        command += ["--total-executor-cores", str(cluster.total_executor_cores)]
    settings = {
        "spark.pyspark.python": cluster.python,
        "spark.pyspark.driver.python": cluster.driver_python,
        **driver_settings,
        **dict(cluster.confs),
    }
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, driver_script, *run_args]


def run_arguments(args: argparse.Namespace) -> list[str]:
    """The run options given on this command line, for the driver's ``kafka-scheduler run`` (as ``--flag=value``,
    which keeps a value starting with '-' a value). Variables reach the driver through its environment."""
    found = []
    if getattr(args, "config_file", None):
        found.append(f"--config={os.path.abspath(args.config_file)}")  # the driver may start in another folder
    for option in OPTIONS:
        value = getattr(args, option.name, None)
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            found.append(f"{option.flag}={item}")
    if getattr(args, "from_beginning", False):
        found.append("--from-beginning")
    return found


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--conf {text!r}: expected KEY=VALUE, e.g. spark.executor.instances=2")
    if key in RESERVED_CONFS:
        raise ConfigError(f"--conf {key}: {RESERVED_CONFS[key]}")
    return key, value


def _positive(value: int | None, flag: str) -> int | None:
    if value is not None and value <= 0:
        raise ConfigError(f"{flag} {value}: must be a positive integer")
    return value


def cluster_options(args: argparse.Namespace, config: Config, environ: Mapping[str, str] = os.environ) -> Cluster:
    """The cluster options, checked; the master must be set (flag, variable or file), not the local default."""
    if config.given_by("master") is None:
        raise ConfigError(
            "--master is required: the cluster's master URL, e.g. spark://spark-master:7077 "
            "(or KAFKA_SCHEDULER_MASTER, or master in the --config file)"
        )
    if args.executor_memory is not None and not _SIZE.match(args.executor_memory):
        raise ConfigError(f"--executor-memory {args.executor_memory!r}: expected a size such as 512m or 2g")
    return Cluster(
        master=config.master,
        python=args.python or environ.get("PYSPARK_PYTHON") or sys.executable,
        driver_python=sys.executable,
        executor_memory=args.executor_memory,
        executor_cores=_positive(args.executor_cores, "--executor-cores"),
        total_executor_cores=_positive(args.total_executor_cores, "--total-executor-cores"),
        confs=tuple(_conf(text) for text in args.conf),
    )


def find_spark_submit(environ: Mapping[str, str] = os.environ) -> Path:
    """``$SPARK_HOME/bin/spark-submit`` if SPARK_HOME is set, else the one of the pyspark this Python imports."""
    if environ.get("SPARK_HOME"):
        candidate, where = Path(environ["SPARK_HOME"]) / "bin" / "spark-submit", "SPARK_HOME"
    else:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            raise ConfigError(
                f"spark-submit not found: pyspark is not installed for {sys.executable}, and SPARK_HOME is not set"
            )
        candidate, where = Path(spec.origin).parent / "bin" / "spark-submit", "pyspark's bin/"
    if not (candidate.is_file() and os.access(candidate, os.X_OK)):
        raise ConfigError(f"spark-submit not found at {candidate} ({where}); set SPARK_HOME to a Spark installation")
    return candidate


def driver_script(folder: Path) -> Path:
    path = Path(folder) / DRIVER_SCRIPT_NAME
    if not (path.is_file() and path.read_text() == DRIVER_SCRIPT):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(DRIVER_SCRIPT)
        os.replace(partial, path)
    return path


def shown(submission: Submission) -> str:
    """The command as a shell line, its environment first, with the values of secret Kafka options and Spark
    settings masked."""

    def mask(arg: str) -> str:
        for prefix in ("--kafka-option=", ""):
            if arg.startswith(prefix) and "=" in arg[len(prefix) :]:
                key, _, _ = arg[len(prefix) :].partition("=")
                if is_secret(key):
                    return f"{prefix}{key}={MASK}"
        return arg

    environment = [f"{name}={value}" for name, value in submission.environment.items()]
    return shlex.join([*environment, *(mask(arg) for arg in submission.command)])


@dataclass(frozen=True)
class Submission:
    command: list[str]
    environment: dict[str, str]  # set for spark-submit, over this process's environment


def driver_environment(package_zip: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The zip on the driver JVM's PYTHONPATH: the Python workers Spark starts on the driver's machine (the state
    processor's initialization at each query start) read the package from there, not from --py-files. The driver
    JVM's malloc arenas as the job's own (engine/spark/session.py), unless set."""
    from ..engine.spark.session import MALLOC_ARENAS

    existing = environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": package_zip + (os.pathsep + existing if existing else ""),
        "MALLOC_ARENA_MAX": environ.get("MALLOC_ARENA_MAX", MALLOC_ARENAS),
    }


def build(args: argparse.Namespace) -> Submission:
    """Check the settings and the cluster options, build what executors need, and return the spark-submit command."""
    from ..kafka.jars import jar_paths
    from .package_zip import cache_dir, cached_zip

    config = resolve(args)
    check_kafka_settings(config)
    cluster = cluster_options(args, config)
    spark_submit = find_spark_submit()
    jars = [str(p) for p in jar_paths("spark-kafka")]
    package = cached_zip()
    script = driver_script(cache_dir())
    from ..engine.spark.session import (
        spark_settings,  # the job's own Spark settings: one source for the driver JVM's too
    )

    settings = spark_settings(config)
    driver_settings = {key: settings[key] for key in DRIVER_JVM_SETTINGS if key in settings}
    command = spark_submit_command(
        str(spark_submit),
        cluster,
        settings["spark.app.name"],
        jars,
        str(package),
        str(script),
        driver_settings,
        run_arguments(args),
    )
    return Submission(command, driver_environment(str(package)))


def launch(submission: Submission) -> int:
    """Run spark-submit until it exits; a stop request goes to the driver's Python process. Returns its exit code."""
    with tempfile.TemporaryDirectory(prefix="kafka-scheduler-submit-") as folder:
        pid_file = Path(folder) / "driver.pid"
        # A session of its own: a Ctrl-C at the terminal reaches this process only, which passes it on as a
        # graceful stop, instead of also reaching spark-submit's JVM, whose shutdown would end the job at once.
        process = subprocess.Popen(
            submission.command,
            start_new_session=True,
            preexec_fn=_end_with_parent,
            env={**os.environ, **submission.environment, PID_FILE_ENV: str(pid_file)},
        )
        requests = []

        def stop(signum, _frame) -> None:
            requests.append(signum)
            driver = _read_pid(pid_file) if len(requests) == 1 else None
            if driver is not None:
                log.info(
                    "submit: received %s; stopping the driver (again to end spark-submit at once)",
                    signal.Signals(signum).name,
                )
                _signal(driver, signal.SIGTERM)
            else:
                log.info("submit: received %s; ending spark-submit", signal.Signals(signum).name)
                _signal(process.pid, signal.SIGTERM, group=True)

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return process.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if process.poll() is None:  # this command failed: leave nothing running
                _signal(process.pid, signal.SIGTERM, group=True)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    _signal(process.pid, signal.SIGKILL, group=True)
                    process.wait()


def _end_with_parent() -> None:
    """In spark-submit's process before it starts (Linux): the kernel sends it a SIGTERM when this command dies, even
    by SIGKILL, so the job never runs on unsupervised, out of reach of the terminal it was started from."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _signal(pid: int, sig: int, group: bool = False) -> None:
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except ProcessLookupError:
        pass


def submit(args: argparse.Namespace) -> int:
    submission = build(args)
    if args.dry_run:
        print(shown(submission))
        return 0
    command = submission.command
    log.info(
        "submit: spark-submit to %s (executors run %s; package %s, %d connector jars)",
        command[command.index("--master") + 1],
        _conf_value(command, "spark.pyspark.python"),
        Path(command[command.index("--py-files") + 1]).name,
        len(command[command.index("--jars") + 1].split(",")),
    )
    return launch(submission)


def _conf_value(command: Sequence[str], key: str) -> str | None:
    for flag, value in itertools.pairwise(command):
        if flag == "--conf" and value.startswith(key + "="):
            return value[len(key) + 1 :]
    return None
