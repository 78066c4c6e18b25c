"""The job's start-up line about its topics names every topic it checked or created, and which it created."""

from kafka_scheduler.config import Config
from kafka_scheduler.pipeline import topics_line

CONFIG = Config(app_id="app", inputs=(("app-schedule-requests", "native"), ("schedules", "karafka")))
CHECKED = ["schedules", "app-schedule-requests", "app-schedule-rejections", "app-schedule-history", CONFIG.ticks_topic]


def test_a_new_app_names_all_it_created_and_the_foreign_input_it_checked():
    created = CHECKED[1:]
    assert topics_line(CHECKED, created) == (
        "topics: schedules, app-schedule-requests, app-schedule-rejections, app-schedule-history, app-scheduler-ticks "
        "(created app-schedule-requests, app-schedule-rejections, app-schedule-history, app-scheduler-ticks; "
        "already there: schedules)"
    )


def test_every_topic_named_whether_created_or_not():
    assert topics_line(CHECKED, []) == f"topics: {', '.join(CHECKED)} (exist)"
    assert (
        topics_line(CHECKED[1:], CHECKED[1:]) == f"topics: {', '.join(CHECKED[1:])} (created {', '.join(CHECKED[1:])})"
    )
