"""PackedCollator: padded [B, L] rows with a separate pad segment, and explicit sequence
boundaries over all rows for the varlen kernels."""

from __future__ import annotations

import torch

from expert_cli.data.collate import PackedCollator

ROWS = [
    {
        "input_ids": [5, 6, 7, 8, 9],
        "labels": [-100, 6, 7, -100, 9],
        "position_ids": [0, 1, 2, 0, 1],
    },
    {"input_ids": [1, 2, 3], "labels": [1, 2, 3], "position_ids": [0, 1, 2]},
]


def test_padded_batch() -> None:
    out = PackedCollator(pad_token_id=0)(ROWS)
    assert set(out) == {"input_ids", "labels", "position_ids"}
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]]
    assert out["labels"].tolist() == [[-100, 6, 7, -100, 9], [1, 2, 3, -100, -100]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 1]]
    assert all(t.dtype == torch.long and not t.is_pinned() for t in out.values())


def test_pad_to_multiple_of() -> None:
    out = PackedCollator(pad_token_id=0, pad_to_multiple_of=4)(ROWS)
    assert out["input_ids"].shape == (2, 8)
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 0, 1, 2, 3, 4]]
    assert out["labels"][0, 5:].tolist() == [-100, -100, -100]


def test_boundaries() -> None:
    out = PackedCollator(pad_token_id=0, boundaries=True)(ROWS)
    # row 0: examples of 3 and 2 tokens; row 1: 3 tokens, then 2 padding tokens (own segment)
    assert out["cu_seq_lens_q"].tolist() == [0, 3, 5, 8, 10]
    assert out["cu_seq_lens_q"].dtype == torch.int32
    assert out["cu_seq_lens_k"] is out["cu_seq_lens_q"]
    assert out["max_length_q"] == out["max_length_k"] == 3
    assert isinstance(out["max_length_q"], int)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]]


def test_boundaries_of_full_rows_and_single_tokens() -> None:
    rows = [
        {"input_ids": [1, 2, 3, 4], "labels": [1, 2, 3, 4], "position_ids": [0, 0, 1, 0]},
        {"input_ids": [5, 6, 7, 8], "labels": [5, 6, 7, 8], "position_ids": [0, 1, 2, 3]},
    ]
    out = PackedCollator(pad_token_id=0, boundaries=True)(rows)
    assert out["cu_seq_lens_q"].tolist() == [0, 1, 3, 4, 8]
    assert out["max_length_q"] == 4


def test_numpy_rows_collate_like_list_rows() -> None:
    """The cache hands out numpy int32 rows; tensors and counts must match list rows."""
    import numpy as np

    from expert_cli.data.collate import COUNTS_KEY, CountingCollator

    as_numpy = [{k: np.asarray(v, dtype=np.int32) for k, v in r.items()} for r in ROWS]
    for boundaries in (False, True):
        collate = CountingCollator(PackedCollator(pad_token_id=0, boundaries=boundaries))
        a, b = collate(ROWS), collate(as_numpy)
        assert a[COUNTS_KEY] == b[COUNTS_KEY] == (8, 3, 6, 3 * 3 + 2 * 2 + 3 * 3)
        assert all(
            torch.equal(a[k], b[k]) and b[k].dtype == torch.long
            for k in ("input_ids", "labels", "position_ids")
        )


def test_an_evaluation_split_is_filled_with_rows_that_train_nothing(tmp_path) -> None:
    """Under several processes accelerate filled every process's last evaluation batch with
    rows from the split's start, and they counted again in eval_loss (2 processes read 8.2670
    where 1 read 8.2678; equal now, measured on gloo). The split is made a multiple of the
    processes' batch with rows of one untrained token, which count nothing."""
    import datasets
    import numpy as np

    from expert_cli.data.collate import filled_to

    column = datasets.Sequence(datasets.Value("int32"))
    features = datasets.Features(
        {"input_ids": column, "labels": column, "position_ids": column},
    )
    features["num_tokens"] = datasets.Value("int32")
    rows = datasets.Dataset.from_dict(
        {
            "input_ids": [[5, 6, 7]] * 9,
            "labels": [[-100, 6, 7]] * 9,
            "position_ids": [[0, 1, 2]] * 9,
            "num_tokens": [3] * 9,
        },
        features=features,
    ).with_format("numpy")
    assert filled_to(rows, 1) is rows and filled_to(rows, 3) is rows
    filled = filled_to(rows, 4)  # 2 processes x 2 rows: 9 -> 12
    assert len(filled) == 12 and filled.format["type"] == "numpy"
    assert filled.features == rows.features
    added = filled[9:]
    assert (np.stack(added["labels"]) == -100).all() and list(added["num_tokens"]) == [1, 1, 1]
    assert (np.stack(filled[:9]["input_ids"]) == np.stack(rows[:]["input_ids"])).all()


def test_loss_positions_are_the_tokens_whose_next_label_is_trained() -> None:
    out = PackedCollator(pad_token_id=0, loss_positions=True)(ROWS)
    # row 0 labels [-100, 6, 7, -100, 9]: positions 0, 1 and 3 predict a trained token; row 1
    # [1, 2, 3, -100, -100] (padded): positions 0 and 1, flat 5 + 0 and 5 + 1; a row's last
    # position predicts nothing
    assert out["loss_positions"].tolist() == [0, 1, 3, 5, 6]
    assert out["loss_positions"].dtype == torch.long
    shifted = torch.nn.functional.pad(out["labels"][:, 1:], (0, 1), value=-100).reshape(-1)
    trained = torch.nonzero(shifted != -100).squeeze(1)
    assert torch.equal(out["loss_positions"], trained)


def test_no_loss_positions_unless_asked_and_none_when_nothing_is_trained() -> None:
    assert "loss_positions" not in PackedCollator(pad_token_id=0)(ROWS)
    blank = [{"input_ids": [4, 5], "labels": [-100, -100], "position_ids": [0, 1]}]
    out = PackedCollator(pad_token_id=0, loss_positions=True, pad_to_multiple_of=8)(blank)
    assert out["loss_positions"].shape == (0,)


def test_a_width_already_a_multiple_is_not_padded_further() -> None:
    rows = [{"input_ids": [1, 2, 3, 4], "labels": [1, 2, 3, 4], "position_ids": [0, 1, 2, 3]}]
    assert PackedCollator(0, pad_to_multiple_of=4)(rows)["input_ids"].shape == (1, 4)
