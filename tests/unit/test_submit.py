"""`kafka-scheduler submit` without a cluster: the spark-submit command it builds, the run options its driver gets,
the checks before anything is submitted, and the package zip (package_zip.py)."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kafka_scheduler.cli.main import build_parser
from kafka_scheduler.cli.package_zip import cached_zip, source_hash, write_zip
from kafka_scheduler.cli.submit import (
    Cluster,
    Submission,
    cluster_options,
    driver_environment,
    driver_script,
    find_spark_submit,
    run_arguments,
    shown,
    spark_submit_command,
)
from kafka_scheduler.config import ConfigError, resolve

from .test_cli import one_line_error, run

CLUSTER = Cluster(master="spark://m:7077", python="/opt/py/bin/python", driver_python="/venv/bin/python")


def submit_args(*argv: str):
    return build_parser().parse_args(["submit", *argv])


def command(cluster=CLUSTER, run_args=("--app-id=a",), driver_settings=None):
    return spark_submit_command(
        "/spark/bin/spark-submit",
        cluster,
        "kafka-scheduler:a",
        ["/j/a.jar", "/j/b.jar"],
        "/cache/kafka_scheduler-1.zip",
        "/cache/driver.py",
        driver_settings or {"spark.driver.memory": "1g"},
        list(run_args),
    )


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def confs(argv: list[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for flag, value in itertools.pairwise(argv) if flag == "--conf")


# ---------------------------------------------------------------- the command


def test_command_names_master_client_mode_jars_package_and_executor_python():
    argv = command()
    assert argv[0] == "/spark/bin/spark-submit"
    assert option(argv, "--master") == "spark://m:7077"
    assert option(argv, "--deploy-mode") == "client"
    assert option(argv, "--jars") == "/j/a.jar,/j/b.jar"
    assert option(argv, "--py-files") == "/cache/kafka_scheduler-1.zip"
    assert option(argv, "--name") == "kafka-scheduler:a"
    assert confs(argv) == {
        "spark.pyspark.python": "/opt/py/bin/python",
        "spark.pyspark.driver.python": "/venv/bin/python",
        "spark.driver.memory": "1g",
    }
    assert "--executor-memory" not in argv and "--executor-cores" not in argv and "--total-executor-cores" not in argv


def test_driver_script_and_run_options_come_last():
    argv = command(run_args=("--app-id=a", "--partitions=8"))
    assert argv[-3:] == ["/cache/driver.py", "--app-id=a", "--partitions=8"]


def test_executor_options_and_confs_pass_through():
    cluster = Cluster(
        master="spark://m:7077",
        python="p",
        driver_python="d",
        executor_memory="2g",
        executor_cores=2,
        total_executor_cores=8,
        confs=(("spark.executor.instances", "4"), ("spark.x", "a=b")),
    )
    argv = command(cluster)
    assert (
        option(argv, "--executor-memory"),
        option(argv, "--executor-cores"),
        option(argv, "--total-executor-cores"),
    ) == ("2g", "2", "8")
    assert confs(argv)["spark.executor.instances"] == "4" and confs(argv)["spark.x"] == "a=b"


def test_the_zip_is_on_the_driver_pythonpath_before_what_was_there():
    assert driver_environment("/c/k.zip", {}) == {"PYTHONPATH": "/c/k.zip", "MALLOC_ARENA_MAX": "2"}
    assert driver_environment("/c/k.zip", {"PYTHONPATH": "/x", "MALLOC_ARENA_MAX": "4"}) == {
        "PYTHONPATH": f"/c/k.zip{os.pathsep}/x",
        "MALLOC_ARENA_MAX": "4",
    }


def test_shown_masks_secrets_and_puts_the_environment_first():
    argv = command(
        run_args=("--kafka-option=sasl.password=hunter2", "--kafka-option=security.protocol=SASL_SSL"),
        driver_settings={"spark.hadoop.fs.s3a.secret.key": "s3cr3t"},
    )
    line = shown(Submission(argv, {"PYTHONPATH": "/c/k.zip"}))
    assert line.startswith("PYTHONPATH=/c/k.zip /spark/bin/spark-submit ")
    assert "hunter2" not in line and "s3cr3t" not in line
    assert "--kafka-option=sasl.password=****" in line and "spark.hadoop.fs.s3a.secret.key=****" in line
    assert "--kafka-option=security.protocol=SASL_SSL" in line


# ---------------------------------------------------------------- run options for the driver


def test_run_arguments_are_the_given_run_options_only(tmp_path, monkeypatch):
    (tmp_path / "s.toml").write_text('app_id = "from-file"\n')
    monkeypatch.chdir(tmp_path)
    args = submit_args(
        "--master",
        "spark://m:7077",
        "--config",
        "s.toml",
        "--input",
        "a:native",
        "--input",
        "b:karafka",
        "--kafka-option",
        "client.id=x",
        "--exactly-once",
        "--executor-memory",
        "1g",
        "--conf",
        "spark.a=b",
        "--dry-run",
        "--from-beginning",
        "--partitions",
        "-1",
    )
    assert run_arguments(args) == [
        f"--config={tmp_path / 's.toml'}",
        "--input=a:native",
        "--input=b:karafka",
        "--master=spark://m:7077",
        "--partitions=-1",
        "--exactly-once=true",
        "--kafka-option=client.id=x",
        "--from-beginning",
    ]


def test_the_driver_resolves_the_same_settings(tmp_path, monkeypatch):
    """The driver's `run` parses run_arguments() in the same environment: every setting comes out the same."""
    (tmp_path / "s.toml").write_text('shards = 12\n[kafka]\n"client.id" = "file"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_SCHEDULER_LOOKAHEAD", "5s")
    args = submit_args(
        "--master",
        "spark://m:7077",
        "--config",
        "s.toml",
        "--app-id",
        "billing",
        "--input",
        "a:native",
        "--input",
        "b:etf1",
        "--kafka-option",
        "linger.ms=5",
        "--history",
        "--max-requests-per-batch",
        "100",
        "--total-executor-cores",
        "4",
    )
    driver = build_parser().parse_args(["run", *run_arguments(args)])
    assert resolve(driver) == resolve(args)
    assert resolve(driver).shards == 12 and resolve(driver).lookahead == 5000


# ---------------------------------------------------------------- checks


def test_master_is_required_but_may_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("KAFKA_SCHEDULER_MASTER", raising=False)
    with pytest.raises(ConfigError, match="--master is required"):
        cluster_options(submit_args(), resolve(submit_args()))
    monkeypatch.setenv("KAFKA_SCHEDULER_MASTER", "spark://env:7077")
    assert cluster_options(submit_args(), resolve(submit_args())).master == "spark://env:7077"


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--conf", "nokey"), "--conf 'nokey': expected KEY=VALUE"),
        (("--conf", "=v"), "expected KEY=VALUE"),
        (("--conf", "spark.master=local"), "--conf spark.master: use --master"),
        (("--conf", "spark.submit.pyFiles=x.zip"), "submit passes the package zip"),
        (("--executor-memory", "lots"), "--executor-memory 'lots'"),
        (("--executor-cores", "0"), "--executor-cores 0: must be a positive integer"),
        (("--total-executor-cores", "-2"), "--total-executor-cores -2"),
    ],
)
def test_bad_cluster_options(argv, message):
    args = submit_args("--master", "spark://m:7077", *argv)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        cluster_options(args, resolve(args))


