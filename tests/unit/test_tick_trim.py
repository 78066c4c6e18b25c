"""The job deletes the wake-up ticks its last committed batch read (the ticks topic has no time retention)."""

from concurrent.futures import Future
from types import SimpleNamespace

from kafka_scheduler.config import Config
from kafka_scheduler.pipeline import Scheduler


class FakeAdmin:
    def __init__(self):
        self.deleted = []

    def delete_records(self, partitions):
        self.deleted.extend((p.topic, p.partition, p.offset) for p in partitions)
        done = Future()
        done.set_result(None)
        return dict.fromkeys(partitions, done)


def scheduler_with(end_offset) -> tuple[Scheduler, FakeAdmin]:
    scheduler = Scheduler(Config(app_id="app"))
    scheduler.admin = FakeAdmin()
    scheduler.query = SimpleNamespace(lastProgress={"sources": [{"endOffset": end_offset}]})
    return scheduler, scheduler.admin


def test_ticks_before_the_committed_end_offset_are_deleted():
    scheduler, admin = scheduler_with('{"app-schedule-requests": {"0": 500}, "app-scheduler-ticks": {"0": 42}}')
    scheduler._trim_ticks()
    assert admin.deleted == [("app-scheduler-ticks", 0, 42)]


def test_nothing_is_deleted_before_a_tick_was_read():
    scheduler, admin = scheduler_with({"app-schedule-requests": {"0": 500}})
    scheduler._trim_ticks()
    assert admin.deleted == []
