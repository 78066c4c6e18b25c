"""Reading a query checkpoint from outside the query: progress, committed request offsets, and the
settings that shape its state (``kafka-scheduler-state.json``, recorded at the first run)."""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from ...config import Config, ConfigError, shown_setting


def is_local(checkpoint_dir: str | Path) -> bool:
    """A plain path or a ``file:`` URI on this machine; anything else (hdfs://, s3a://, ...) needs Hadoop."""
    parts = urlsplit(str(checkpoint_dir))
    return parts.scheme == "" or (parts.scheme == "file" and parts.netloc in ("", "localhost"))


def local_path(checkpoint_dir: str | Path) -> Path:
    parts = urlsplit(str(checkpoint_dir))
    return Path(unquote(parts.path)) if parts.scheme == "file" else Path(checkpoint_dir)


def last_committed_batch(checkpoint_dir: str | Path) -> int | None:
    commits = local_path(checkpoint_dir) / "commits"
    ids = [int(p.name) for p in commits.glob("[0-9]*") if p.name.isdigit()] if commits.is_dir() else []
    return max(ids) if ids else None


def committed_offsets(checkpoint_dir: str | Path) -> dict[str, dict[int, int]]:
    """Next offset to read per topic and partition, as of the last committed batch ({} before the first)."""
    batch = last_committed_batch(checkpoint_dir)
    return {} if batch is None else batch_offsets(checkpoint_dir, batch)


def batch_offsets(checkpoint_dir: str | Path, batch: int) -> dict[str, dict[int, int]]:
    """Next offset to read per topic and partition after batch ``batch`` (its offsets file is written before it
    runs)."""
    lines = (local_path(checkpoint_dir) / "offsets" / str(batch)).read_text().splitlines()
    offsets: dict[str, dict[int, int]] = {}
    for line in lines[2:]:  # "v1", batch metadata, then one JSON line per source
        if line.startswith("{"):
            for topic, partitions in json.loads(line).items():
                offsets.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})
    return offsets


# ---------------------------------------------------------------- settings recorded in the checkpoint

STATE_FILE = "kafka-scheduler-state.json"
# The version of the state schema this code writes and reads. 2: the first format with a settings file.
# 3: schedules carry partition, partition key, write-back and history (dialects); the inputs are recorded.
# 4: the id index is a versioned delta log (index_token, index_deltas) and chunk rows carry sid and digest;
#    buckets carry a prepare mark (the timed writer).
STATE_FORMAT = 4
_LAYOUTS = ("wheel", "per-id")
PROBE_BYTES = 4096


class CheckpointFiles(Protocol):
    where: str  # the checkpoint folder, as messages name it

    def has_commit(self) -> bool: ...

    def last_commit(self) -> int | None: ...

    def latest(self, folder: str) -> int | None:
        """The highest batch number in ``offsets`` or ``commits``, or None."""

    def read(self, name: str) -> bytes | None: ...

    def write(self, name: str, data: bytes) -> None: ...

    def set_aside(self, suffix: str) -> str | None:
        """Rename the checkpoint folder by appending ``suffix``; returns the new name, or None if there is none."""


