"""Spark types of the field table's DDL (engine/rules/fields.py), parsed in Python: ``DataType.fromDDL`` asks the JVM
of an active session, and these types are needed when a module is imported (engine/contract.py OUTPUT_SCHEMA)."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ..rules.fields import FIELDS

_PRIMITIVES = {
    "string": StringType(),
    "binary": BinaryType(),
    "int": IntegerType(),
    "long": LongType(),
    "boolean": BooleanType(),
}


def spark_type(ddl: str) -> DataType:
    """The type a DDL type names: the primitives above, ``array<...>`` and ``struct<name:type,...>``, as
    ``DataType.fromDDL`` parses them (tests/unit/test_fields.py compares the two)."""
    ddl = ddl.strip()
    if ddl.startswith("array<") and ddl.endswith(">"):
        return ArrayType(spark_type(ddl[len("array<") : -1]))
    if ddl.startswith("struct<") and ddl.endswith(">"):
        members = (member.split(":", 1) for member in _top_level(ddl[len("struct<") : -1]))
        return StructType([StructField(name.strip(), spark_type(member)) for name, member in members])
    return _PRIMITIVES[ddl]


def _top_level(members: str) -> list[str]:
    """``members`` cut at the commas outside any ``<...>``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(members):
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(members[start:i])
            start = i + 1
    return [*parts, members[start:]]


def spark_field(name: str) -> StructField:
    """A column of the field table as a Spark struct field (nullable)."""
    return StructField(name, spark_type(FIELDS[name].ddl))
