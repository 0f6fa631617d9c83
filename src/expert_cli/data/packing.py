"""Best-fit decreasing packing of tokenized examples into rows of at most `max_seq_length`.

A row holds whole examples one after another; `position_ids` restart at 0 at every example, which
is what lets the model (sdpa/eager without an attention mask, flash-attention varlen) keep each
example's attention inside the example. Packing moves tokens, never drops or repeats them. Rows
are shuffled with a seeded generator, so a build is deterministic.

Examples of the same tokens (a task's `weight` repeats its examples; data may repeat rows) are
kept out of one row, up to MAX_SPREAD copies: sorted longest first, an example's copies (of one
length) came one after another, and best fit put them side by side, so a step trained one
example twice where it meant the copies for two different steps.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# Tokens per row; the Trainer's length-grouped sampler reads it instead of decoding every row.
LENGTH_COLUMN = "num_tokens"
HASH_TOKENS = 1 << 22  # tokens hashed at once when looking for repeated examples
# copies of one example kept in different rows, at most: a task weight's few; more (a row the
# data repeats thousands of times) would each need a row of their own, and each copy a walk
# past the rows holding the others
MAX_SPREAD = 16


@dataclass(frozen=True)
class PackStats:
    """What one packing pass produced."""

    rows: int
    tokens: int
    capacity: int  # rows * max_seq_length


def best_fit_decreasing(
    lengths: np.ndarray, capacity: int, groups: np.ndarray | None = None
) -> list[list[int]]:
    """Bins (lists of indices into `lengths`) of total length <= `capacity`.

    Items are placed longest first, each into the open bin with the least room that still fits
    it; open bins are kept in a sorted list of distinct remaining capacities, so a placement is a
    bisect (fast for millions of items). Zero-length items are left out. Items of one
    `groups` value (-1: none) go into different bins: the next best bin, else a new one.
    """

    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and lengths.max() > capacity:
        raise ValueError(f"an item of length {int(lengths.max())} exceeds capacity {capacity}")
    items = np.flatnonzero(lengths > 0)
    if len(items) == 0:
        return []
    order = items[np.argsort(-lengths[items], kind="stable")]
    smallest = int(lengths[items].min())
    free: list[int] = []  # distinct remaining capacities of open bins, ascending
    at: dict[int, list[int]] = {}  # remaining capacity -> open bins with it
    bins: list[list[int]] = []
    group_of = groups.tolist() if groups is not None else [-1] * len(lengths)
    held: set[tuple[int, int]] = set()  # (bin, group) of the items that have a group
    for item, size in zip(order.tolist(), lengths[order].tolist(), strict=True):
        group = group_of[item]
        if found := _best_bin(free, at, size, group, held):
            room, b = found
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(item)
        if group >= 0:
            held.add((b, group))
        left = room - size
        if left >= smallest:
            if left not in at:
                at[left] = []
                bisect.insort(free, left)
            at[left].append(b)
    return bins


def _best_bin(
    free: list[int], at: dict[int, list[int]], size: int, group: int, held: set[tuple[int, int]]
) -> tuple[int, int] | None:
    """(room, bin) of the open bin with the least room that fits `size` and holds no item of
    `group` (-1: any bin; `held` has each (bin, group) placed), taken out of the open bins;
    None when there is none."""
    for pos in range(bisect.bisect_left(free, size), len(free)):
        room = free[pos]
        bins = at[room]
        for k in range(len(bins) - 1, -1, -1):  # the latest opened first, as before groups
            if group < 0 or (bins[k], group) not in held:
                b = bins.pop(k)
                if not bins:
                    del at[room]
                    del free[pos]
                return room, b
    return None


def repeated_groups(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A group number for each example whose tokens up to MAX_SPREAD - 1 other examples
    repeat exactly, -1 for the rest: a seeded hash of each example's ids (a collision only
    keeps two examples apart), computed HASH_TOKENS at a time so its temporaries stay small."""
    values, offsets = values[offsets[0] : offsets[-1]], offsets - offsets[0]
    lengths = np.diff(offsets)
    groups = np.full(len(lengths), -1, dtype=np.int64)
    filled = np.flatnonzero(lengths > 0)
    if len(filled) < 2:
        return groups
    keys = np.random.default_rng(0).integers(1, 2**63, size=int(lengths.max()), dtype=np.uint64)
    hashes = np.empty(len(filled), dtype=np.uint64)
    ends, begin = offsets[filled + 1], 0
    while begin < len(filled):  # examples whose tokens end within HASH_TOKENS of the first's
        first = int(offsets[filled[begin]])
        end = max(begin + 1, int(np.searchsorted(ends, first + HASH_TOKENS, "right")))
        items = filled[begin:end]
        span = values[first : int(ends[end - 1])].astype(np.uint64) + np.uint64(1)
        starts = offsets[items] - first
        span *= keys[np.arange(len(span), dtype=np.int64) - np.repeat(starts, lengths[items])]
        hashes[begin:end] = np.add.reduceat(span, starts)  # the products wrap: a hash
        begin = end
    hashes ^= lengths[filled].astype(np.uint64)
    _, first_of, inverse, counts = np.unique(
        hashes, return_index=True, return_inverse=True, return_counts=True
    )
    repeated = (counts[inverse] > 1) & (counts[inverse] <= MAX_SPREAD)
    groups[filled[repeated]] = first_of[inverse[repeated]]
    return groups