class LocalFiles:
    """A checkpoint on this machine, read and written by Python."""

    def __init__(self, checkpoint_dir: str | Path):
        self.root = local_path(checkpoint_dir)
        self.where = os.path.abspath(self.root)

    def has_commit(self) -> bool:
        return last_committed_batch(self.root) is not None

    def last_commit(self) -> int | None:
        return last_committed_batch(self.root)

    def latest(self, folder: str) -> int | None:
        ids = (
            [int(p.name) for p in (self.root / folder).glob("[0-9]*") if p.name.isdigit()]
            if (self.root / folder).is_dir()
            else []
        )
        return max(ids) if ids else None

    def check_writable(self) -> None:
        """Write, sync and remove a small file: an unwritable or full folder is then one clear error at start,
        not a failed micro-batch later. (A disk that fills up while the job runs stops it: see pipeline.)"""
        probe = self.root / f".write-probe.{uuid.uuid4().hex}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as out:
                out.write(b"\0" * PROBE_BYTES)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            raise ConfigError(
                f"cannot write to checkpoint {self.where}: {exc.strerror or exc}; the scheduler keeps "
                f"its offsets and state there: make it writable and give it room, or use another "
                f"--checkpoint-dir"
            ) from None
        finally:
            try:
                probe.unlink(missing_ok=True)
            except OSError:
                pass

    def read(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read {self.root / name}: {exc.strerror}") from None

    def write(self, name: str, data: bytes) -> None:
        temporary = self.root / f".{name}.{uuid.uuid4().hex}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.root / name)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise ConfigError(f"cannot write {self.root / name}: {exc.strerror}") from None

    def set_aside(self, suffix: str) -> str | None:
        if not self.root.exists():
            return None
        target = self.root.with_name(self.root.name + suffix)
        try:
            self.root.rename(target)
        except OSError as exc:
            raise ConfigError(f"cannot rename {self.where} to {target}: {exc.strerror}") from None
        return os.path.abspath(target)


class HadoopFiles:
    """A checkpoint on a Hadoop filesystem (hdfs://, s3a://, ...), through the Spark session's JVM: the same
    filesystem and credentials Spark itself uses for the checkpoint."""

    def __init__(self, spark, checkpoint_dir: str | Path):
        self._path = spark._jvm.org.apache.hadoop.fs.Path
        self.root = self._path(str(checkpoint_dir))
        self.where = str(checkpoint_dir)
        try:
            self.fs = self.root.getFileSystem(spark._jsc.hadoopConfiguration())
            self.where = self.fs.makeQualified(self.root).toString()
        except Exception as exc:  # py4j's Java exception
            raise ConfigError(f"cannot open checkpoint {self.where}: {_java_summary(exc)}") from None

    def has_commit(self) -> bool:
        commits = self._path(self.root, "commits")
        try:
            return self.fs.exists(commits) and any(
                status.getPath().getName().isdigit() for status in self.fs.listStatus(commits)
            )
        except Exception as exc:
            raise ConfigError(f"cannot list {self.where}/commits: {_java_summary(exc)}") from None

    def last_commit(self) -> int | None:
        return self.latest("commits")

    def latest(self, folder: str) -> int | None:
        path = self._path(self.root, folder)
        try:
            if not self.fs.exists(path):
                return None
            ids = [
                int(status.getPath().getName())
                for status in self.fs.listStatus(path)
                if status.getPath().getName().isdigit()
            ]
        except Exception as exc:
            raise ConfigError(f"cannot list {self.where}/{folder}: {_java_summary(exc)}") from None
        return max(ids) if ids else None

    def read(self, name: str) -> bytes | None:
        path = self._path(self.root, name)
        try:
            if not self.fs.exists(path):
                return None
            stream = self.fs.open(path)
            try:
                return bytes(stream.readAllBytes())
            finally:
                stream.close()
        except Exception as exc:
            raise ConfigError(f"cannot read {self.where}/{name}: {_java_summary(exc)}") from None

    def write(self, name: str, data: bytes) -> None:
        temporary = self._path(self.root, f".{name}.{uuid.uuid4().hex}.tmp")
        target = self._path(self.root, name)
        try:
            self.fs.mkdirs(self.root)
            out = self.fs.create(temporary, True)
            try:
                out.write(bytearray(data))
            finally:
                out.close()
            # FileSystem.rename does not replace an existing file on HDFS. The file is only ever rewritten while no
            # batch is committed, and then a missing file is simply written again, so deleting first is safe.
            self.fs.delete(target, False)
            if not self.fs.rename(temporary, target):
                raise ConfigError(f"cannot write {self.where}/{name}: renaming the temporary file failed")
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"cannot write {self.where}/{name}: {_java_summary(exc)}") from None

    def set_aside(self, suffix: str) -> str | None:
        target = self._path(self.root.getParent(), self.root.getName() + suffix)
        try:
            if not self.fs.exists(self.root):
                return None
            if not self.fs.rename(self.root, target):
                raise ConfigError(f"cannot rename {self.where} to {target.toString()}")
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"cannot rename {self.where}: {_java_summary(exc)}") from None
        return target.toString()


