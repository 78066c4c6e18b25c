"""The state step's Python cost per delivery of a herd, without Spark or Kafka: a quick check, not a scenario.

    .venv/bin/python bench/processor_output.py [ROWS] [--code CHECKOUT]

Files ROWS schedules (one user header each, as ``bench`` sends them) into one chunk, then times what a herd's
preparing batch does with them in the state step's Python worker: the chunk read back (``from_blob``), the delivery
rows made of it (``deliveries_frame``), and PySpark's conversion of those rows to Arrow as
``transformWithStateInPandas``
hands them to the JVM (``PandasToArrowConversion``, its worker's call); and what ingest does with them, the chunk
written (``to_blob``). The best of three rounds, in seconds per 100,000 rows. ``--code``: time another checkout's
``src`` (an A/B against an older commit); the result file (``bench/results/*-processor-output.json``) names its
commit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="?", type=int, default=100_000)
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose src/ is timed")
    args = parser.parse_args()
    sys.path.insert(0, str(args.code.resolve() / "src"))
    sys.path.insert(1, str(ROOT))

    from pyspark.sql.conversion import PandasToArrowConversion
    from pyspark.sql.types import StructField, StructType

    from bench.harness import write_result
    from kafka_scheduler.engine.contract import OUTPUT_SCHEMA
    from kafka_scheduler.engine.processor import blobs, output
    from kafka_scheduler.engine.rules.entries import entries_frame
    from kafka_scheduler.engine.rules.schedule import Schedule

    now = 1_900_000_000_000
    schedules = [
        Schedule(now + i, "out", b"key-%d" % i, b"v" * 100, (("x-bench-sent-ms", b"1900000000000"),), f"requests-0-{i}")
        for i in range(args.rows)
    ]
    entries = entries_frame(schedules, [(None, None)] * args.rows)
    blob = blobs.to_blob(entries)
    output_type = StructType([StructField("_0", OUTPUT_SCHEMA)])

    def to_arrow(frame):
        return PandasToArrowConversion.convert(
            [frame],
            output_type,
            timezone="UTC",
            safecheck=True,
            arrow_cast=True,
            assign_cols_by_name=True,
            int_to_decimal_coercion_enabled=False,
        )

    steps = {
        "from_blob": lambda _: blobs.from_blob(blob),
        "deliveries_frame": lambda read: output.deliveries_frame(read, now - 1),
        "to_arrow": to_arrow,
        "to_blob": lambda _: blobs.to_blob(entries),
    }
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(ROUNDS):
        value = None
        for name, step in steps.items():
            started = time.perf_counter()
            result = step(value)
            best[name] = min(best[name], time.perf_counter() - started)
            value = result if name != "to_arrow" else value
    per_100k = {name: round(seconds * 100_000 / args.rows, 3) for name, seconds in best.items()}
    per_100k["herd_total"] = round(per_100k["from_blob"] + per_100k["deliveries_frame"] + per_100k["to_arrow"], 3)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=args.code, capture_output=True, text=True
    ).stdout.strip()
    for name, seconds in per_100k.items():
        print(f"{name:>17}: {seconds:.3f} s per 100,000 rows")
    path = write_result(
        "processor-output",
        {"rows": args.rows, "rounds": ROUNDS, "code": str(args.code), "code_commit": commit},
        {"seconds_per_100k": per_100k},
        notes="best of the rounds; one user header per schedule",
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