def test_executor_python_is_the_flag_then_pyspark_python_then_this_one():
    args = submit_args("--master", "spark://m:7077")
    assert cluster_options(args, resolve(args), {}).python == sys.executable
    assert cluster_options(args, resolve(args), {"PYSPARK_PYTHON": "/e/python"}).python == "/e/python"
    args = submit_args("--master", "spark://m:7077", "--python", "/f/python")
    assert cluster_options(args, resolve(args), {"PYSPARK_PYTHON": "/e/python"}).python == "/f/python"
    assert cluster_options(args, resolve(args), {}).driver_python == sys.executable


def test_spark_submit_is_pysparks_or_spark_homes(tmp_path):
    import pyspark

    assert find_spark_submit({}) == Path(pyspark.__file__).parent / "bin" / "spark-submit"
    with pytest.raises(ConfigError, match=f"spark-submit not found at {tmp_path}/bin/spark-submit \\(SPARK_HOME\\)"):
        find_spark_submit({"SPARK_HOME": str(tmp_path)})
    script = tmp_path / "bin" / "spark-submit"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert find_spark_submit({"SPARK_HOME": str(tmp_path)}) == script


# ---------------------------------------------------------------- the command line


def test_submit_without_master_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("KAFKA_SCHEDULER_MASTER", raising=False)
    code, _, err = run(capsys, ["submit", "--app-id", "a", "--dry-run"])
    assert code == 2
    assert "--master is required" in one_line_error(err, "submit")


