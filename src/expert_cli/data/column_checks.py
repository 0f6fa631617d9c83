"""A hub or saved dataset's columns checked in Arrow, a chunk at a time: the first row a check
finds (`first_in_chunks`), and text that is not UTF-8 (Arrow keeps a string's bytes as
written, so a dataset generated from a file in another encoding loads, and would stop the
build with a traceback only when that row is read)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc


def first_not_utf8(values: pa.ChunkedArray) -> int | None:
    """The first row whose strings are not valid UTF-8, or None. Arrow keeps a string's bytes
    as written, so a dataset generated from a file in another encoding loads, and would fail
    with a traceback only when the build reads that row."""
    found = first_in_chunks(
        values, lambda chunk: (row, "") if (row := _first_bad_utf8(chunk)) is not None else None
    )
    return None if found is None else found[0]


def first_in_chunks(
    column: pa.ChunkedArray, find: Callable[[pa.Array], tuple[int, str] | None]
) -> tuple[int, str] | None:
    """(row, problem) of the first row `find` finds in a column's chunks (`find` gives a row
    of its chunk), or None."""
    before = 0
    for chunk in column.chunks:
        found = find(chunk)
        if found is not None:
            return before + found[0], found[1]
        before += len(chunk)
    return None


def _first_bad_utf8(array: pa.Array) -> int | None:
    """The first index of `array` holding a string that is not UTF-8: one full validation per
    string leaf, then halving only where one fails; a list or struct maps its children's
    index back to its own rows."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if _valid(array):
            return None
        low, high = 0, len(array)  # the first bad index is in [low, high)
        while high - low > 1:
            middle = (low + high) // 2
            if _valid(array.slice(low, middle - low)):
                low = middle
            else:
                high = middle
        return low
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = _first_bad_utf8(array.flatten())  # the items of this slice's valid rows
        if inner is None:
            return None
        # the row of each flattened item (a null row's items are not flattened: leave them out)
        parents = pc.list_parent_indices(array)
        parents = parents.filter(array.is_valid().take(parents))
        return int(parents[inner].as_py())
    if pa.types.is_struct(kind):
        found = [i for f in array.flatten() if (i := _first_bad_utf8(f)) is not None]
        return min(found) if found else None
    return None


def _valid(array: pa.Array) -> bool:
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True
