"""The herd writer: a batch's herd written slice by slice at its due instants, outside the batches."""

from __future__ import annotations

import threading
import time

import pytest

from kafka_scheduler.engine.driver.herd_writer import HOLD_SLICE_MS, HerdWriter, slice_end_ms, slice_start_ms


class Recorder:
    """The herd writer's ``HerdSlices``: notes what it wrote and when; ``fail`` times it raises first."""

    def __init__(self, fail: int = 0):
        self.writes: list[tuple] = []  # per slice written: (records, number, withdrawn, wall ms, after, through)
        self.calls: list[list] = []  # the slice numbers of each write
        self.released: list = []
        self.retries = 0
        self.fail = fail

    def write(self, records, numbers, withdrawn, after, through):
        if self.fail:
            self.fail -= 1
            raise RuntimeError("broker away")
        self.calls.append(list(numbers))
        self.writes.extend((records, n, withdrawn, time.time() * 1000, after, through) for n in numbers)

    def release(self, records):
        self.released.append(records)

    def before_retry(self):
        self.retries += 1

    def writer(self) -> HerdWriter:
        return HerdWriter(self, retry_pause_s=0.01)


def slice_in(ms: int) -> int:
    """The number of a slice that ends about ``ms`` from now."""
    return int(time.time() * 1000 + ms) // HOLD_SLICE_MS + 1


def test_slices_go_out_in_order_never_before_their_last_due_time_and_each_herd_is_released_once():
    recorder = Recorder()
    writer = recorder.writer()
    first = slice_in(150)
    later = [first + 1, first + 4]
    assert writer.hand("herd-b", [(later[1], 5), (later[0], 7)]) == 12
    assert writer.hand("herd-a", [(first, 3)]) == 3
    assert writer.pending == 15
    assert writer.wait_written(slice_end_ms(later[1]), timeout=10)
    assert [(records, number) for records, number, *_ in recorder.writes] == [
        ("herd-a", first),
        ("herd-b", later[0]),
        ("herd-b", later[1]),
    ]
    assert all(at >= slice_end_ms(number) for _, number, _, at, *_ in recorder.writes), "a slice written early"
    assert recorder.released == ["herd-a", "herd-b"]
    assert writer.pending == 0 and writer.written == 15
    writer.close()


def test_a_batch_waits_only_for_the_slices_that_may_hold_what_is_due_by_its_time():
    recorder = Recorder()
    writer = recorder.writer()
    number = slice_in(400)
    writer.hand("herd", [(number, 10)])
    # Due before the slice's first possible due time: nothing to wait for, at once.
    assert writer.wait_written(slice_start_ms(number) - 1, timeout=0)
    # Its first possible due time: the slice must be written first.
    assert not writer.wait_written(slice_start_ms(number), timeout=0.05)
    assert writer.wait_written(slice_start_ms(number), timeout=10)
    assert len(recorder.writes) == 1
    writer.close()


def test_withdrawn_ids_leave_every_later_slice_and_are_forgotten_once_no_herd_is_pending():
    recorder = Recorder()
    writer = recorder.writer()
    assert not writer.withdraw(["before-any-herd"])  # nothing pending: not kept
    number = slice_in(200)
    writer.hand("herd", [(number, 4), (number + 2, 4)])
    assert writer.withdraw(["x", "y"])
    assert writer.wait_written(slice_end_ms(number + 2), timeout=10)
    assert [withdrawn for _, _, withdrawn, *_ in recorder.writes] == [frozenset({"x", "y"})] * 2
    writer.hand("next", [(slice_in(100), 1)])
    assert writer.wait_written(slice_end_ms(slice_in(100)), timeout=10)
    assert recorder.writes[-1][2] == frozenset()
    writer.close()