def test_submit_with_bad_run_settings_is_one_line_before_anything_is_built(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_SCHEDULER_PY_FILES_CACHE", str(tmp_path / "cache"))
    code, _, err = run(capsys, ["submit", "--master", "spark://m:7077", "--partitions", "0"])
    assert code == 2
    assert "--partitions" in one_line_error(err, "submit")
    code, _, err = run(capsys, ["submit", "--master", "spark://m:7077", "--kafka-option", "no.such.option=1"])
    assert code == 2
    assert "no.such.option" in one_line_error(err, "submit")
    assert not (tmp_path / "cache").exists()


def test_submit_without_spark_submit_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "no-spark"))
    code, _, err = run(capsys, ["submit", "--master", "spark://m:7077", "--dry-run"])
    assert code == 2
    assert "spark-submit not found at" in one_line_error(err, "submit")


def test_dry_run_prints_the_command_and_builds_the_zip(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_SCHEDULER_PY_FILES_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    code, out, err = run(
        capsys,
        [
            "submit",
            "--master",
            "spark://m:7077",
            "--app-id",
            "billing",
            "--dry-run",
            "--kafka-option",
            "sasl.password=hunter2",
        ],
    )
    assert code == 0, err
    [line] = out.splitlines()
    assert "spark-submit --master spark://m:7077 --deploy-mode client --name kafka-scheduler:billing" in line
    assert "hunter2" not in line
    [package] = (tmp_path / "cache").glob("kafka_scheduler-*.zip")
    assert f"--py-files {package} " in line and line.startswith(f"PYTHONPATH={package} ")
    assert f" {tmp_path / 'cache' / 'kafka-scheduler-driver.py'} --app-id=billing --master=spark://m:7077" in line


def test_submit_help_explains_itself(capsys):
    code, out, err = run(capsys, ["submit", "--help"])
    assert code == 0 and err == ""
    assert out.startswith("usage: kafka-scheduler submit")
    for text in (
        "spark-submit",
        "--py-files",
        "--master",
        "--executor-memory",
        "--total-executor-cores",
        "--conf",
        "--python",
        "--dry-run",
        "pandas, pyarrow",
        "--bootstrap-servers",
        "KAFKA_SCHEDULER_",
    ):
        assert text in out, text


def test_driver_script_runs_kafka_scheduler_run(tmp_path):
    script = driver_script(tmp_path)
    assert driver_script(tmp_path) == script
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kafka-scheduler run")


# ---------------------------------------------------------------- the package zip


def package(tmp_path: Path) -> Path:
    root = tmp_path / "kafka_scheduler"
    (root / "dialects").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "dialects" / "native.py").write_text("X = 1\n")
    (root / "log4j2.properties").write_text("rootLogger.level = warn\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    return root


def test_zip_holds_the_package_files_without_compiled_ones(tmp_path):
    target = write_zip(tmp_path / "out" / "k.zip", package(tmp_path))
    assert sorted(zipfile.ZipFile(target).namelist()) == [
        "kafka_scheduler/__init__.py",
        "kafka_scheduler/dialects/native.py",
        "kafka_scheduler/log4j2.properties",
    ]


def test_cached_zip_is_reused_until_the_source_changes(tmp_path):
    root = package(tmp_path)
    first = cached_zip(tmp_path / "cache", root)
    assert first.name == f"kafka_scheduler-{source_hash(root)[:16]}.zip"
    assert cached_zip(tmp_path / "cache", root) == first
    (root / "__pycache__" / "y.cpython-311.pyc").write_bytes(b"\1")
    assert cached_zip(tmp_path / "cache", root) == first
    (root / "dialects" / "native.py").write_text("X = 2\n")
    second = cached_zip(tmp_path / "cache", root)
    assert second != first
    assert zipfile.ZipFile(second).read("kafka_scheduler/dialects/native.py") == b"X = 2\n"


def test_the_same_source_gives_the_same_bytes(tmp_path):
    root = package(tmp_path)
    a = write_zip(tmp_path / "a.zip", root).read_bytes()
    os.utime(root / "__init__.py", (1, 1))
    assert write_zip(tmp_path / "b.zip", root).read_bytes() == a


def test_make_dist_uses_the_same_code(tmp_path):
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "-m kafka_scheduler.cli.package_zip dist/kafka_scheduler.zip" in makefile
    result = subprocess.run(
        [sys.executable, "-m", "kafka_scheduler.cli.package_zip", str(tmp_path / "k.zip")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{tmp_path / 'k.zip'}; connector jars: ")
    assert "kafka_scheduler/engine/processor/wheel_processor.py" in zipfile.ZipFile(tmp_path / "k.zip").namelist()
