"""The pure parts of ``inspect``: ids out of schedule ids, filters, the table."""

import pandas as pd

from kafka_scheduler.ops.inspection import DAY_MS, HOUR_MS, Filters, Inspection, render_table, request_id


def testrequest_ids_come_out_of_client_schedule_ids_and_id_less_schedules_have_none():
    assert request_id(b"id:orders/order-7") == "order-7"
    assert request_id(b"id:orders/a/b") == "a/b", "only the topic ends at the first slash"
    assert request_id(b"id:orders/\xff\x00") == "0xff00"
    assert request_id(b"offset:orders/0/12") is None
    assert request_id(None) is None


def test_filters_keep_what_matches_every_given_filter():
    frame = pd.DataFrame(
        {
            "id": ["a", "b", "c", None],
            "topic": ["t1", "t1", "t2", "t1"],
            "input_topic": ["in", "in", "in", "other"],
            "due_ms": [10, 20, 30, 40],
        }
    )
    assert list(Filters().keep(frame)["due_ms"]) == [10, 20, 30, 40]
    assert list(Filters(ids=("a", "c")).keep(frame)["id"]) == ["a", "c"]
    assert list(Filters(destination="t1", input_topic="in").keep(frame)["id"]) == ["a", "b"]
    assert list(Filters(due_from_ms=20, due_until_ms=40).keep(frame)["due_ms"]) == [20, 30]


def test_the_table_shows_the_next_48_hours_the_next_30_days_and_what_is_later():
    now = 1_000 * DAY_MS + 5 * HOUR_MS + 123
    found = Inspection(now, batch=7, matching=6, overdue=1)
    found.per_hour.update(
        {
            now // HOUR_MS * HOUR_MS - HOUR_MS: 1,
            now // HOUR_MS * HOUR_MS + HOUR_MS: 2,
            now // HOUR_MS * HOUR_MS + 50 * HOUR_MS: 1,
        }
    )
    found.per_day.update({1_000 * DAY_MS: 3, 1_002 * DAY_MS: 1, 1_100 * DAY_MS: 2})
    table = render_table(found, Filters())
    assert "as of batch 7" in table and "6 matching, 1 of them due already" in table
    hours = table.split("due per hour")[1].split("due per day")[0]
    assert hours.count(":00 ") == 1, "only hours from now to 48 hours ahead"
    assert [line.split() for line in table.splitlines() if line.strip().startswith("later")] == [["later", "2"]]
