"""Validation examples that are also training examples, counted before anything is tokenized;
and held-out examples (`evaluate`'s test split) found among a token cache's training examples.

Datasets from the hub often hold the same example more than once, and nothing here removes
duplicates (a repeat may be meant: a task weight repeats examples on purpose). A validation
example held out of such data, or given in a validation file copied from the training one, is
then trained on: its eval_loss measures what the adapter memorized, and a best checkpoint
chosen by it is chosen by that. `shared_rows` counts them, comparing every column the two
splits share as text, in Arrow batches (no row is turned into a Python object), so the build
can say so.
"""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BATCH_ROWS = 100_000
SEPARATOR = "\x1f"  # between a row's columns (the unit separator, which text does not hold)


def _joined(table: pa.Table, columns: list[str]) -> pa.Array:
    """Each row's columns as one text (null as empty)."""
    parts = [pc.fill_null(pc.cast(table.column(c), pa.large_string()), "") for c in columns]
    joined = (
        pc.binary_join_element_wise(*parts, pa.scalar(SEPARATOR, pa.large_string()))
        if len(parts) > 1
        else parts[0]
    )
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def shared_rows(train: datasets.Dataset, held: datasets.Dataset | None) -> int:
    """How many rows of `held` equal a row of `train` in every column they share."""
    if held is None or len(held) == 0 or len(train) == 0:
        return 0
    columns = [c for c in held.column_names if c in train.column_names]
    if not columns:
        return 0
    wanted = _joined(held.with_format("arrow")[:], columns)
    found = [
        pc.filter(joined, pc.is_in(joined, value_set=wanted))
        for batch in train.with_format("arrow").iter(batch_size=BATCH_ROWS)
        if len(joined := _joined(batch, columns))
    ]
    seen = pa.concat_arrays(found) if found else pa.array([], pa.large_string())
    return int(pc.sum(pc.is_in(wanted, value_set=pc.unique(seen))).as_py() or 0)


def shared_note(train: datasets.Dataset, held: datasets.Dataset | None) -> str | None:
    """The build's note on validation examples that are training examples too, or None."""
    n = shared_rows(train, held)
    if not n or held is None:
        return None
    return (
        f"{n:,} of the {len(held):,} validation examples are training examples too (the same "
        "text): eval_loss on them measures what the adapter memorized; remove the repeats "
        "from the data"
    )


# packed examples compared by their token ids: a 64-bit key of each, from its length and its ids
# weighted by position (splitmix64 of the position: two equal examples always share a key, two
# different ones with a chance of about n*m / 2**64)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
KEY_BATCH_TOKENS = 1 << 22  # tokens keyed at once (a few uint64 arrays of 32 MiB)


def _position_weights(pos: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # arithmetic modulo 2**64
        z = pos.astype(np.uint64) + GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def example_keys(rows: datasets.Dataset) -> np.ndarray:
    """A 64-bit key of each example packed in `rows` (its positions restart at 0), sorted;
    read a batch of rows at a time (no example spans two rows)."""
    keys = []
    chunks = rows.data.column("position_ids").chunks
    longest = max((pc.max(c.value_lengths()).as_py() or 1 for c in chunks), default=1)
    size = max(1, KEY_BATCH_TOKENS // longest)  # rows keyed at once: a few temporaries of this
    for batch in rows.with_format("arrow").iter(batch_size=size):
        ids = pc.list_flatten(batch.column("input_ids")).to_numpy(zero_copy_only=False)
        pos = pc.list_flatten(batch.column("position_ids")).to_numpy(zero_copy_only=False)
        if not len(ids):
            continue
        starts = np.flatnonzero(pos == 0)
        with np.errstate(over="ignore"):  # sums modulo 2**64
            summed = np.add.reduceat(ids.astype(np.uint64) * _position_weights(pos), starts)
            lengths = np.diff(np.append(starts, len(ids))).astype(np.uint64)
            keys.append(summed + lengths * GOLDEN)
    return np.sort(np.concatenate(keys)) if keys else np.empty(0, np.uint64)


def shared_with(keys: np.ndarray, held: datasets.Dataset) -> int:
    """How many examples packed in `held` have one of `keys` (`example_keys` of a split):
    are, token for token, examples of that split."""
    wanted = example_keys(held)
    if not len(wanted) or not len(keys):
        return 0
    return int(np.isin(wanted, keys).sum())
