"""Best-fit decreasing packing: every token exactly once, no row too long, positions restart."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from expert_cli.data.packing import best_fit_decreasing, pack_table


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
