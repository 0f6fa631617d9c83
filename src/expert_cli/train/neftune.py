"""NEFTune (noisy embeddings for fine-tuning) on packed rows.

While training, each input embedding gets uniform noise within alpha / sqrt(L d), d the
hidden size and L the length of the token's own example, as NEFTune's authors scale it.
transformers' hook takes L from the batch's shape: on a packed row of 2,048 tokens holding
examples of 200, that is noise sqrt(2048 / 200) = 3.2 times too small, and on one flattened
row of a whole batch smaller still. Here L comes from the position ids, which restart at 0 at
each example (the packed rows' own boundaries); without them, from the row's length.
Nothing is drawn in evaluation or generation (the module is not training then), and no
value is read back to the host.
"""

from __future__ import annotations

from typing import Any

import torch


def example_lengths(positions: torch.Tensor) -> torch.Tensor:
    """For each token of `positions` [B, T] (restarting at 0 at each example), the length
    of its example, without reading anything back to the host."""
    rows, width = positions.shape
    segment = (positions == 0).long().cumsum(-1)  # 1.. within a row (0 before a first start)
    ids = (segment + torch.arange(rows, device=positions.device)[:, None] * (width + 1)).flatten()
    counts = torch.zeros(rows * (width + 1), dtype=torch.long, device=positions.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))
    return counts[ids].view(rows, width)


class Neftune:
    """The hooks that add the noise to `model`'s input embeddings; `remove` takes them off."""

    def __init__(self, model: Any, alpha: float) -> None:
        self.alpha = alpha
        self.positions: torch.Tensor | None = None
        embeddings = _input_embeddings(model)
        self.handles = [
            model.register_forward_pre_hook(self._seen, with_kwargs=True),
            embeddings.register_forward_hook(self._noised),
        ]

    def _seen(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.positions = kwargs.get("position_ids")

    def _noised(self, module: Any, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        if not module.training:
            return output
        shape = output.shape[:-1]
        positions = self.positions
        if positions is not None and positions.shape == shape:
            lengths = example_lengths(positions).float()
        else:  # no boundaries given: the row is one example
            lengths = torch.full(shape, shape[-1], dtype=torch.float32, device=output.device)
        scale = torch.sqrt(lengths * output.shape[-1])  # sqrt(L d), in fp32
        bound = (self.alpha / scale).to(output.dtype)
        noise = torch.empty_like(output).uniform_(-1.0, 1.0) * bound.unsqueeze(-1)
        return output + noise

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _input_embeddings(model: Any) -> Any:
    """The embedding module of a model, through peft's wrapper and DDP's."""
    inner = getattr(model, "module", model)  # DDP
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return base.get_input_embeddings()
