"""Best-fit decreasing packing: every token exactly once, no row too long, positions restart."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from expert_cli.data import packing
from expert_cli.data.packing import (
    HASH_TOKENS,
    MAX_SPREAD,
    best_fit_decreasing,
    pack_table,
    repeated_groups,
)


def examples_table(lengths: list[int]) -> pa.Table:
    """Example i is the tokens [i*1000, i*1000+1, ...] of its length; labels are negated."""
    ids = [list(range(i * 1000, i * 1000 + n)) for i, n in enumerate(lengths)]
    labels = [[-t for t in row] for row in ids]
    return pa.table(
        {
            "input_ids": pa.array(ids, pa.list_(pa.int32())),
            "labels": pa.array(labels, pa.list_(pa.int32())),
        }
    )


def test_best_fit_decreasing_fills_rows_exactly() -> None:
    bins = best_fit_decreasing(np.array([6, 4, 5, 5, 3, 7]), 10)
    assert sorted(sorted(b) for b in bins) == [[0, 1], [2, 3], [4, 5]]


def test_best_fit_picks_the_tightest_bin() -> None:
    # 8 and 6 open two bins (room 2 and 4); 3 goes to the bin with room 4, then 2 to room 2.
    bins = best_fit_decreasing(np.array([8, 6, 3, 2]), 10)
    assert bins == [[0, 3], [1, 2]]


def test_zero_length_items_are_left_out() -> None:
    assert best_fit_decreasing(np.array([0, 3, 0]), 4) == [[1]]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=64), min_size=1, max_size=60),
    capacity=st.integers(min_value=64, max_value=200),
    packing=st.booleans(),
    seed=st.integers(min_value=0, max_value=10),
)
def test_every_token_exactly_once_rows_bounded_positions_restart(
    lengths, capacity, packing, seed
) -> None:
    table, stats = pack_table(examples_table(lengths), capacity, packing, seed)
    rows = table.to_pylist()
    seen: dict[int, list[int]] = {}
    for row in rows:
        ids, labels, pos = row["input_ids"], row["labels"], row["position_ids"]
        assert len(ids) == len(labels) == len(pos) == row["num_tokens"] <= capacity
        assert labels == [-t for t in ids]
        starts = [k for k, p in enumerate(pos) if p == 0]
        assert starts[0] == 0
        for a, b in zip(starts, starts[1:] + [len(ids)], strict=True):
            assert pos[a:b] == list(range(b - a))
            example = ids[a] // 1000
            assert ids[a:b] == list(range(example * 1000, example * 1000 + b - a))
            assert example not in seen
            seen[example] = ids[a:b]
        if not packing:
            assert len(starts) == 1
    assert sorted(seen) == [i for i, n in enumerate(lengths) if n > 0]
    assert all(len(seen[i]) == lengths[i] for i in seen)
    assert stats.tokens == sum(lengths) and stats.rows == len(rows)
    assert stats.capacity == len(rows) * capacity


def test_packing_is_deterministic_and_seeded() -> None:
    table = examples_table([5, 9, 3, 7, 2, 8, 4, 6, 1, 10])
    a, _ = pack_table(table, 12, True, seed=1)
    b, _ = pack_table(table, 12, True, seed=1)
    assert a.equals(b)
    c, _ = pack_table(table, 12, True, seed=2)
    assert sorted(map(tuple, c.column("input_ids").to_pylist())) == sorted(
        map(tuple, a.column("input_ids").to_pylist())
    )
    # the seed orders the rows: another seed, another order (the same rows)
    assert c.column("input_ids").to_pylist() != a.column("input_ids").to_pylist()


def test_efficiency_of_a_perfect_packing() -> None:
    _, stats = pack_table(examples_table([6, 4, 5, 5, 3, 7]), 10, True, seed=0)
    assert (stats.rows, stats.tokens, stats.capacity) == (3, 30, 30)  # every slot used


def test_a_million_examples_pack_quickly() -> None:
    import time

    lengths = np.random.default_rng(0).integers(1, 2048, size=1_000_000)
    start = time.perf_counter()
    bins = best_fit_decreasing(lengths, 4096)
    assert time.perf_counter() - start < 20
    assert sum(len(b) for b in bins) == 1_000_000
    assert lengths.sum() / (len(bins) * 4096) > 0.99


def test_copies_of_an_example_go_into_different_rows() -> None:
    """A task of weight 3 repeats each example: sorted longest first, the copies of an example
    of unique length came one after another and best fit put them into one row (3 of the 4
    rows held one example three times). Each copy now gets a row of its own, as a weight
    means, at no cost in rows here."""
    lengths = [3, 4, 5, 6]
    table = examples_table(lengths)
    weighted = pa.concat_tables([table] * 3)
    packed, stats = pack_table(weighted, 20, True, seed=0)
    for row in packed.column("input_ids").to_pylist():
        starts = [v for v in row if v % 1000 == 0]  # each example's first token
        assert len(starts) == len(set(starts)), row
    assert stats.tokens == 3 * sum(lengths) and stats.rows == 3  # 54 tokens, rows of 20


@pytest.mark.parametrize("at_once", [HASH_TOKENS, 1, 4])
def test_repeated_groups_mark_equal_examples_only(monkeypatch, at_once: int) -> None:
    monkeypatch.setattr(packing, "HASH_TOKENS", at_once)  # hashed in pieces: the same groups
    ids = [[1, 2, 3], [1, 2, 3], [1, 2], [3, 2, 1], [], [1, 2, 3], [7], [7]]
    column = pa.array(ids, pa.list_(pa.int32()))
    groups = repeated_groups(np.asarray(column.values), np.asarray(column.offsets))
    assert groups[0] == groups[1] == groups[5] >= 0 and groups[6] == groups[7] >= 0
    assert groups[0] != groups[6]
    assert groups[2] == groups[3] == groups[4] == -1  # a prefix, the reverse, empty: unique
    # a slice of a larger list column (offsets not starting at 0) reads the same examples
    sliced = column.slice(1, 7)
    again = repeated_groups(np.asarray(sliced.values), np.asarray(sliced.offsets))
    assert (again >= 0).tolist() == (groups[1:] >= 0).tolist()


def test_best_fit_keeps_a_group_apart_and_ignores_minus_one() -> None:
    # without groups the two 5s share a row; with a group they go to the next best bin or a new one
    assert best_fit_decreasing(np.array([5, 5]), 10) == [[0, 1]]
    assert best_fit_decreasing(np.array([5, 5]), 10, np.array([0, 0])) == [[0], [1]]
    assert best_fit_decreasing(np.array([5, 5]), 10, np.array([-1, -1])) == [[0, 1]]
    # 6 and 5 (group 1) open two bins; the second 5 may not join its copy (room 5) and does
    # not fit the other (room 4), so it opens a third; 4 then fills the tightest, room 4
    bins = best_fit_decreasing(np.array([6, 5, 5, 4]), 10, np.array([-1, 1, 1, -1]))
    assert sorted(map(sorted, bins)) == [[0, 3], [1], [2]]


def test_an_example_repeated_past_max_spread_may_share_rows() -> None:
    """Keeping each of thousands of copies (a row the data repeats) apart needed a row per
    copy (8,000 copies of an 8-token row: 8,000 rows at 0.8% fill, 10 s); past MAX_SPREAD
    copies they pack as any examples do."""
    table = examples_table([8])
    many = pa.concat_tables([table] * (MAX_SPREAD + 1))
    column = many.column("input_ids").combine_chunks()
    groups = repeated_groups(np.asarray(column.values), np.asarray(column.offsets))
    assert (groups == -1).all()
    _, stats = pack_table(many, 64, True, seed=0)
    assert stats.rows == math.ceil(8 * (MAX_SPREAD + 1) / 64)
    few = pa.concat_tables([table] * MAX_SPREAD)
    assert pack_table(few, 64, True, seed=0)[1].rows == MAX_SPREAD


def test_two_equal_examples_alone_are_one_group() -> None:
    """A dataset of exactly two identical examples: they share a group (kept in different
    rows), as three would."""
    groups = packing.repeated_groups(np.array([5, 6, 5, 6]), np.array([0, 2, 4]))
    assert groups[0] == groups[1] >= 0
