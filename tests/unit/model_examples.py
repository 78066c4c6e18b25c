"""How many examples the model tests (hypothesis property tests against the reference model) run.

A property test that mutant tests stand for runs a count named next to it: the most examples its derandomized mutant
tests needed before failing, times a margin of at least 3, so that a plain (random) run catches each broken rule
too, not just the derandomized one; never more than before the counts were measured. The mutant tests run that same
count, unscaled, so a mutant red there is red at the count every plain run uses. Re-measure when a generator, a
count or a mutant test's inner function changes: hypothesis seeds a derandomized run from the function's source
(decorators of a nested function included), and below 500 examples its sequence depends on the count as well.

KAFKA_SCHEDULER_MODEL_EXAMPLES_SCALE (a number, default 1) multiplies the property tests' counts for a deeper run,
e.g. ``KAFKA_SCHEDULER_MODEL_EXAMPLES_SCALE=5 make test-unit`` after a change to the rules.
"""

from __future__ import annotations

import math
import os

SCALE_VARIABLE = "KAFKA_SCHEDULER_MODEL_EXAMPLES_SCALE"


def _scale() -> float:
    text = os.environ.get(SCALE_VARIABLE, "").strip() or "1"
    try:
        scale = float(text)
    except ValueError:
        raise ValueError(f"{SCALE_VARIABLE}={text!r}: expected a number, e.g. 1 or 2.5") from None
    if not scale > 0 or math.isinf(scale):
        raise ValueError(f"{SCALE_VARIABLE}={text!r}: expected a number above 0")
    return scale


SCALE = _scale()


def scaled(examples: int) -> int:
    """A property test's count times the scale (at least one example)."""
    return max(1, math.ceil(examples * SCALE))
