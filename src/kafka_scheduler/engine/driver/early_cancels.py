"""CANCELs read as they arrive, so that a delivery prepared ahead is withdrawn before its instant however long the
batch that applies the CANCEL takes.

A delivery prepared ahead waits in the driver's timed writer until its instant (timed_writer.py). A CANCEL of it
reaches the writer as a withdrawal from the batch that applies it: one batch cycle after it was sent at best, and a
cycle is seconds on a loaded machine, so a CANCEL sent that close to the due time came too late and the delivery went
out (bench mixed: most cancels sent 2 s before the due time missed, with or without a herd; docs/measurements.md).
``CancelWatcher`` reads the native inputs itself, read_committed as the job does, and hands every valid CANCEL to
the writer at once (``TimedWriter.cancel_early``), which drops what it supersedes.

What a CANCEL supersedes, without the state: requests of one id are applied in the offset order of their partition
(docs/protocols.md), so a CANCEL at offset O of partition P cancels every version of its id made by a request before
O in P, and none made after it (an ADD again). A version's delivery id names the request that made it
(``<topic>-<partition>-<offset>``), so the writer can tell which of what it holds, or is handed later by a batch that
had not read the CANCEL yet, the CANCEL supersedes; a version made in another partition is left to the batch. The
batch that applies the CANCEL then withdraws nothing, and the state retires the version as it would a written one:
a crash in between loses nothing either, since the CANCEL is not committed and the next run's first batch reads it
beside the version it emits again. Only CANCEL: a REPLACE identical to its version keeps that version (a no-op
only the state can tell), and crons have ids of their own (CRON_CANCEL, CRON_PAUSE are the state's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ...delivery_ids import is_firing, request_of
from ...protocol import ACTION, NATIVE_SINGLE_HEADERS, REQUEST_ID, schedule_sid

log = logging.getLogger(__name__)

SINGLE_HEADERS = frozenset(NATIVE_SINGLE_HEADERS)
# CANCELs kept for deliveries not handed over yet (until a committed batch has read them): beyond this many, the
# oldest are left to the batches that apply them.
MAX_REMEMBERED = 100_000
FORGET_EVERY_S = 1.0
PARTITIONS_EVERY_S = 30.0


def native_cancel_sid(topic: str, headers: Iterable | None) -> bytes | None:
    """The state's id of the schedule a record of native input ``topic`` cancels, if it is a valid CANCEL; else
    None. The native decoder's rules for a CANCEL (dialects/native.py), in Python: header names compare
    case-insensitively and the first header of a name counts; the action, as text (invalid UTF-8 replaced), stripped
    of spaces and upper-cased, is CANCEL; no header of SINGLE_HEADERS comes twice; the request id is not empty (any
    bytes). tests/unit/test_early_cancels.py checks this against the decoder over hostile records."""
    first: dict[str, bytes | None] = {}
    seen: set[str] = set()
    for name, value in headers or ():
        lowered = name.lower() if isinstance(name, str) else bytes(name).decode("utf-8", "replace").lower()
        if lowered in seen and lowered in SINGLE_HEADERS:
            return None
        seen.add(lowered)
        first.setdefault(lowered, value)
    action = first.get(ACTION)
    if action is None or bytes(action).decode("utf-8", "replace").strip(" ").upper() != "CANCEL":
        return None
    request_id = first.get(REQUEST_ID)
    if not request_id:
        return None
    return schedule_sid(topic, bytes(request_id))


def superseded_by(delivery_id: str, partition: int, offset: int) -> bool:
    """Whether the version named ``delivery_id`` (``<topic>-<partition>-<offset>`` of the request that made it) was
    made before ``offset`` in ``partition``. Cron firings (``...@instant``: a CANCEL never touches a cron) and ids of
    another form: never."""
    if is_firing(delivery_id):
        return False
    try:
        _, made_in, made_at = request_of(delivery_id)
    except ValueError:
        return False
    return int(made_in) == partition and int(made_at) < offset


class EarlyCancels:
    """The CANCELs read early that no committed batch has read yet: sid -> [(topic, partition, offset)]."""

    def __init__(self, limit: int = MAX_REMEMBERED):
        self.limit = limit
        self._cancels: dict[bytes, list[tuple[str, int, int]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, topic: str, sid: bytes, partition: int, offset: int) -> None:
        if self._count >= self.limit:
            return  # the batch that applies it withdraws what it cancels, as without this
        self._cancels.setdefault(sid, []).append((topic, partition, offset))
        self._count += 1

    def supersede(self, sid: bytes | None, delivery_id: str) -> bool:
        """Whether a CANCEL read early supersedes the version ``delivery_id`` of ``sid``."""
        return sid is not None and any(
            superseded_by(delivery_id, partition, offset) for _, partition, offset in self._cancels.get(sid, ())
        )

    def forget(self, committed: dict[str, dict[int, int]]) -> None:
        """Drop those before the next offset a committed batch reads (per topic and partition)."""
        for sid in list(self._cancels):
            kept = [c for c in self._cancels[sid] if c[2] >= committed.get(c[0], {}).get(c[1], 0)]
            self._count -= len(self._cancels[sid]) - len(kept)
            if kept:
                self._cancels[sid] = kept
            else:
                del self._cancels[sid]


class CancelWatcher:
    """Reads the native input topics from their end as the job runs and hands every valid CANCEL to ``writer``
    (``cancel_early``); every second tells it which a committed batch has read (``committed()``: the next offset to
    read per topic and partition)."""

    def __init__(
        self, writer, topics: list[str], consumer_settings: dict, committed: Callable[[], dict[str, dict[int, int]]]
    ):
        self.writer, self.topics, self.committed = writer, list(topics), committed
        self._settings = consumer_settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancel-watcher", daemon=True)

    def start(self) -> CancelWatcher:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        consumer = Consumer(
            {
                **self._settings,
                "group.id": "kafka-scheduler-cancel-watcher",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "latest",
                "fetch.wait.max.ms": 50,
                "log_level": 3,
            }
        )
        assigned: set[tuple[str, int]] = set()
        next_look = next_forget = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_look:
                    next_look = now + PARTITIONS_EVERY_S
                    try:
                        metadata = consumer.list_topics(timeout=10)
                        found = {
                            (t, p) for t in self.topics if t in metadata.topics for p in metadata.topics[t].partitions
                        }
                        if found - assigned:
                            # From the end: what was there before is the batches' to apply, as without the watcher.
                            consumer.incremental_assign(
                                [TopicPartition(t, p, OFFSET_END) for t, p in sorted(found - assigned)]
                            )
                            assigned |= found
                    except Exception as exc:  # the broker away for a while: the batches apply the CANCELs
                        log.debug("cancel watcher: partitions not looked up: %s", exc)
                if now >= next_forget:
                    next_forget = now + FORGET_EVERY_S
                    try:
                        self.writer.forget_cancels(self.committed())
                    except Exception as exc:
                        log.debug("cancel watcher: committed offsets not read: %s", exc)
                if not assigned:
                    self._stop.wait(0.5)
                    continue
                for message in consumer.consume(1000, timeout=0.2):
                    if message.error() is not None:
                        continue
                    sid = native_cancel_sid(message.topic(), message.headers())
                    if sid is not None:
                        self.writer.cancel_early(message.topic(), sid, message.partition(), message.offset())
        except Exception as exc:  # only an early path: the batches still apply every CANCEL
            log.warning("cancel watcher stopped (CANCELs now act when their batch runs): %s", exc)
        finally:
            consumer.close()
