"""The state step without Spark: ``WheelProcessor`` and its ``MapStateShardStore`` over in-memory state variables,
fed request frames as Arrow hands them (the decode's columns and types, the field table's), of every dialect's
shape at once. Pandas warns of nothing on the way (a FutureWarning is an error here: frames of one column with two
dtypes, concatenated), and every request comes out as the rules say."""

from __future__ import annotations

import warnings
from collections import Counter

import pandas as pd
import pyarrow as pa
import pytest

from kafka_scheduler.engine.contract import KIND_DELIVER, KIND_OUTCOME, KIND_TIMER
from kafka_scheduler.engine.processor.input import pack_by_shard
from kafka_scheduler.engine.processor.wheel_processor import WheelProcessor
from kafka_scheduler.engine.rules.buckets import BucketInfo
from kafka_scheduler.engine.rules.fields import FIELDS, REQUEST_COLUMNS

SHARD = 0
REQUEST_SCHEMA = pa.schema([("shard", pa.int32()), *((name, FIELDS[name].arrow) for name in REQUEST_COLUMNS)])


class ValueState:
    def __init__(self):
        self.value = None

    def get(self):
        return self.value

    def update(self, value):
        self.value = tuple(value)


class MapState:
    def __init__(self):
        self.values = {}

    def getValue(self, key):
        return self.values.get(tuple(key))

    def updateValue(self, key, value):
        self.values[tuple(key)] = tuple(value)

    def removeKey(self, key):
        self.values.pop(tuple(key), None)

    def iterator(self):
        return iter(list(self.values.items()))

    def keys(self):
        return iter(list(self.values))


class Handle:
    """The state of one grouping key (the test's one shard) and its timers."""

    def __init__(self):
        self.states = {}
        self.timers = set()

    def getValueState(self, name, schema):
        return self.states.setdefault(name, ValueState())

    def getMapState(self, name, key_schema, value_schema):
        return self.states.setdefault(name, MapState())

    def registerTimer(self, timer_ms):
        self.timers.add(timer_ms)

    def listTimers(self):
        return iter(sorted(self.timers))


class Clock:
    def __init__(self, now_ms):
        self.now_ms = now_ms

    def getCurrentProcessingTimeInMs(self):
        return self.now_ms


class Expiry:
    def __init__(self, timer_ms):
        self.timer_ms = timer_ms

    def getExpiryTimeInMs(self):
        return self.timer_ms


def request(offset: int, sid: bytes, action: str = "ADD", due_ms: int | None = 10_000, **columns) -> dict:
    """A normalized request row of the native dialect, with what another dialect sets in ``columns``."""
    row = dict.fromkeys(REQUEST_SCHEMA.names)
    src_topic = columns.pop("src_topic", "native")
    row |= {
        "shard": SHARD,
        "sid": sid,
        "kind": "request",
        "action": action,
        "due_ms": due_ms,
        "topic": "out",
        "key": b"k%d" % offset,
        "value": b"v",
        "headers": [{"key": "h", "value": b"1"}],
        "delivery_id": f"{src_topic}-0-{offset}",
        "src_topic": src_topic,
        "src_partition": 0,
        "src_offset": offset,
        "src_ts_ms": offset,
        "entry_bytes": 64,
        "history": False,
        **columns,
    }
    return row


def karafka(offset: int, name: bytes, due_ms: int, action: str = "ADD") -> dict:
    return request(
        offset,
        b"id:karafka/" + name,
        action,
        due_ms,
        src_topic="karafka",
        wb_topic="karafka",
        wb_partition=0,
        wb_key=name,
        wb_headers=[{"key": "x-scheduler-source-offset", "value": str(offset).encode()}],
    )


def etf1(offset: int, name: bytes, due_ms: int, action: str = "ADD") -> dict:
    return request(offset, b"id:etf1/" + name, action, due_ms, src_topic="etf1", partition=offset % 3, history=True)


def cron_add(offset: int, name: bytes, policy: str = "replay") -> dict:
    return request(
        offset,
        b"cron:native/" + name,
        "CRON_ADD",
        None,
        cron_expr="* * * * * */5",
        cron_policy=policy,
        raw_headers=[{"key": "x-scheduler-action", "value": b"CRON_ADD"}],
    )


