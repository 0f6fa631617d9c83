"""Packed rows are contamination-free: each example's logits equal those of the example alone.

transformers builds the block-diagonal mask from restarting `position_ids` when no attention
mask and no cache are given (sdpa, eager); this checks it end to end with the collator.
"""

from __future__ import annotations

import pytest
import torch

from expert_cli.data.collate import PackedCollator

LENGTHS = [7, 12, 5, 9, 3]
ROWS = [[0, 1], [2, 3, 4]]  # examples per packed row; row 0 is shorter (gets padding)


def packed_rows(examples: list[list[int]]) -> list[dict]:
    rows = []
    for members in ROWS:
        ids = [t for i in members for t in examples[i]]
        pos = [p for i in members for p in range(len(examples[i]))]
        rows.append({"input_ids": ids, "labels": ids, "position_ids": pos})
    return rows


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("flatten", [False, True])
def test_packed_logits_equal_unpacked(tiny_model_dir, attn: str, flatten: bool) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn,
                                                 dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    examples = [torch.randint(10, 3000, (n,), generator=gen).tolist() for n in LENGTHS]
    batch = PackedCollator(pad_token_id=0, flatten=flatten)(packed_rows(examples))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       use_cache=False).logits
        alone = [model(input_ids=torch.tensor([ex]), use_cache=False).logits[0]
                 for ex in examples]
    checked = 0
    for r, members in enumerate(ROWS):
        offset = 0 if not flatten or r == 0 else sum(LENGTHS[i] for i in ROWS[0])
        row = 0 if flatten else r
        for i in members:
            got = logits[row, offset: offset + LENGTHS[i]]
            torch.testing.assert_close(got, alone[i], atol=1e-4, rtol=1e-4)
            offset += LENGTHS[i]
            checked += 1
    assert checked == len(LENGTHS)


def test_without_restarting_positions_examples_do_mix(tiny_model_dir) -> None:
    """The check above can fail: the same packed row with plain positions differs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa",
                                                 dtype=torch.float32).eval()
    first, second = [11, 12, 13, 14], [21, 22, 23]
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([first + second]), use_cache=False).logits[0]
        alone = model(input_ids=torch.tensor([second]), use_cache=False).logits[0]
    assert not torch.allclose(packed[4:], alone, atol=1e-4)
