"""The README's cluster path: the job launched by spark-submit (here with master local[2]),
with the connector jars and the zipped package passed the way a cluster needs them."""

import os
import subprocess
import sys
from pathlib import Path

from kafka_scheduler.kafka.jars import jar_paths

from .support import at, native

ROOT = Path(__file__).resolve().parents[2]


def test_spark_submit_runs_the_scheduler(kafka, scheduler_factory, tmp_path):
    subprocess.run(["make", "-s", "dist"], cwd=ROOT, check=True, capture_output=True)
    spark_submit = Path(sys.executable).with_name("spark-submit")
    launcher = (
        str(spark_submit),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--jars",
        ",".join(str(p) for p in jar_paths("spark-kafka")),
        "--py-files",
        str(ROOT / "dist" / "kafka_scheduler.zip"),
        str(ROOT / "scripts" / "spark-submit-entry.py"),
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    scheduler = scheduler_factory(launcher=launcher).start()
    assert "spark: starting (spark-submit" in scheduler.log()
    topic = kafka.topic()
    reader = kafka.reader(topic)
    kafka.produce(
        f"{scheduler.app_id}-schedule-requests", key=b"submitted", value=b"v", headers=native(topic, at(2), "submit-1")
    )
    [record] = reader.wait_for(lambda r: r.key == b"submitted", timeout=120, what="delivery")
    assert record.value == b"v"
    # SIGTERM reaches spark-submit's JVM, whose shutdown hook ends the job at once (exit 143); the
    # graceful stop is for a signal to the Python driver. Either way the checkpoint stays valid.
    assert scheduler.stop() in (0, 143)
