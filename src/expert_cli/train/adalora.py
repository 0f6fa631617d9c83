"""AdaLoRA's orthogonal regulariser as the run sees it: the peft configurations that carry it,
and the training loss logged without it.

peft adds `orth_reg_weight` x the regulariser to the loss the base model returns, every
forward given labels. That sum is what AdaLoRA trains on; what a person reads as the loss is
the language-model loss, the one eval_loss and every other adapter type log.
"""

from __future__ import annotations

from typing import Any

import torch


def regularised(model: Any, accelerator: Any) -> dict[str, Any]:
    """The peft configurations of `model` that carry AdaLoRA's orthogonal regulariser."""
    configs = getattr(accelerator.unwrap_model(model), "peft_config", None) or {}
    return {name: c for name, c in configs.items() if hasattr(c, "orth_reg_weight")}


def _kept(loss: Any) -> torch.Tensor | None:
    # a copy: peft adds the regulariser to the base model's loss in place, and the Trainer
    # scales the sum in place
    return loss.detach().clone() if torch.is_tensor(loss) and loss.numel() == 1 else None


class LanguageLoss:
    """A micro-batch's language-model loss and the regularised sum peft returned for it,
    kept as tensors (no host sync): the base model's forward is wrapped (peft calls it
    directly, past any hook), and a hook reads the AdaLoRA model's output.

    `logged` scales the loss the Trainer returns for logging (the sum, scaled for processes
    and accumulation as the Trainer scales it) by the language-model loss's share of the sum:
    every scaling the Trainer applies is a factor, so the share carries through it."""

    def __init__(self, tuner: Any) -> None:
        self.language: torch.Tensor | None = None
        self.total: torch.Tensor | None = None
        base = tuner.model
        self._forward = base.forward
        base.forward = self._language_forward
        tuner.register_forward_hook(self._after_regulariser)

    def _language_forward(self, *args: Any, **kwargs: Any) -> Any:
        outputs = self._forward(*args, **kwargs)
        self.language = _kept(getattr(outputs, "loss", None))
        return outputs

    def _after_regulariser(self, module: Any, args: Any, output: Any) -> None:
        self.total = _kept(getattr(output, "loss", None))

    def logged(self, step_loss: torch.Tensor) -> torch.Tensor:
        """`step_loss` with the regulariser's share taken out; as it is where a share cannot
        be told (no losses kept, a sum of 0, or one not finite: a diverged step stays seen)."""
        language, total, self.language, self.total = self.language, self.total, None, None
        if language is None or total is None or step_loss.numel() != 1:
            return step_loss
        whole = torch.isfinite(total) & (total != 0)
        share = language / torch.where(whole, total, torch.ones_like(total))
        return torch.where(whole, step_loss * share.to(step_loss.dtype), step_loss)
