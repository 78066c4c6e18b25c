"""`kafka-scheduler submit` against a Spark standalone master and one worker started on loopback.

The executors run a Python that has the libraries (pandas, pyarrow, protobuf) but not the package, as on a machine
of the cluster: the state processor reaches them only in the zip that submit ships, so the job works only if
submit built and passed it. The driver runs in the submit command's process tree and stops gracefully on SIGTERM.
"""

from __future__ import annotations

import subprocess
import sysconfig
import venv
from pathlib import Path

from kafka_scheduler.kafka.topics import admin_client, ensure_topics

from .spark_cluster import LocalSparkCluster
from .support import at, ms_of, native, wait_until


def python_without_the_package(folder: Path) -> Path:
    """A virtual environment that sees this one's libraries (a .pth line naming its site-packages, whose own .pth
    files, the editable install of kafka_scheduler among them, are not read from there) but not the package."""
    venv.EnvBuilder(with_pip=False).create(folder)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "libraries.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [
            python,
            "-c",
            "import pandas, pyarrow, pyspark\ntry:\n import kafka_scheduler\nexcept ImportError:\n print('without')",
        ],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "without", (probe.stdout, probe.stderr)
    return python


def test_submit_runs_the_job_on_the_cluster_and_stops_gracefully(kafka, scheduler_factory, tmp_path, monkeypatch):
    python = python_without_the_package(tmp_path / "executor-python")
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # the driver on loopback, as the cluster
    with LocalSparkCluster(tmp_path / "spark", workers=1, cores=1, memory="1g") as cluster:
        scheduler = scheduler_factory(
            subcommand="submit",
            extra_args=("--master", cluster.master_url, "--python", str(python), "--executor-memory", "512m"),
        )
        try:
            scheduler.start()
            assert "submit: spark-submit to " + cluster.master_url in scheduler.log()
            to = f"submitted-{scheduler.app_id}"  # broker append times: a delivery before its due time shows
            ensure_topics(admin_client(kafka.bootstrap), [to], 1, config={"message.timestamp.type": "LogAppendTime"})
            reader = kafka.reader(to)
            due = {b"now": at(0), b"later": at(10)}
            for key, instant in due.items():
                kafka.produce(
                    f"{scheduler.app_id}-schedule-requests",
                    key=key,
                    value=key,
                    headers=native(to, instant, key.decode()),
                )
            records = reader.wait_for(
                lambda r: r.key in due, count=2, timeout=180, what="both deliveries", guard=scheduler.assert_running
            )
            assert sorted(r.key for r in records) == [b"later", b"now"]
            for record in records:
                assert record.value == record.key
                assert record.timestamp_ms >= ms_of(due[record.key]), record.key

            # The batches ran on the worker's executor: the master gave the app its core, and the executor fetched
            # the package zip into its work folder.
            [app] = cluster.state()["activeapps"]
            assert app["name"] == f"kafka-scheduler:{scheduler.app_id}" and app["cores"] == 1, app
            work = tmp_path / "spark" / "work-0" / app["id"]
            fetched = sorted(p.name for p in work.glob("*/kafka_scheduler-*.zip"))
            assert len(fetched) == 1, fetched

            assert scheduler.stop() == 0, scheduler.log()[-3000:]
            assert "stopped after" in scheduler.log()
            wait_until(
                lambda: app["id"] in {a["id"] for a in cluster.state()["completedapps"]},
                30,
                "the master to see the application end",
            )
        finally:
            scheduler.stop()  # while the cluster is up: a graceful stop needs it