def start_new_generation(files: CheckpointFiles, now: datetime | None = None) -> str | None:
    """``run --from-beginning``: keep the current checkpoint aside under a dated name (never deleted) so the job
    starts a new one and reads every input from its earliest offset. Returns where the old one went."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return files.set_aside(".before-" + now.strftime("%Y%m%dT%H%M%SZ"))


def _java_summary(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    return " ".join(text.split())[:300]


def checkpoint_files(config: Config, spark=None) -> CheckpointFiles:
    if spark is None:
        if not is_local(config.checkpoint_dir):
            raise ValueError(f"{config.checkpoint_dir} is not a local path: a Spark session is needed to reach it")
        return LocalFiles(config.checkpoint_dir)
    return HadoopFiles(spark, config.checkpoint_dir)


def settle_state_settings(
    config: Config, bucket_ms: int, files: CheckpointFiles | None = None, now: datetime | None = None
) -> tuple[Config, list[str]]:
    """The config to run with on this checkpoint, and notices worth logging; ConfigError if it must not run.

    Settings that shape the state are recorded at the first run. Later starts take the recorded values of those
    not given explicitly, and refuse explicit values that differ: state written one way cannot be read another
    (with other shards, REPLACE and CANCEL would miss the index entries of the ids they name).
    """
    files = files or checkpoint_files(config)
    file_name = f"{files.where.rstrip('/')}/{STATE_FILE}"
    if not files.has_commit():
        # Spark redoes batch 0 from empty state, so an earlier start that committed nothing binds nothing.
        files.write(STATE_FILE, _encode(config, bucket_ms, now))
        return replace(config, catch_up_first=True), []
    _check_spark_logs(files)
    raw = files.read(STATE_FILE)
    if raw is None:
        foreign = _foreign_sources(config, files)
        if foreign is not None:
            raise ConfigError(
                f"checkpoint {files.where} is not a kafka-scheduler checkpoint: it has no {STATE_FILE}, and its "
                f"query read {foreign}, none of the inputs of app {config.app_id} "
                f"({', '.join(config.input_topics)}). Use another --checkpoint-dir"
            )
        raise ConfigError(
            f"checkpoint {files.where} has committed batches but no {STATE_FILE}: it was written by an earlier "
            f"kafka-scheduler whose state format this version cannot read; its pending schedules can only be "
            f"drained with the version that wrote it, or use a new --checkpoint-dir"
        )
    recorded = _decode(raw, file_name)
    if recorded.get("app_id") not in (None, config.app_id):
        raise ConfigError(
            f"checkpoint {files.where} belongs to app id {recorded['app_id']} (recorded at its first run), not "
            f"{config.app_id}: its offsets and state are that app's. Run with --app-id {recorded['app_id']}, or "
            f"use another --checkpoint-dir"
        )
    if recorded["state_format"] != STATE_FORMAT:
        raise ConfigError(
            f"checkpoint {files.where} holds state format {recorded['state_format']} (per its {STATE_FILE}), but "
            f"this version reads format {STATE_FORMAT} only: run the version that wrote it, or use a new "
            f"--checkpoint-dir"
        )

    notices: list[str] = []
    settled: dict[str, Any] = {}
    layout = _settle_one(config, "state_layout", recorded["state_layout"], files.where, notices)
    settled["state_layout"] = layout
    if layout == "wheel":
        settled["shards"] = _settle_one(config, "shards", recorded["shards"], files.where, notices)
        if recorded["bucket_ms"] != bucket_ms:
            raise ConfigError(
                f"checkpoint {files.where} holds wheel buckets of {recorded['bucket_ms']} ms, but this version uses "
                f"{bucket_ms} ms and cannot read that state: run the version that wrote it, or use a new "
                f"--checkpoint-dir"
            )
    elif config.given_by("shards") and config.shards != recorded["shards"]:
        notices.append(f"{config.given_by('shards')} is ignored: the checkpoint's per-id state layout has no shards")
    if recorded["partitions"] != config.partitions:
        notices.append(
            f"Spark keeps the {recorded['partitions']} shuffle partitions of the checkpoint's first run; "
            f"{_shown(config, 'partitions')} now only sets the partition count of topics the scheduler creates"
        )
    added = _settle_inputs(config, recorded["inputs"], files.where)
    if added:
        notices.append(
            "new input"
            + ("s " if len(added) > 1 else " ")
            + ", ".join(f"{topic} ({dialect})" for topic, dialect in added.items())
            + ": read from the earliest offset; the first batch reads every input to its end before delivering"
        )
        recorded["inputs"] = {**recorded["inputs"], **added}
        settled["catch_up_first"] = True
    if added or "app_id" not in recorded:  # a file from before app ids were recorded gets its app id now
        recorded["app_id"] = config.app_id
        files.write(STATE_FILE, (json.dumps(recorded, indent=2) + "\n").encode())
    return replace(config, **settled), notices


def _settle_inputs(config: Config, recorded: dict[str, str], where: str) -> dict[str, str]:
    """The inputs added since the last start; ConfigError if one was removed or changed its dialect."""
    current = config.input_topics
    changed = {t: (d, current[t]) for t, d in recorded.items() if t in current and current[t] != d}
    if changed:
        topic, (was, now) = next(iter(changed.items()))
        raise ConfigError(
            f"input {topic} is read as {now} now, but checkpoint {where} read it as {was}: its schedule ids and "
            f"pending versions were decoded that way. Keep --input {topic}:{was}, or rebuild with "
            f"--from-beginning (the checkpoint is kept aside and every input is read again from its start)"
        )
    removed = [t for t in recorded if t not in current]
    if removed:
        listed = ", ".join(f"{t}:{recorded[t]}" for t in removed)
        raise ConfigError(
            f"checkpoint {where} reads input{'s' if len(removed) > 1 else ''} {listed}, missing from the inputs now "
            f"({', '.join(f'{t}:{d}' for t, d in current.items())}): its pending schedules would stay in state and "
            f"its offsets would be lost. Keep the input (add --input {removed[0]}:{recorded[removed[0]]}), or "
            f"rebuild with --from-beginning"
        )
    return {t: d for t, d in current.items() if t not in recorded}


def _settle_one(config: Config, name: str, recorded: Any, where: str, notices: list[str]) -> Any:
    source = config.given_by(name)
    current = getattr(config, name)
    if current == recorded:
        return current
    laid_out = f"in {recorded} shards" if name == "shards" else f"in the {recorded} layout"
    if source is not None:
        raise ConfigError(
            f"{_shown(config, name)} does not match checkpoint {where}, whose state was laid out {laid_out} at its "
            f"first run: omit {source} to keep {recorded}, or use a new --checkpoint-dir"
        )
    notices.append(
        f"state laid out {laid_out}, as recorded at the checkpoint's first run "
        f"(the current settings alone would give {current})"
    )
    return recorded


def _shown(config: Config, name: str) -> str:
    """An option's value as it was set: '--shards 6', 'KAFKA_SCHEDULER_SHARDS=6', 'shards = 6 in FILE' or 'the
    default --shards 4'."""
    return shown_setting(name, config.given_by(name), getattr(config, name))


