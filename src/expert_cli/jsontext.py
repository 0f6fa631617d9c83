"""JSON numbers as expert-cli reads them from users' files and options.

Python refuses to turn a string of more than 4,300 digits into an int (a guard against slow
conversions), and `json` raises that ValueError from inside the parser, so a data row or a
`--set` value holding such a number ended in a traceback. Read as a float instead, it is
infinity: the row's other fields are still read, and a field that needs a number is refused
by the same checks as `1e400`, naming its place. And what HiveLLM's loader (serde_json) refuses
or reads otherwise than Python's json: NaN and Infinity, `-0` as a whole number.
"""

from __future__ import annotations

import math
import sys
from typing import Any


def json_int(text: str) -> int | float:
    """`parse_int` for `json`: an int, or for one past Python's digit limit (4,300 unless
    PYTHONINTMAXSTRDIGITS says otherwise; 0 is none) a float (infinity), never its
    ValueError."""
    limit = sys.get_int_max_str_digits()
    return int(text) if not limit or len(text.lstrip("-")) <= limit else float(text)


# HiveLLM's loader reads a manifest with serde_json: what it refuses that Python's json reads
class NotJson(ValueError):
    """NaN or Infinity in a manifest's text: Python's json reads them, no JSON parser does."""


def no_constant(name: str) -> Any:
    raise NotJson(name)


def serde_int(text: str) -> int | float:
    """A whole number as serde_json reads it: `-0` is a decimal there (refused where a
    whole number is read)."""
    return -0.0 if text == "-0" else json_int(text)


def finite_number(value: Any) -> float | None:
    """A finite number from a file the run wrote, else None (a hand-edited or damaged file may
    hold strings, true/false, NaN, 1e400 or an integer of 400 digits where a number goes)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)  # an integer of 400 digits is no float
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def number_pairs(records: list[Any], first: str, second: str) -> list[tuple[float, float]]:
    """(records[first], records[second]) of each record (a dict) where both are finite
    numbers (finite_number): what metrics.json's windows or evaluations hold, read as pairs."""
    return [
        (a, b)
        for r in records
        if isinstance(r, dict)
        and (a := finite_number(r.get(first))) is not None
        and (b := finite_number(r.get(second))) is not None
    ]
