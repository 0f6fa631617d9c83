"""The Trainer's walks over every module, taken once per run instead of four times per step.

Each optimizer step the Trainer's loop walks the whole module tree of the model four times:
`model.train()` at every micro-batch (setting a flag that is already set), its FLOP estimate
(`num_parameters(exclude_embeddings=True)`, which lists every module and parameter), the
gradient clipping's `model.parameters()` and `model.zero_grad()`. Qwen3-0.6B with LoRA on all
linear layers has 2,389 modules and 703 parameters, whatever the width, so this host work
is the same for a tiny model on a CPU as for the real one on a GPU: 26 ms per step on this
project's 2-core machine, time in which a launch-bound GPU step waits for its kernels
(docs/PERFORMANCE.md, "Host time per step"; scripts/bench_step_host.py).

`StepWalks` lists the modules and parameters once, when the loop's first micro-batch arrives
(after accelerate has wrapped the model), and answers those calls from the lists:

- `train(mode)` returns at once when every listed module already is in `mode`, and runs
  torch's own walk otherwise (after an evaluation, for one), and always where a module's
  class does more in `train` than set the flag (peft's DoRA layers clear a cache there);
- `zero_grad()` sets each listed parameter's gradient to None, as torch's does;
- the parameter list serves the clipping and the FLOP estimate.

The lists hold while the model's modules and parameters are the ones it trained with; nothing
in a training run adds or replaces one between steps. `release()` puts the model's own
methods back when training ends.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

# the methods this module answers for on the model object the loop calls
_ANSWERED = ("train", "zero_grad")
# `train` methods that do nothing but set the flag when the mode does not change
_PLAIN_TRAIN = {
    torch.nn.Module.train,
    PreTrainedModel.train,
    torch.nn.parallel.DistributedDataParallel.train,
}


class StepWalks:
    """The loop's model, its modules and parameters listed once (see the module's text)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.modules = list(model.modules())
        self.parameters = list(model.parameters())
        self._flop_parameters: int | None = None
        self._plain = all(type(m).train in _PLAIN_TRAIN for m in self.modules)
        for name in _ANSWERED:
            model.__dict__[name] = getattr(self, name)

    def train(self, mode: bool = True) -> torch.nn.Module:
        """`model.train(mode)`: nothing to do when every module is in that mode already."""
        if self._plain and isinstance(mode, bool) and all(m.training is mode for m in self.modules):
            return self.model
        return type(self.model).train(self.model, mode)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """`model.zero_grad()` over the listed parameters."""
        if not set_to_none or type(self.model).zero_grad is not torch.nn.Module.zero_grad:
            type(self.model).zero_grad(self.model, set_to_none=set_to_none)
            return
        for p in self.parameters:
            if p.grad is not None:
                p.grad = None

    def flop_parameters(self, model: Any) -> int:
        """`model.num_parameters(exclude_embeddings=True)`, counted at the first call."""
        if self._flop_parameters is None:
            self._flop_parameters = int(model.num_parameters(exclude_embeddings=True))
        return self._flop_parameters

    def release(self) -> None:
        """The model's own `train` and `zero_grad` again."""
        for name in _ANSWERED:
            self.model.__dict__.pop(name, None)