def _encode(config: Config, bucket_ms: int, now: datetime | None) -> bytes:
    now = now or datetime.now(UTC)
    record = {
        "state_format": STATE_FORMAT,
        "app_id": config.app_id,
        "state_layout": config.state_layout,
        "shards": config.shards,
        "bucket_ms": bucket_ms,
        "partitions": config.partitions,
        "inputs": config.input_topics,
        "created_at": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return (json.dumps(record, indent=2) + "\n").encode()


def _decode(raw: bytes, file_name: str) -> dict[str, Any]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise ConfigError(
            f"{file_name} is not valid JSON ({reason}): it records the state settings of the "
            f"checkpoint's first run; restore it, or use a new --checkpoint-dir"
        ) from None
    if not isinstance(record, dict) or not _is_int(record.get("state_format")):
        raise ConfigError(
            f"{file_name} is not a kafka-scheduler state file (no integer state_format): restore it, "
            f"or use a new --checkpoint-dir"
        )
    if record["state_format"] != STATE_FORMAT:
        return record  # another format's fields are not this version's to judge
    problems = [
        name
        for name, valid in (
            ("state_layout", record.get("state_layout") in _LAYOUTS),
            ("shards", _is_positive_int(record.get("shards"))),
            ("bucket_ms", _is_positive_int(record.get("bucket_ms"))),
            ("partitions", _is_positive_int(record.get("partitions"))),
            ("inputs", _is_inputs(record.get("inputs"))),
            ("app_id", record.get("app_id") is None or isinstance(record["app_id"], str)),
        )
        if not valid
    ]
    if problems:
        raise ConfigError(
            f"{file_name} is damaged (missing or invalid {', '.join(problems)}): restore it, or use a "
            f"new --checkpoint-dir"
        )
    return record


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_int(value: Any) -> bool:
    return _is_int(value) and value > 0


def _is_inputs(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(t, str) and isinstance(d, str) for t, d in value.items())
    )


