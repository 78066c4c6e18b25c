"""Which destinations the sink and the early path know, against the real broker (no Spark)."""

from __future__ import annotations

import threading
import time
import uuid

from kafka_scheduler.kafka import topics
from kafka_scheduler.kafka.topics import TopicDirectory, admin_client, ensure_topics

from .support import wait_until


def test_a_destination_not_looked_up_yet_is_looked_up_in_the_background(broker, monkeypatch):
    """The early path asks of every request it reads and must not wait: the first ask of a name answers None
    (that request is left to the batches) and looks the name up, so that the requests after it go out early."""
    admin = admin_client(broker.bootstrap_servers)
    small = f"small-{uuid.uuid4().hex[:10]}"
    ensure_topics(admin, [small], 3, config={"max.message.bytes": "2000"})
    directory = TopicDirectory(admin)
    fetched = []
    fetch = directory._fetch
    monkeypatch.setattr(directory, "_fetch", lambda names: (fetched.append(set(names)), fetch(names)))

    assert directory.known(small) is None
    found = wait_until(lambda: directory.known(small), 30, "the background look-up")
    assert (found.partitions, found.writable, found.max_message_bytes) == (3, True, 2000)
    assert fetched == [{small}]

    # A missing topic is looked up once and stays unknown (the batches look it up again when they write to it).
    missing = f"missing-{uuid.uuid4().hex[:10]}"
    assert directory.known(missing) is None
    wait_until(lambda: len(fetched) == 2, 30, "the missing topic's look-up")
    assert fetched[1] == {missing}
    wait_until(lambda: missing in directory._fetched_at, 30, "the look-up's answer")
    assert directory.known(missing) is None and directory._to_look_up.empty()

    # Names without end (hostile input) are not all looked up in the background.
    monkeypatch.setattr(topics, "MAX_BACKGROUND_LOOK_UPS", 2)
    assert directory.known(f"third-{uuid.uuid4().hex[:10]}") is None
    assert directory._to_look_up.empty() and len(directory._asked) == 2


def test_the_early_path_waits_a_moment_for_a_new_destinations_look_up_and_no_longer(broker, monkeypatch):
    """With ``wait``, the first ask of a name waits for its background look-up (at most FIRST_LOOK_UP_WAIT_S): the
    first requests of a new destination go out as read too. A look-up that does not answer holds the early path up
    no longer than that, and all waits of a minute no longer than FIRST_LOOK_UP_WAITS_PER_MINUTE_S."""
    admin = admin_client(broker.bootstrap_servers)
    new = f"new-{uuid.uuid4().hex[:10]}"
    ensure_topics(admin, [new], 2)
    directory = TopicDirectory(admin)
    found = directory.known(new, wait=True)
    assert found is not None and found.partitions == 2

    answer = threading.Event()
    fetch = directory._fetch
    monkeypatch.setattr(directory, "_fetch", lambda names: (answer.wait(30), fetch(names)))
    monkeypatch.setattr(topics, "FIRST_LOOK_UP_WAIT_S", 0.2)
    monkeypatch.setattr(topics, "FIRST_LOOK_UP_WAITS_PER_MINUTE_S", 0.3)
    slow = f"slow-{uuid.uuid4().hex[:10]}"
    started = time.monotonic()
    assert directory.known(slow, wait=True) is None  # the look-up is stuck: the wait ends
    assert directory.known(slow, wait=True) is None  # the name's own wait is spent: no second one
    assert directory.known(f"other-{uuid.uuid4().hex[:10]}", wait=True) is None  # what is left of the minute's
    assert directory.known(f"third-{uuid.uuid4().hex[:10]}", wait=True) is None  # none left
    waited = time.monotonic() - started
    answer.set()
    assert 0.25 <= waited < 5, waited  # bounded by the minute's budget, not 0.2 s per name
    assert sum(seconds for _, seconds in directory._waits) <= 0.3 + 0.1
