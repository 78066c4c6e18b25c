"""The package as a zip for spark-submit's ``--py-files``: executors import the state processor from it.

``make dist`` writes dist/kafka_scheduler.zip; ``kafka-scheduler submit`` keeps one per version of the source in a
cache folder, named by a hash of the files, so an unchanged package is not rebuilt and a changed one never reuses
a stale zip.

    python -m kafka_scheduler.cli.package_zip dist/kafka_scheduler.zip
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from ..kafka.jars import cache_root, jar_paths

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the whole kafka_scheduler package
ZIP_PREFIX = "kafka_scheduler-"
# Fixed entry times: the same source gives the same bytes, whenever and wherever it is zipped.
_ENTRY_TIME = (1980, 1, 1, 0, 0, 0)


def cache_dir() -> Path:
    """.cache/py-files of a checkout; of a pip-installed package, in the user's cache."""
    return Path(os.environ.get("KAFKA_SCHEDULER_PY_FILES_CACHE") or cache_root() / "py-files")


def package_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Every file of the package (sources and data such as log4j2.properties), without compiled leftovers."""
    return sorted(
        p
        for p in package_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )


def _arcname(path: Path, package_dir: Path) -> str:
    return (Path(package_dir.name) / path.relative_to(package_dir)).as_posix()


def source_hash(package_dir: Path = PACKAGE_DIR) -> str:
    digest = hashlib.sha256()
    for path in package_files(package_dir):
        digest.update(_arcname(path, package_dir).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def write_zip(target: Path, package_dir: Path = PACKAGE_DIR) -> Path:
    """Zip the package to ``target`` (written aside, then renamed: a reader never sees half a zip)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as file, zipfile.ZipFile(file, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in package_files(package_dir):
                entry = zipfile.ZipInfo(_arcname(path, package_dir), _ENTRY_TIME)
                entry.compress_type = zipfile.ZIP_DEFLATED
                entry.external_attr = 0o644 << 16
                archive.writestr(entry, path.read_bytes())
        os.chmod(partial, 0o644)
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target


def cached_zip(folder: Path | None = None, package_dir: Path = PACKAGE_DIR) -> Path:
    """The zip of the package as it is now, built only when no zip of this source exists yet."""
    folder = cache_dir() if folder is None else Path(folder)
    target = folder / f"{ZIP_PREFIX}{source_hash(package_dir)[:16]}.zip"
    return target if target.is_file() else write_zip(target, package_dir)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    target = Path(argv[0] if argv else "dist/kafka_scheduler.zip")
    write_zip(target)
    print(f"{target}; connector jars: {','.join(str(p) for p in jar_paths('spark-kafka'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
