"""The causal-LM loss without full-vocabulary logits.

The standard path multiplies every hidden state by the vocabulary matrix (151,936 rows for
Qwen3), keeps those logits, and upcasts them to fp32: about 10 GB per copy for 16k tokens. A
linear cross-entropy computes the same loss and gradients a slice of tokens at a time and keeps
only one number per token. Backends: Liger-Kernel's fused linear cross-entropy (`liger`,
Triton, GPU) and `chunked`, this module's own portable version in plain torch (any device; the
CPU tests' reference). cut-cross-entropy was measured too and left out: slower here, and its
default gradient filtering moved the adapter gradients by 22% (docs/PERFORMANCE.md).

`install_fused_loss` rebinds a causal LM's `forward` so that, when labels are given, it runs the
decoder body and returns the loss with no logits; the Trainer, DDP and peft see the same
module. Without labels it is the model's own forward.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from expert_cli.data.formatting import IGNORE

# Logit elements computed at once by the chunked backend (2**28 fp32 values = 1 GiB).
CHUNK_ELEMENTS = 1 << 28


def _chunks(n: int, vocab: int) -> list[tuple[int, int]]:
    size = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (h @ weight.t()).float()


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `hidden @ weight.T` against `targets`, a chunk of tokens at a
    time, in the compute dtype with fp32 softmax; the backward pass recomputes each chunk's
    logits instead of keeping them."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        dtype = _compute_dtype(hidden)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            lse = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            for start, end in _chunks(h.shape[0], w.shape[0]):
                logits = _chunk_logits(h[start:end], w)
                t = targets[start:end]
                chunk_lse = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
                total += ((chunk_lse - picked) * (t != IGNORE)).sum()
                lse[start:end] = chunk_lse
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.dtype = dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any, None]:
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
            for start, end in _chunks(h.shape[0], w.shape[0]):
                t = targets[start:end]
                keep = (t != IGNORE).unsqueeze(1)
                probs = torch.exp(_chunk_logits(h[start:end], w) - lse[start:end, None])
                probs.scatter_add_(1, t.clamp(min=0).unsqueeze(1), -keep.to(probs.dtype))
                dlogits = (probs * keep * grad).to(ctx.dtype)
                if grad_h is not None:
                    grad_h[start:end] = dlogits @ w
                if grad_w is not None:
                    grad_w += dlogits.t().float() @ h[start:end].float()
        return (
            grad_h.to(hidden.dtype) if grad_h is not None else None,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            None,
        )


def summed_linear_cross_entropy(
    backend: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Sum over tokens whose target is not -100 of the cross-entropy of `hidden @ weight.T`.

    hidden: [tokens, hidden_size]; weight: [vocab, hidden_size]; targets: [tokens].
    """
    if backend == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return liger_fused_linear_cross_entropy(
            hidden, weight, targets, ignore_index=IGNORE, reduction="sum"
        )
    if backend == "chunked":
        return ChunkedLinearCrossEntropy.apply(hidden, weight, targets)
    raise ValueError(f"fused_loss: unknown backend {backend!r}")


def causal_lm_loss(
    backend: str,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: Any = None,
) -> torch.Tensor:
    """The loss transformers' causal LMs compute (labels shifted left by one, -100 ignored;
    summed over `num_items_in_batch` when given, else the mean over trained tokens)."""
    targets = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE).reshape(-1)
    flat = hidden.reshape(-1, hidden.shape[-1])
    total = summed_linear_cross_entropy(backend, flat, weight, targets.to(flat.device))
    if num_items_in_batch is None:
        return total / (targets != IGNORE).sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def fused_loss_unsupported(model: Any, targets: Any = ()) -> str | None:
    """Why a causal LM cannot take the fused loss (None when it can): `targets`, the adapter's
    target modules, may name the LM head, whose adapter the fused loss (reading the head's
    weight) would leave out of the loss and untrained."""
    config = getattr(model, "config", None)
    if not (hasattr(model, "lm_head") and hasattr(model, "model")):
        return "the model has no `model` body and `lm_head` to split"
    if not isinstance(targets, str) and any("lm_head" in str(t) for t in targets):
        return "target_modules adapts lm_head, whose adapter it would leave out"
    if getattr(model.lm_head, "bias", None) is not None:
        return "the LM head has a bias"
    for field in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, field, None) not in (None, 1, 1.0):
            return f"the model scales its logits ({field})"
    return None


def fused_forward(self: Any, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
    """A causal LM's forward that, given labels, returns the loss and no logits (every other
    argument goes to the model's body as it came)."""
    if labels is None:
        return self._expert_cli_forward(input_ids=input_ids, **kwargs)
    num_items = kwargs.pop("num_items_in_batch", None)
    kwargs.pop("logits_to_keep", None)
    out = self.model(input_ids=input_ids, **kwargs)
    loss = causal_lm_loss(
        self._expert_cli_loss, out.last_hidden_state, self.lm_head.weight, labels, num_items
    )
    return CausalLMOutputWithPast(loss=loss, past_key_values=out.past_key_values)


def install_fused_loss(model: Any, backend: str) -> None:
    """Rebind `model.forward` (a transformers causal LM, before peft wraps it) to compute the
    loss through `backend` whenever labels are given."""
    if not hasattr(model, "_expert_cli_forward"):
        model._expert_cli_forward = model.forward
    model._expert_cli_loss = backend
    model.forward = MethodType(fused_forward, model)