def pack_table(
    table: pa.Table, max_seq_length: int, packing: bool, seed: int
) -> tuple[pa.Table, PackStats]:
    """Rows of `input_ids`, `labels`, `position_ids`, `num_tokens` from one example per row."""

    ids_col = table.column("input_ids").combine_chunks()
    lab_col = table.column("labels").combine_chunks()
    offsets = np.asarray(ids_col.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    if packing:
        groups = repeated_groups(ids_col.values.to_numpy(), offsets)
        bins = best_fit_decreasing(lengths, max_seq_length, groups)
    else:
        bins = [[int(i)] for i in np.flatnonzero(lengths > 0)]
    perm = np.random.default_rng(seed).permutation(len(bins))
    bins = [bins[i] for i in perm]
    order = np.fromiter(
        (i for b in bins for i in b), dtype=np.int64, count=sum(len(b) for b in bins)
    )
    row_lengths = np.fromiter(
        (int(lengths[b].sum()) for b in bins), dtype=np.int64, count=len(bins)
    )
    ex_lengths = lengths[order]
    ex_first = np.cumsum(ex_lengths) - ex_lengths
    within = np.arange(int(ex_lengths.sum()), dtype=np.int64) - np.repeat(ex_first, ex_lengths)
    gather = within + np.repeat(offsets[order], ex_lengths)
    row_offsets = np.zeros(len(bins) + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=row_offsets[1:])
    out = _table(
        ids_col.values.to_numpy()[gather], _values(lab_col, offsets)[gather], within, row_offsets
    )
    tokens = int(row_lengths.sum())
    return out, PackStats(rows=len(bins), tokens=tokens, capacity=len(bins) * max_seq_length)


def _values(column: pa.ListArray, offsets: np.ndarray) -> np.ndarray:
    """Flat values of a list column laid out with the same offsets as `input_ids`."""

    own = np.asarray(column.offsets, dtype=np.int64)
    if not np.array_equal(own, offsets):
        raise ValueError("labels and input_ids have different lengths")
    return column.values.to_numpy()


def _table(
    ids: np.ndarray, labels: np.ndarray, positions: np.ndarray, row_offsets: np.ndarray
) -> pa.Table:

    offsets = pa.array(row_offsets.astype(np.int32))

    def column(values: np.ndarray) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values.astype(np.int32)))

    return pa.table(
        {
            "input_ids": column(ids),
            "labels": column(labels),
            "position_ids": column(positions),
            LENGTH_COLUMN: pa.array(np.diff(row_offsets).astype(np.int32)),
        }
    )
