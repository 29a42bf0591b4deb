"""One spelling of a privacy budget everywhere.

A *value* is a float (``math.inf`` for the non-private reference); a *label* is the wildcard and path spelling
(``eps4``, ``eps0.5``, ``epsinf``). Records and tables may hold older spellings (``4``, ``"4.0"``, ``"inf"``,
``None``); :func:`epsilon_value` reads each of them. Standard library only: the Snakefile reads it.
"""

from __future__ import annotations

import math

NONPRIVATE_LABEL = "epsinf"
# How a record (JSON, which has no infinity) spells the non-private budget; epsilon_value reads it back.
NONPRIVATE_RECORDED = "inf"


def eps_label(epsilon) -> str:
    """One canonical spelling per epsilon: 4 and 4.0 are both 'eps4'; the non-private reference is 'epsinf'."""
    value = epsilon_value(epsilon)
    if math.isinf(value):
        return NONPRIVATE_LABEL
    return f"eps{int(value)}" if value.is_integer() else f"eps{value:g}"


def epsilon_value(value) -> float:
    """A budget in any spelling it is recorded in ('eps4', '4.0', 4, 'inf', 'None', None) as a float; anything
    that is not a finite number (the non-private runs) is infinity."""
    if isinstance(value, str) and value.startswith("eps"):
        value = value.removeprefix("eps")
    try:
        eps = float(value)
    except (TypeError, ValueError):
        return math.inf
    return eps if math.isfinite(eps) else math.inf


def epsilon_column_value(value) -> float:
    """A budget as a table column holds it: a float, infinity for the non-private reference ('inf'), NaN where
    nothing was recorded (None), so that `== 4`, sorting and `isna` mean what they say."""
    return math.nan if value is None else epsilon_value(value)


def epsilon_of_label(label: str) -> float | None:
    """A path's budget label as the value a fine-tune is given: None for the non-private reference."""
    value = epsilon_value(label)
    return None if math.isinf(value) else value
