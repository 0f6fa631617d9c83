"""scripts/profile_step.py's timeline: busy time with overlaps merged, and the gaps between
kernels in which the GPU waited (a launch-bound step's signature)."""

from __future__ import annotations

import pytest
from train_helpers import load_script


def _load():
    return load_script("profile_step")


def test_gaps_merges_overlaps_and_measures_the_holes() -> None:
    gaps = _load().gaps
    # two streams overlap in 0-10 and 5-12; a hole of 3, then 15-20; a hole of 10, then 30-31
    got = gaps([(15.0, 20.0), (0.0, 10.0), (5.0, 12.0), (30.0, 31.0), (16.0, 18.0)], top=1)
    assert got["span"] == 31.0
    assert got["busy"] == 12.0 + 5.0 + 1.0
    assert got["idle"] == 13.0 and got["gaps"] == 2 and got["longest"] == [10.0]
    assert got["idle_share"] == pytest.approx(13.0 / 31.0)


def test_gaps_of_nothing_or_back_to_back_kernels() -> None:
    gaps = _load().gaps
    assert gaps([])["span"] == 0.0 and gaps([])["idle_share"] == 0.0
    touching = gaps([(0.0, 1.0), (1.0, 2.0), (2.0, 5.0)])
    assert touching["idle"] == 0.0 and touching["gaps"] == 0 and touching["busy"] == 5.0
