"""The ordinary traffic that `bench mixed` and `bench backlog` send beside bulk work (bench/ordinary.py): its pace,
which schedules it cancels and when, and the figures drawn from what arrived. The scenarios themselves need a broker
and the job (make bench)."""

from __future__ import annotations

import time

from bench.backlog import targets_met
from bench.ordinary import CANCEL_AFTER_S, CANCEL_EVERY, OrdinaryTraffic, lateness_figures


class RecordingProducer:
    """Stands in for bench.harness.RequestProducer: keeps what would be sent."""

    class _Kafka:
        def poll(self, _timeout: float) -> int:
            return 0

    def __init__(self):
        self.producer = self._Kafka()
        self.adds: list[tuple[str, int, str]] = []
        self.cancels: list[tuple[str, bool]] = []

    def add(self, destination: str, due_ms: int, request_id: str) -> None:
        self.adds.append((destination, due_ms, request_id))

    def cancel(self, request_id: str, keyed_apart: bool = False) -> None:
        self.cancels.append((request_id, keyed_apart))

    def flush(self) -> None:
        pass


def traffic(rate: float, leads: tuple[float, ...], keyed_apart: bool = False) -> OrdinaryTraffic:
    sent = OrdinaryTraffic("127.0.0.1:1", "requests", "ordinary", rate, leads, keyed_apart)
    sent.producer = RecordingProducer()
    return sent


def test_it_sends_at_its_rate_with_the_leads_in_turn():
    ordinary = traffic(rate=100, leads=(3.0, 30.0))
    start = time.time()
    ordinary.pace(start)
    ordinary.pace(start + 0.395)  # schedules 0..39 are due by then
    adds = ordinary.producer.adds
    assert len(adds) == 40
    assert [request_id for _, _, request_id in adds] == [f"ordinary-{i}" for i in range(40)]
    for i, (destination, due_ms, request_id) in enumerate(adds):
        lead = due_ms / 1000 - ordinary.sent_at[request_id.encode()]
        assert destination == "ordinary"
        assert abs(lead - (3.0, 30.0)[i % 2]) < 0.01
    assert ordinary.sent == {request_id.encode(): due_ms for _, due_ms, request_id in adds}


def test_every_tenth_of_each_lead_is_cancelled_a_second_after_it_was_sent():
    ordinary = traffic(rate=1000, leads=(3.0, 30.0), keyed_apart=True)
    start = time.time()
    ordinary.pace(start)
    ordinary.pace(start + 0.0395)  # 40 sent
    assert ordinary.cancelled == {f"ordinary-{i}".encode() for i in (0, 1, 20, 21)}
    assert len(ordinary.cancelled) == 2 * 40 // (2 * CANCEL_EVERY)
    assert ordinary.producer.cancels == []  # not yet: a second after sending
    ordinary.pace(max(ordinary.sent_at[b"ordinary-1"], start + 0.0395) + CANCEL_AFTER_S)
    assert ordinary.producer.cancels[:2] == [("ordinary-0", True), ("ordinary-1", True)]
    ordinary.finish()
    assert sorted(ordinary.producer.cancels) == sorted((key.decode(), True) for key in ordinary.cancelled)


def test_a_single_lead_cancels_every_tenth():
    ordinary = traffic(rate=1000, leads=(3.0,))
    start = time.time()
    ordinary.pace(start)
    ordinary.pace(start + 0.0295)  # 30 sent
    assert ordinary.cancelled == {f"ordinary-{i}".encode() for i in (0, 10, 20)}


def test_lateness_figures_count_kept_cancelled_early_and_lost():
    delivered = {
        b"a": (10_500, 10_000),  # 0.5 s late
        b"b": (12_000, 10_000),  # 2 s late
        b"c": (9_000, 10_000),  # early
        b"d": (10_100, 10_000),  # cancelled, delivered anyway
    }
    figures = lateness_figures([b"a", b"b", b"c", b"d", b"e", b"f"], {b"d", b"f"}, delivered)
    assert figures == {
        "sent": 6,
        "cancels_sent": 2,
        "delivered": 3,
        "lateness_p50_s": 0.5,
        "lateness_p99_s": 2.0,
        "lateness_max_s": 2.0,
        "early": 1,
        "lost": 1,  # e: kept and never delivered
        "cancelled_delivered": 1,
    }


def window(p99: float | None, **counts: int) -> dict:
    return {"lateness_p99_s": p99, "early": 0, "lost": 0, "cancelled_delivered": 0, **counts}


def test_the_backlog_target_is_judged_during_and_after_the_backlog_for_each_lead():
    figures = {
        "ordinary": {
            "lead_3s": {"before": window(9.0), "during": window(0.4), "after": window(1.0)},
            "lead_30s": {"before": window(None), "during": window(0.2, cancelled_delivered=1), "after": window(1.2)},
        }
    }
    assert targets_met(figures) == {
        "lead_3s_during": True,
        "lead_3s_after": True,
        "lead_30s_during": False,
        "lead_30s_after": False,
    }


def test_steady_lateness_p99_is_given_per_window_of_due_time():
    """bench steady's tail, placed in the run: a window with no deliveries has none."""
    from bench.harness import DeliveryReader

    reader = DeliveryReader.__new__(DeliveryReader)
    reader.compact = False
    reader.deliveries = [(1_000 + 5, 1_000), (5_000 + 7, 5_000), (21_000 + 2_500, 21_000), (29_000 + 3, 29_000)]
    assert reader.lateness_p99_by_window(10) == [0.007, None, 2.5]
