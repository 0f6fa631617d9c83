"""Batches of packed rows for the Trainer, with no padding waste and no attention mask.

`position_ids` restart at 0 at every example; with no attention mask and no KV cache,
transformers builds the block-diagonal mask from them (sdpa, eager) or uses them as varlen
boundaries (flash-attention 2). Tensors are plain CPU tensors; the DataLoader pins them when
`pin_memory` is on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from expert_cli.data.formatting import IGNORE

if TYPE_CHECKING:
    import torch


class PackedCollator:
    """Collate packed rows (`input_ids`, `labels`, `position_ids`) into int64 tensors.

    flatten=False: shape [B, L], L = the longest row (rounded up to `pad_to_multiple_of`);
    padding uses `pad_token_id`, label -100, and positions 0, 1, ... so the padding forms its
    own segment and never joins the last example. flatten=True: one row [1, total tokens] with
    no padding at all, for flash-attention's varlen path (which needs batch size 1).
    """

    def __init__(self, pad_token_id: int, flatten: bool = False,
                 pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.flatten = flatten
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        import torch

        if not features:
            raise ValueError("PackedCollator got an empty batch")
        keys = ("input_ids", "labels", "position_ids")
        rows = {k: [torch.as_tensor(f[k], dtype=torch.long) for f in features] for k in keys}
        if self.flatten:
            return {k: torch.cat(v).unsqueeze(0) for k, v in rows.items()}
        width = max(len(r) for r in rows["input_ids"])
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            width = (width + m - 1) // m * m
        batch = len(features)
        out = {
            "input_ids": torch.full((batch, width), self.pad_token_id, dtype=torch.long),
            "labels": torch.full((batch, width), IGNORE, dtype=torch.long),
            "position_ids": torch.arange(width, dtype=torch.long).repeat(batch, 1),
        }
        for i in range(batch):
            n = len(rows["input_ids"][i])
            for k in keys:
                out[k][i, :n] = rows[k][i]
            out["position_ids"][i, n:] -= n
        return out
