"""Batches of packed rows for the Trainer, with no padding waste and no attention mask.

`position_ids` restart at 0 at every example. With `boundaries` on (the varlen kernels:
flash-attention 4/2, torch_varlen) the batch also carries where every example starts, laid end
to end over all rows (`cu_seq_lens_q/k`, int32) and the longest example (`max_length_q/k`),
computed here on the CPU so the step never has to find them on the GPU. Without it, and with
no attention mask and no KV cache, transformers builds the block-diagonal mask from the
restarting positions (sdpa, eager, flex). With `loss_positions` on (the fused loss) the batch
also carries the flat positions whose next token is trained, so the loss runs the LM head on
those alone, with their count known on the host. Tensors are plain CPU tensors; the
DataLoader pins them when `pin_memory` is on. `CountingCollator` adds what the throughput
meter counts of each batch (tokens, examples, trained tokens, attention's work).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import datasets
import numpy as np
import torch

from expert_cli.data.formatting import IGNORE
from expert_cli.data.packing import LENGTH_COLUMN

KEYS = ("input_ids", "labels", "position_ids")
# the batch key, and the fused loss's argument, of the positions whose next token is trained
LOSS_POSITIONS = "loss_positions"


def sequence_boundaries(position_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Cumulative starts (with the total at the end) of the runs in a flat position array
    where positions restart at 0, and the longest run."""
    starts = np.flatnonzero(position_ids == 0)
    if len(starts) == 0 or starts[0] != 0:
        starts = np.concatenate([[0], starts])
    cu = np.append(starts, len(position_ids)).astype(np.int32)
    return cu, int(np.diff(cu).max())


def trained_positions(labels: np.ndarray) -> np.ndarray:
    """Flat indices into [B, L] `labels` of the positions whose next token in the row is
    trained: the tokens a causal LM's loss (labels shifted left by one) reads, in order."""
    trained = np.zeros(labels.shape, dtype=bool)
    trained[:, :-1] = labels[:, 1:] != IGNORE
    return np.flatnonzero(trained)


class PackedCollator:
    """Collate packed rows (`input_ids`, `labels`, `position_ids`) into [B, L] int64 tensors.

    L is the longest row (rounded up to `pad_to_multiple_of`); padding uses `pad_token_id`,
    label -100, and positions 0, 1, ... so the padding forms its own segment and never joins
    the last example. `loss_positions`: add `trained_positions` of the labels (int64).
    """

    def __init__(
        self,
        pad_token_id: int,
        boundaries: bool = False,
        pad_to_multiple_of: int | None = None,
        loss_positions: bool = False,
    ) -> None:
        self.pad_token_id = pad_token_id
        self.boundaries = boundaries
        self.pad_to_multiple_of = pad_to_multiple_of
        self.loss_positions = loss_positions

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if not features:
            raise ValueError("PackedCollator got an empty batch")
        rows = {k: [np.asarray(f[k], dtype=np.int64) for f in features] for k in KEYS}
        width = max(len(r) for r in rows["input_ids"])
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            width = (width + m - 1) // m * m
        batch = len(features)
        out = {
            "input_ids": np.full((batch, width), self.pad_token_id, dtype=np.int64),
            "labels": np.full((batch, width), IGNORE, dtype=np.int64),
            "position_ids": np.tile(np.arange(width, dtype=np.int64), (batch, 1)),
        }
        for i in range(batch):
            n = len(rows["input_ids"][i])
            for k in KEYS:
                out[k][i, :n] = rows[k][i]
            out["position_ids"][i, n:] -= n
        result: dict[str, Any] = {k: torch.from_numpy(v) for k, v in out.items()}
        if self.boundaries:
            cu, longest = sequence_boundaries(out["position_ids"].reshape(-1))
            cu_tensor = torch.from_numpy(cu)
            result.update(
                cu_seq_lens_q=cu_tensor,
                cu_seq_lens_k=cu_tensor,
                max_length_q=longest,
                max_length_k=longest,
            )
        if self.loss_positions:
            result[LOSS_POSITIONS] = torch.from_numpy(trained_positions(out["labels"]))
        return result


def filled_to(rows: datasets.Dataset, multiple: int) -> datasets.Dataset:
    """`rows` with rows of one untrained token after them, up to a multiple of `multiple`
    rows. Under several processes accelerate fills every process's last evaluation batch with
    rows from the split's start, which counted again in eval_loss (the Trainer's own average
    drops them, but the loss here is one number per batch); rows with nothing trained count
    nothing."""
    short = -len(rows) % max(1, multiple)
    if short == 0:
        return rows
    blank = {"input_ids": [[0]], "labels": [[IGNORE]], "position_ids": [[0]], LENGTH_COLUMN: [1]}
    fill = datasets.Dataset.from_dict(
        {k: v * short for k, v in blank.items()}, features=rows.features
    )
    filled = datasets.concatenate_datasets([rows.with_format(None), fill])
    kind = rows.format  # as `rows` was read, its format's own arguments too
    return filled.with_format(
        kind["type"], kind["columns"], kind["output_all_columns"], **kind["format_kwargs"]
    )


# Key the counting collator adds to each batch; removed before the model sees the batch.
COUNTS_KEY = "expert_cli_counts"
# an evaluation row's task, by its index in the cache's order (train/task_evals.py), and the
# key the counting collator gives a batch of one task's rows (-1: rows of several)
TASK_COLUMN = "task"
TASK_KEY = "expert_cli_task"


def _example_lengths(row: dict[str, Any]) -> np.ndarray:
    """Lengths of the examples packed in a row (position_ids restart at 0 at each one)."""
    if "position_ids" not in row:
        return np.array([len(row["input_ids"])], dtype=np.int64)
    starts = np.flatnonzero(np.asarray(row["position_ids"]) == 0)
    return np.diff(starts, append=len(row["input_ids"])).astype(np.int64)


class CountingCollator:
    """Wraps the packed collator; adds (real tokens, examples, trained tokens, attended) to
    the batch.

    Counted on the unpadded rows: tokens = row lengths, examples = position_ids restarts,
    trained tokens = labels that are not -100, attended = the sum over examples of length**2
    (each token attends within its own example; the FLOPs count needs it).
    """

    def __init__(self, inner: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.inner = inner

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        tokens = samples = trained = attended = 0
        for r in rows:
            lengths = _example_lengths(r)
            tokens += len(r["input_ids"])
            samples += len(lengths)
            attended += int((lengths * lengths).sum())
            trained += int((np.asarray(r["labels"]) != IGNORE).sum())
        batch = dict(self.inner(rows))
        batch[COUNTS_KEY] = (tokens, samples, trained, attended)
        if rows and TASK_COLUMN in rows[0]:
            tasks = {int(r[TASK_COLUMN]) for r in rows}
            batch[TASK_KEY] = tasks.pop() if len(tasks) == 1 else -1
        return batch
