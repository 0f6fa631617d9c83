"""Evaluation's token accuracy: the share of trained tokens whose next token the model's most
likely prediction (the LM head's argmax) is, TRL's `mean_token_accuracy` counted over the whole
split. The fused loss's forward counts it with no logits kept (`loss.HITS`); the standard loss's
logits are counted here."""

from __future__ import annotations

from typing import Any

import torch

from expert_cli.data.formatting import IGNORE
from expert_cli.train.loss import HITS

UNCOUNTED = object()  # a batch whose outputs were not asked for: no accuracy to count


def batch_hits(outputs: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(tokens predicted, tokens trained) of one evaluation batch; None where the outputs
    hold neither the fused forward's count nor logits."""
    if not torch.is_tensor(labels):
        return None
    trained = (labels[..., 1:] != IGNORE).sum()
    hits = outputs.get(HITS) if hasattr(outputs, "get") else None
    if hits is None:
        logits = getattr(outputs, "logits", None)
        if not torch.is_tensor(logits) or logits.shape[:-1] != labels.shape:
            return None
        targets = labels[..., 1:].to(logits.device)
        hits = (logits[..., :-1, :].argmax(-1) == targets).sum()
    return hits.detach(), trained.to(hits.device)


class AccuracyTally:
    """Hits and trained tokens of an evaluation's batches, summed over processes at the end."""

    def __init__(self) -> None:
        self.counts: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.missing = False

    def add(self, found: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """One batch's `batch_hits` (None: it could not be counted)."""
        if found is None:
            self.missing = True
        else:
            self.counts.append(found)

    def accuracy(self, accelerator: Any, spread: bool) -> float | None:
        """The split's token accuracy; None where a batch could not be counted, or no token
        was trained. Every process takes part in the sum, whatever it counted (a process
        that left it out would hold the others in the collective for ever)."""
        device = self.counts[0][0].device if self.counts else accelerator.device
        summed = torch.zeros(3, dtype=torch.float64, device=device)  # hits, trained, missing
        for hits, trained in self.counts:
            summed[:2] += torch.stack([hits, trained]).to(device, torch.float64)
        summed[2] = float(self.missing)
        if spread:
            summed = accelerator.reduce(summed, reduction="sum")
        hits, trained, missing = summed.tolist()
        return hits / trained if trained > 0 and not missing else None
