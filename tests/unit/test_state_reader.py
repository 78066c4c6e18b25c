"""The engine's reader of a checkpoint's state (engine/spark/state_reader.py) without Spark: buckets in time order,
and the groups of chunks it reads a Spark job at a time. Against a running job's state: the integration tests of
list, inspect and the status page."""

from __future__ import annotations

from kafka_scheduler.engine.rules.buckets import key_at
from kafka_scheduler.engine.spark.state_reader import Bucket, CheckpointState, bucket_span_ms, time_order

MIB = 1024 * 1024


class Recording(CheckpointState):
    """A CheckpointState whose reads record the groups of chunks asked for instead of running Spark jobs."""

    def __init__(self, **kwargs):
        super().__init__(None, "unused", **kwargs)
        self.groups: list[list[tuple[int, int, int]]] = []
        self.strikes_read: list[list[tuple[int, int]]] = []

    def _read(self, group, seen, struck):
        self.groups.append([(b.shard, b.key, n) for b, n in group])
        new = sorted({(b.shard, b.key) for b, _ in group} - seen)
        self.strikes_read.append(new)
        seen.update(new)
        yield from group


def bucket(shard: int, key: int, *sizes: int) -> Bucket:
    return Bucket(shard, key, *bucket_span_ms(key), tuple(enumerate(sizes)))


def test_buckets_come_in_the_order_of_the_first_due_time_they_may_hold():
    t = 1_800_000_000_000
    coarse = int(key_at(1, t))  # 64 s from the start of its span
    second = int(key_at(0, t + 5_000))
    earlier = int(key_at(0, bucket_span_ms(coarse)[0] - 1_000))
    ordered = time_order([bucket(1, second, 1), bucket(0, coarse, 1), bucket(2, earlier, 1)])
    assert [b.key for b in ordered] == [earlier, coarse, second]
    assert [b.start_ms for b in ordered] == sorted(b.start_ms for b in ordered)


def test_chunks_are_read_in_groups_of_bounded_bytes_the_first_small_and_in_the_order_given():
    state = Recording(first_group_bytes=4 * MIB, group_bytes=32 * MIB)
    buckets = [bucket(0, 10, 2 * MIB, 1 * MIB), bucket(1, 11, 2 * MIB), bucket(0, 12, *[4 * MIB] * 9)]
    read = list(state.pending(buckets))
    assert [(b.key, n) for b, n in read] == [(b.key, n) for b in buckets for n, _ in b.chunks]
    assert [len(g) for g in state.groups] == [2, 8, 2], "4 MiB first (2 + 1), then 32 (2 + 7 x 4), then the rest"
    # The strikes of a bucket are read once, with the first of its chunks read.
    assert state.strikes_read == [[(0, 10)], [(0, 12), (1, 11)], []]


def test_a_chunk_larger_than_a_group_is_read_alone_and_a_caller_that_stops_reads_no_more():
    state = Recording(first_group_bytes=1 * MIB, group_bytes=1 * MIB)
    buckets = [bucket(0, key, 3 * MIB) for key in range(5)]
    reading = state.pending(buckets)
    next(reading)
    assert len(state.groups) == 1, "one job for the first chunk, none ahead of the caller"
    assert [len(g) for g in state.groups] == [1]