def test_a_failed_write_is_retried_and_a_writer_that_cannot_write_fails_the_batches():
    recorder = Recorder(fail=2)
    writer = recorder.writer()
    number = slice_in(50)
    writer.hand("herd", [(number, 1)])
    assert writer.wait_written(slice_end_ms(number), timeout=10)
    assert recorder.retries == 2 and len(recorder.writes) == 1 and writer.failure is None
    writer.close()

    broken = Recorder(fail=99)
    writer = broken.writer()
    writer.hand("herd", [(slice_in(50), 1)])
    assert not writer.wait_written(slice_end_ms(slice_in(50)), timeout=10)
    assert isinstance(writer.failure, RuntimeError) and broken.writes == [] and broken.released == []
    writer.close()


def test_a_graceful_stop_writes_nothing_that_may_be_due_after_its_instant():
    recorder = Recorder()
    writer = recorder.writer()
    number = slice_in(100)
    writer.hand("herd", [(number, 2), (number + 3, 2)])
    writer.write_through(slice_end_ms(number + 2))
    assert writer.wait_written(slice_end_ms(number), timeout=10)
    written = threading.Event()
    # The later slice stays held: nothing is written for a while after its instant.
    deadline = time.monotonic() + 0.3 + (slice_end_ms(number + 3) - time.time() * 1000) / 1000
    while time.monotonic() < deadline:
        if len(recorder.writes) > 1:
            written.set()
            break
        time.sleep(0.01)
    assert not written.is_set(), "a slice due after the stop's instant was written"
    assert writer.pending == 2
    writer.close()


def test_a_stop_within_a_slice_writes_what_is_due_by_its_instant_and_the_rest_only_if_the_stop_moves_on():
    recorder = Recorder()
    writer = recorder.writer()
    number = slice_in(100)
    writer.hand("herd", [(number, 5)])
    cut = slice_start_ms(number) + 10
    writer.write_through(cut)
    # A batch retiring what is due by the cut waits for that part only.
    assert writer.wait_written(cut, timeout=10)
    assert [(n, after, through) for _, n, _, _, after, through in recorder.writes] == [(number, None, cut)]
    assert recorder.writes[0][3] >= cut, "written before the cut's instant"
    assert not writer.wait_written(cut + 1, timeout=0.05) and recorder.released == []
    writer.write_through(slice_end_ms(number) + 1000)
    assert writer.wait_written(slice_end_ms(number), timeout=10)
    assert [(n, after, through) for _, n, _, _, after, through in recorder.writes][1:] == [(number, cut, None)]
    assert recorder.released == ["herd"]
    writer.close()


def test_a_herd_without_slices_is_released_at_once():
    recorder = Recorder()
    writer = recorder.writer()
    assert writer.hand("empty", []) == 0
    assert recorder.released == ["empty"]
    writer.close()


@pytest.mark.parametrize("number", [1, 7, 20_000_000_000])
def test_a_slice_holds_the_due_times_after_the_previous_slice_up_to_its_end(number):
    assert slice_start_ms(number) == slice_end_ms(number - 1) + 1
    assert slice_end_ms(number) - slice_start_ms(number) == HOLD_SLICE_MS - 1


def test_a_writer_behind_writes_every_slice_of_a_herd_due_by_now_in_one_write():
    gate = threading.Event()

    class Slow(Recorder):
        def write(self, records, numbers, *rest):
            gate.wait(10)  # the first write takes long: the herd's next slices fall due meanwhile
            super().write(records, numbers, *rest)

    recorder = Slow()
    writer = HerdWriter(recorder)
    number = slice_in(50)
    writer.hand("herd", [(number + i, 1) for i in range(4)])
    writer.hand("other", [(number + 1, 1)])
    time_to_pass = (slice_end_ms(number + 3) - time.time() * 1000) / 1000 + 0.05
    threading.Timer(max(0.0, time_to_pass), gate.set).start()
    assert writer.wait_written(slice_end_ms(number + 3), timeout=10)
    assert recorder.calls == [[number], [number + 1, number + 2, number + 3], [number + 1]]
    assert recorder.released == ["herd", "other"]
    writer.close()
