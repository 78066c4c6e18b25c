"""Request dialects: each decodes Kafka records of one input topic into normalized request rows.

Only the native dialect exists so far; Karafka, ETF1 and Sky will register here and be
chosen per input topic.
"""

from . import native
from .common import NORMALIZED_COLUMNS, DecodeSettings

DIALECTS = {"native": native.decode}

__all__ = ["DIALECTS", "NORMALIZED_COLUMNS", "DecodeSettings"]
