"""Where the JVM artifacts live: fetched once from Maven Central by scripts/setup.sh."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]


class MissingJars(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("KAFKA_SCHEDULER_JAR_CACHE", PROJECT_ROOT / ".cache" / "jars"))


def jar_paths(bundle: str) -> list[Path]:
    """Jars of one bundle (``spark-kafka`` or ``kafka-broker``), or a clear error if setup never ran."""
    folder = cache_dir() / bundle
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise MissingJars(
            f"no jars in {folder}; run `make setup` (or scripts/setup.sh) to fetch them from Maven Central"
        )
    return jars
