"""The cells of a frame of schedules, read as Python values: pandas and Arrow hold a missing one as None, NaN or
pd.NA, and headers as tuples, dicts or Rows.
"""

from __future__ import annotations

import pandas as pd


def missing(value) -> bool:
    """A null cell of a frame: pandas holds a missing one as None, NaN in a numeric column, or pd.NA in a nullable
    integer one."""
    return value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value))


def optional_int(value) -> int | None:
    """An int cell of a frame: pandas may hold a missing one as None, NaN or pd.NA."""
    return None if value is None or pd.isna(value) else int(value)


def optional_bytes(value) -> bytes | None:
    return None if missing(value) else bytes(value)


def flag(value) -> bool:
    return not missing(value) and bool(value)


def header_pairs(cell) -> list:
    """(name, value) pairs of a headers cell: tuples, or the dicts and Rows Spark and Arrow hand over."""
    if missing(cell):
        return []
    return [(h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1]) for h in cell]


def headers_of(cell) -> tuple:
    return tuple((name, optional_bytes(value)) for name, value in header_pairs(cell))
