"""PySpark's conversion of the state step's output to Arrow, taught to take a list column that is Arrow already as it
is.

``transformWithStateInPandas`` converts each frame a handler yields with ``PandasToArrowConversion.convert``, which
runs a Python call per row (``list(value)``) over every array column before handing it to Arrow, whatever the
column holds. The headers leave the state step as two such columns (``header_names``, ``header_values``,
engine/contract.py): for a herd that was 3 µs a delivery, most of PySpark's conversion (docs/measurements.md, "Urgent
requests beside a herd: the lookahead; a herd's headers as Arrow"). A column backed by an Arrow list array
(``pd.ArrowDtype``) needs no such call: Arrow takes it without a copy. ``install`` wraps PySpark's converter
factory so that such a column passes as it is; every other column, and every other type, is PySpark's as before.
PySpark is pinned (requirements.lock); where its internals moved, ``install`` leaves them alone and says so, and
the processor emits plain Python lists, as before (``arrow_lists_pass``).
"""

from __future__ import annotations

import logging

import pandas as pd

log = logging.getLogger(__name__)

_installed = False


def _passing_arrow_lists(create_converter):
    from pyspark.sql.types import ArrayType

    def create(data_type, *args, **kwargs):
        convert = create_converter(data_type, *args, **kwargs)
        if not isinstance(data_type, ArrayType):
            return convert

        def convert_unless_arrow(series):
            if not isinstance(series.dtype, pd.ArrowDtype):
                return convert(series)
            chunked = series.array.__arrow_array__()
            if chunked.num_chunks <= 1:
                return series
            # Frames concatenated by pandas hold several chunks; a record batch's column is one array.
            return pd.Series(pd.arrays.ArrowExtensionArray(chunked.combine_chunks()), index=series.index)

        return convert_unless_arrow

    create.passes_arrow_lists = True
    return create


def install() -> bool:
    """Wraps PySpark's converter factory once per process; returns whether Arrow list columns now pass as they are."""
    global _installed
    if _installed:
        return True
    try:
        from pyspark.sql import conversion
        from pyspark.sql.pandas import types
    except ImportError:
        return False
    factory = getattr(types, "_create_converter_from_pandas", None)
    if factory is None or not hasattr(conversion, "PandasToArrowConversion"):
        log.warning("PySpark's conversion to Arrow has moved: the state step's headers go out as Python lists")
        return False
    if not getattr(factory, "passes_arrow_lists", False):
        types._create_converter_from_pandas = _passing_arrow_lists(factory)
    _installed = True
    return True


def arrow_lists_pass() -> bool:
    return _installed
