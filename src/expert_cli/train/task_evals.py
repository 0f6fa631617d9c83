"""An evaluation's loss over the whole split, and a multi_task expert's task by task. The
build packs each task's evaluation examples apart and records its rows in order
(data/build.py, stats `eval.tasks`); here each task's rows are filled with rows of nothing
trained up to a whole number of evaluation batches on every process, so no batch holds two
tasks' rows, and each batch's loss and token accuracy are counted to its task (named as the
Trainer names a dict of evaluation datasets' metrics, `eval_<task>_loss`). The split's
eval_loss is unchanged: the same rows, the same sum."""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import torch

from expert_cli.data.collate import TASK_COLUMN, filled_to
from expert_cli.train.token_accuracy import UNCOUNTED, AccuracyTally


def eval_task_names(stats: dict[str, Any], rows: int) -> list[str]:
    """The tasks of the cache's evaluation split in its order, where the build recorded them
    and their rows add up to the split's; none otherwise (one task, an earlier cache)."""
    found = (stats.get("eval") or {}).get("tasks")
    if not isinstance(found, list) or len(found) < 2:
        return []
    names = [t.get("task") for t in found if isinstance(t, dict)]
    counts = [t.get("rows") for t in found if isinstance(t, dict)]
    typed = all(isinstance(n, str) for n in names) and all(isinstance(c, int) for c in counts)
    if not typed or len(names) != len(found) or sum(counts) != rows:
        return []
    return names


def evaluated_alone(stats: dict[str, Any]) -> list[str]:
    """The one task the cache's evaluation split holds, where it holds one (the others too
    small to hold one out, or all dropped): its loss is the split's."""
    found = (stats.get("eval") or {}).get("tasks")
    names = [t.get("task") for t in found if isinstance(t, dict)] if isinstance(found, list) else []
    return names if len(names) == 1 else []


def by_task(rows: datasets.Dataset, stats: dict[str, Any], multiple: int) -> datasets.Dataset:
    """The evaluation rows with their task's index in TASK_COLUMN, each task's block filled to
    a multiple of `multiple` rows (processes x evaluation batch)."""
    counts = [t["rows"] for t in stats["eval"]["tasks"]]
    starts = np.cumsum([0, *counts])
    blocks = []
    for index, (lo, hi) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        block = filled_to(rows.select(range(int(lo), int(hi))), multiple).with_format(None)
        blocks.append(block.add_column(TASK_COLUMN, [index] * len(block)))
    joined = datasets.concatenate_datasets(blocks)
    kind = rows.format  # as `rows` was read, its format's own arguments too
    columns = None if kind["columns"] is None else [*kind["columns"], TASK_COLUMN]
    return joined.with_format(
        kind["type"], columns, kind["output_all_columns"], **kind["format_kwargs"]
    )


Tally = list[tuple[torch.Tensor, torch.Tensor]]  # each batch's (loss, trained tokens)


def split_loss(tally: Tally, accelerator: Any, args: Any) -> float | None:
    """Summed loss over trained tokens from each batch's (loss, trained tokens); None where
    the Trainer's own average must stand (no counts, or counts kept per process).

    Each batch's loss is its sum divided by the batch's trained tokens over all processes,
    times the process count, so the mean over processes of loss x count summed over batches
    is the split's summed loss (no row is repeated: `filled_to`)."""
    spread = args.world_size > 1
    if not tally or (spread and not args.average_tokens_across_devices):
        return None
    summed, count = _sums(tally, accelerator.device)
    if count.item() <= 0:
        return None
    if spread:
        summed = accelerator.gather(summed.reshape(1)).mean()
    return (summed / count).item()


def _sums(tally: Tally, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss x trained tokens, trained tokens) summed over `tally`'s batches. A batch with no
    trained token has a loss of 0/0 and counts nothing; a NaN loss of a batch that trains
    tokens is the model's (diverged, or fp16 overflow): it stays NaN (it was zeroed, and an
    eval loss of 0 read as the best checkpoint)."""
    if not tally:
        return torch.zeros((), device=device), torch.zeros((), device=device)
    count = torch.stack([c for _, c in tally]).sum()
    summed = torch.stack([torch.where(c > 0, loss * c, 0.0) for loss, c in tally]).sum()
    return summed, count


class TaskTally:
    """Each task's batches (loss, trained tokens) and token accuracy over an evaluation,
    summed over processes at the end."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.batches: list[Tally] = [[] for _ in names]
        self.hits = [AccuracyTally() for _ in names]
        self.unplaced = False  # a batch of no task, or of several: no per-task figures

    def add(self, task: int | None, counted: Any, found: Any) -> None:
        """One batch: its task, its (loss, trained tokens over the processes) where the loss
        was counted, and its `batch_hits` for the token accuracy (UNCOUNTED: none asked)."""
        if task is None or not 0 <= task < len(self.names):
            self.unplaced = True
            return
        if counted is not None:
            self.batches[task].append(counted)
        if found is not UNCOUNTED:
            self.hits[task].add(found)

    def metrics(self, accelerator: Any, spread: bool, prefix: str) -> dict[str, float]:
        """`<prefix>_<task>_loss` and `<prefix>_<task>_token_accuracy` of every task; every
        process takes part in the sums, whatever it counted."""
        device = accelerator.device
        rows = [torch.stack(_sums(b, device)).float().to(device) for b in self.batches]
        flag = torch.tensor([float(self.unplaced), 0.0], device=device)
        summed = torch.stack([*rows, flag])  # [tasks + 1, 2]
        if spread:  # each process's loss x count adds to the split's sum once over processes
            every = accelerator.gather(summed.unsqueeze(0)).reshape(-1, *summed.shape)
            summed = torch.stack([every[:, :, 0].mean(0), every[0, :, 1]], dim=-1)
        accuracies = [h.accuracy(accelerator, spread) for h in self.hits]
        *sums, (unplaced, _) = summed.tolist()
        if unplaced > 0:
            return {}
        out: dict[str, float] = {}
        for name, (loss, count), accuracy in zip(self.names, sums, accuracies, strict=True):
            if count > 0:
                out[f"{prefix}_{name}_loss"] = loss / count
                if accuracy is not None and not np.isnan(loss):
                    out[f"{prefix}_{name}_token_accuracy"] = accuracy
        return out


def task_results(logs: dict[str, Any], prefix: str = "eval") -> dict[str, dict[str, float]]:
    """Each task's loss and token accuracy among an evaluation's logged metrics, by task."""
    out: dict[str, dict[str, float]] = {}
    for key, value in logs.items():
        head, tail = f"{prefix}_", "_loss"
        if key.startswith(head) and key.endswith(tail) and key != f"{prefix}{tail}":
            name = key[len(head) : -len(tail)]
            out[name] = {"eval_loss": value}
            accuracy = logs.get(f"{prefix}_{name}_token_accuracy")
            if accuracy is not None:
                out[name]["token_accuracy"] = accuracy
    return out