def _check_spark_logs(files: CheckpointFiles) -> None:
    """Refuse a checkpoint whose Spark files a restart reads first are damaged, with one message naming the file:
    Spark itself would fail the start with a long stack trace. Checks ``metadata`` (the query id) and the newest
    entries of ``offsets`` and ``commits`` (a version line, then JSON lines)."""

    def damaged(name: str, what: str) -> ConfigError:
        return ConfigError(
            f"checkpoint {files.where} is damaged: {name} {what}. Restore the folder from a copy, "
            f"or start a new checkpoint (--from-beginning keeps this one aside and reads every input "
            f"again from its start; or use a new --checkpoint-dir)"
        )

    raw = files.read("metadata")
    if raw is None:
        raise damaged("metadata", "is missing (Spark writes the query id there at its first start)")
    try:
        metadata = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        metadata = None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("id"), str):
        raise damaged("metadata", "is not Spark's query metadata (JSON with the query id)")
    for folder in ("offsets", "commits"):
        batch = files.latest(folder)
        if batch is None:
            raise damaged(folder, "has no entry although a batch was committed")
        name = f"{folder}/{batch}"
        problem = _log_entry_problem(files.read(name))
        if problem:
            raise damaged(name, problem)


def _log_entry_problem(raw: bytes | None) -> str | None:
    """What is wrong with an entry of Spark's offset or commit log, or None: a version line ``vN``, then JSON lines
    (an offset log has one per source, ``-`` for a source without offsets)."""
    if raw is None:
        return "is missing"
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return "is not text"
    if not lines or not re.fullmatch(r"v[1-9][0-9]*", lines[0]):
        return "does not start with Spark's version line (v1)"
    body = [line for line in lines[1:] if line not in ("", "-")]
    if not body:
        return "has no content after its version line"
    for line in body:
        try:
            json.loads(line)
        except json.JSONDecodeError:
            return "holds a line that is not JSON"
    return None


def _foreign_sources(config: Config, files: CheckpointFiles) -> str | None:
    """What another query's checkpoint read (its Kafka topics, or that it read none), if it read none of this app's
    inputs; None if it read one (an earlier kafka-scheduler's checkpoint) or its offsets cannot be read."""
    batch = files.latest("offsets")
    raw = files.read(f"offsets/{batch}") if batch is not None else None
    if raw is None:
        return None
    topics: set[str] = set()
    sources = [line for line in raw.decode("utf-8", "replace").splitlines()[2:] if line.startswith("{")]
    if not sources:
        return None
    for line in sources:
        try:
            source = json.loads(line)
        except json.JSONDecodeError:
            return None
        if isinstance(source, dict) and all(isinstance(p, dict) for p in source.values()):
            topics |= set(source)  # a Kafka source's offsets: topic -> partition -> offset
    if topics & set(config.input_topics):
        return None
    return ", ".join(sorted(topics)) if topics else "no Kafka topic"