class Job:
    """The processor of one shard, driven as Spark drives it: a handler call per micro-batch with requests, then one
    per timer due by the batch's time."""

    def __init__(self, lookahead_ms: int = 2000):
        self.handle = Handle()
        self.processor = WheelProcessor(window_ms=lookahead_ms, run="run-1", started_ms=0)
        self.processor.init(self.handle)
        self.rows: list[pd.DataFrame] = []

    def batch(self, now_ms: int, requests: list[dict]) -> None:
        if requests:
            table = pa.Table.from_pylist(requests, schema=REQUEST_SCHEMA)
            [packed] = list(pack_by_shard(table.to_batches()))
            rows = [pd.DataFrame({"shard": packed.column(0).to_pylist(), "requests": packed.column(1).to_pylist()})]
            self.rows += self.processor.handleInputRows((SHARD,), iter(rows), Clock(now_ms))
        for timer_ms in sorted(t for t in self.handle.timers if t <= now_ms):
            self.handle.timers.discard(timer_ms)
            self.rows += self.processor.handleExpiredTimer((SHARD,), Clock(now_ms), Expiry(timer_ms))

    def delivered(self) -> Counter:
        return Counter(d for frame in self.rows for d in frame.loc[frame["kind"] == KIND_DELIVER, "delivery_id"])

    def counts(self) -> Counter:
        counts = Counter()
        for frame in self.rows:
            outcomes = frame[frame["kind"] == KIND_OUTCOME]
            counts.update(dict(zip(outcomes["topic"], outcomes["n"])))
        return counts


@pytest.fixture
def future_warnings_fail():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        yield


def test_every_dialects_requests_go_through_state_and_out_without_a_pandas_warning(future_warnings_fail):
    job = Job()
    job.batch(
        1_000,
        [
            request(1, b"offset:native/0/1", due_ms=2_500),  # no id, prepared at once
            request(2, b"offset:native/0/2", due_ms=30_000, max_lateness_ms=5),  # no id, expiry
            request(3, b"id:native/a", due_ms=40_000),
            karafka(4, b"x", 45_000),
            etf1(5, b"y", 46_000),
            cron_add(6, b"c"),
        ],
    )
    # Every id again: pending versions go through the rules one by one, next to bulk rows of every shape.
    job.batch(
        4_000,
        [
            request(7, b"id:native/a", "REPLACE", 41_000),
            karafka(8, b"x", 47_000, "REPLACE"),
            etf1(9, b"y", 48_000, "REPLACE"),
            request(10, b"offset:native/0/10", due_ms=47_500, max_lateness_ms=60_000),
            etf1(11, b"z", 47_600),
            request(12, b"id:native/b", due_ms=120_000),
            request(13, b"id:native/b", "CANCEL", None),
            cron_add(14, b"d", "skip"),
            request(15, b"cron:native/c", "CRON_PAUSE", None),
        ],
    )
    job.batch(20_000, [request(16, b"cron:native/c", "CRON_RESUME", None), cron_add(17, b"d", "replay")])
    for now_ms in range(21_000, 60_001, 1_000):
        job.batch(now_ms, [])

    delivered = job.delivered()
    one_shots = ["native-0-1", "native-0-10", "native-0-7", "karafka-0-8", "etf1-0-9", "etf1-0-11"]
    assert {d: delivered[d] for d in one_shots} == dict.fromkeys(one_shots, 1)
    assert not {"native-0-3", "karafka-0-4", "etf1-0-5", "native-0-12"} & delivered.keys()  # replaced, cancelled
    firings = [d for d in delivered if "@" in d]
    assert firings and all(n == 1 for n in delivered.values())
    counts = job.counts()
    assert counts["scheduled@native"] >= 3 and counts["replaced@karafka"] == counts["replaced@etf1"] == 1


def test_a_buckets_state_row_is_what_bucket_info_reads_back(future_warnings_fail):
    job = Job()
    job.batch(1_000, [request(i, b"id:native/%d" % i, due_ms=90_000) for i in range(3)])
    [row] = job.handle.states["buckets"].values.values()
    info = BucketInfo.from_row(row)
    assert info.to_row() == row and info.chunks and info.timer_ms < 90_000
    assert any(r["kind"] == KIND_TIMER for frame in job.rows for _, r in frame.iterrows())
