"""Request dialects: each decodes the Kafka records of its input topics into normalized request rows.

One Kafka source reads every input topic; each record is decoded by its topic's dialect. With
one dialect the decode is that dialect's columns as they are; with several, each output column
picks its expression by the record's topic. Costly parses (Avro, JSON) run once per record, in a
step of their own, and only for the topics of their dialect.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import reduce
from types import ModuleType

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..protocol import DIALECT_NAMES
from .common import NORMALIZED_COLUMNS, OPTIONAL_COLUMNS, DecodeSettings, normalize

# One module per name of protocol.DIALECT_NAMES (sky-avro: sky_avro.py). A module that fails to import fails here,
# loudly: a dialect never silently disappears.
DIALECTS: dict[str, ModuleType] = {
    name: importlib.import_module(f"{__name__}.{name.replace('-', '_')}") for name in DIALECT_NAMES
}


def _parsed(module, settings) -> dict[str, Column]:
    parsed = getattr(module, "parsed_columns", None)
    return parsed(settings) if parsed is not None else {}


def decode(kafka_rows: DataFrame, inputs: Mapping[str, str], settings: DecodeSettings) -> DataFrame:
    """Normalized request rows of the records of ``inputs`` (topic -> dialect name)."""
    topics_of: dict[str, list[str]] = {}
    for topic, dialect in inputs.items():
        topics_of.setdefault(dialect, []).append(topic)
    if len(topics_of) == 1:
        (dialect,) = topics_of
        module = DIALECTS[dialect]
        rows = kafka_rows
        parsed = _parsed(module, settings)
        if parsed:
            rows = rows.select("*", *[column.alias(name) for name, column in parsed.items()])
        return normalize(rows.select("*", *[c.alias(n) for n, c in module.request_columns(settings).items()]), settings)

    def of(dialect: str) -> Column:
        return F.col("topic").isin(*topics_of[dialect])

    rows = kafka_rows
    parsed = [
        F.when(of(d), column).alias(name) for d in topics_of for name, column in _parsed(DIALECTS[d], settings).items()
    ]
    if parsed:
        rows = rows.select("*", *parsed)
    columns = {d: DIALECTS[d].request_columns(settings) for d in topics_of}
    names = list(dict.fromkeys(name for cols in columns.values() for name in cols))
    picked = []
    for name in names:
        # An optional column is null for the dialects that lack it: no branch of theirs (each branch compiles a
        # comparison of the topic, and the whole decode must stay one method under the JVM's 64 KB).
        choices = (
            [(of(d), columns[d][name]) for d in topics_of if name in columns[d]]
            if name in OPTIONAL_COLUMNS
            else [(of(d), columns[d].get(name)) for d in topics_of]
        )
        expression = reduce(lambda acc, choice: acc.when(*choice), choices[1:], F.when(*choices[0]))
        if name == "_reasons":
            expression = expression.otherwise(F.array(F.lit("no dialect for this topic")))
        picked.append(expression.alias(name))
    return normalize(rows.select("*", *picked), settings)


__all__ = ["DIALECTS", "DIALECT_NAMES", "NORMALIZED_COLUMNS", "DecodeSettings", "decode"]
