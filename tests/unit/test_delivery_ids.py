"""Delivery ids (delivery_ids.py): the Python functions and their Spark SQL twins build and read the same ids, for
topics with "-" and digits in their names, the largest partitions and offsets, and cron firings; a firing's source is
its activating request's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scheduler.delivery_ids import (
    activation_of,
    delivery_id,
    delivery_id_column,
    firing_id,
    is_firing,
    rejection_id,
    rejection_id_column,
    request_of,
    source_columns,
    source_of,
)

# Kafka's topic names: these characters ("@" is not one of them), 1 to 249 of them.
TOPIC_CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
topics = st.one_of(
    st.text(TOPIC_CHARACTERS, min_size=1, max_size=40).filter(lambda t: t not in (".", "..")),
    st.sampled_from(["app-schedule-requests", "a-1-2", "0", "-", "--1-", "x-0-0"]),
)
partitions = st.integers(0, 2**31 - 1)
offsets = st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([0, 9_007_199_254_740_993, 2**63 - 1]))
instants = st.integers(-(2**40), 2**45)

SCHEMA = "topic string, partition int, offset bigint, instant bigint"


def spark_ids(spark, rows: list) -> list:
    """Per row (topic, partition, offset, instant): the delivery id, the rejection id and the source the Spark twins
    build and read (of the id, or of the firing's when ``instant`` is given)."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(rows, SCHEMA)
    built = delivery_id_column(F.col("topic"), F.col("partition"), F.col("offset"))
    firing = F.concat(built, F.lit("@"), F.col("instant").cast("string"))
    named = F.when(F.col("instant").isNull(), built).otherwise(firing)
    read = frame.select(
        built.alias("id"),
        rejection_id_column(F.col("topic"), F.col("partition"), F.col("offset")).alias("rejection_id"),
        *[column.alias(f"source_{n}") for n, column in enumerate(source_columns(named))],
    ).collect()
    return [(r["id"], r["rejection_id"], (r["source_0"], r["source_1"], r["source_2"])) for r in read]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(topics, partitions, offsets, st.one_of(st.none(), instants)), min_size=1, max_size=60))
def test_python_and_spark_build_and_read_the_same_ids(spark, rows):
    expected = []
    for topic, partition, offset, instant in rows:
        made = delivery_id(topic, partition, offset)
        named = made if instant is None else firing_id(made, instant)
        assert request_of(named) == source_of(named) == (topic, str(partition), str(offset))
        assert activation_of(named) == made and is_firing(named) == (instant is not None)
        expected.append((made, rejection_id(topic, partition, offset), (topic, str(partition), str(offset))))
    assert spark_ids(spark, rows) == expected


@pytest.mark.parametrize(
    "malformed", ["", "no-dash", "t-0", "t-0-x", "t-x-0", "t-0-1@", "t-0-1@x", "t-0-1@2@3", "t-0-\u0661"]
)
def test_an_id_of_another_form_has_no_source_in_either(spark, malformed):
    """``request_of`` refuses it, ``source_of`` and its Spark twin read three empty texts (a rejection's source).
    Digits are ASCII ones in both (U+0661, an Arabic-Indic one, is not)."""
    from pyspark.sql import functions as F

    with pytest.raises(ValueError):
        request_of(malformed)
    assert source_of(malformed) == ("", "", "")
    row = spark.createDataFrame([(malformed,)], "id string").select(*source_columns(F.col("id"))).collect()[0]
    assert tuple(row) == ("", "", "")


def test_a_firing_names_its_activation_and_instant():
    activation = delivery_id("requests-1", 0, 42)
    assert activation == "requests-1-0-42"
    assert firing_id(activation, 1767225600000) == "requests-1-0-42@1767225600000"
    assert firing_id(activation, 1767225600000.0) == "requests-1-0-42@1767225600000"
    assert activation_of("requests-1-0-42@1767225600000") == activation and activation_of(activation) == activation
    assert rejection_id("requests", 3, 7) == "reject:-requests-3-7"
