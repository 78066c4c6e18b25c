"""Which destinations the sink and the early path know, against the real broker (no Spark)."""

from __future__ import annotations

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
