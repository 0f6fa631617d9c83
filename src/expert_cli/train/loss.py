"""The causal-LM loss without full-vocabulary logits.

The standard path multiplies every hidden state by the vocabulary matrix (151,936 rows for
Qwen3), keeps those logits, and upcasts them to fp32: about 10 GB per copy for 16k tokens. A
linear cross-entropy computes the same loss and gradients a slice of tokens at a time and keeps
only one number per token. `LinearCrossEntropy` does it with the gradient computed in the
forward pass (no logits recomputed in the backward), each chunk's loss and logit gradient by
Liger-Kernel's Triton cross-entropy kernel (`liger`, GPU) or in plain torch (`chunked`, any
device: the CPU tests' reference). Liger's own fused function is not called: it reads two
values back to the host each step (a wait for the GPU each time) and takes thin slices of
about 128 tokens at a time. cut-cross-entropy was measured too and left out: slower here, and
its default gradient filtering moved the adapter gradients by 22% (docs/PERFORMANCE.md).

Whether a causal LM can take it is train/loss_fit.py's. `install_fused_loss` rebinds a causal
LM's `forward` so that, when labels are given, it runs the decoder body and returns the loss
with no logits; the Trainer, DDP and peft see the same module. Without labels it is the model's
own forward. Given the collator's `loss_positions` (the positions whose next token is trained,
their count known on the host), the LM head runs on those rows alone: a prompt token's logits
add nothing to the loss or the gradients, and the head (151,936 x 1,024 for Qwen3-0.6B) is about
a quarter of the model's matmul work a token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import MethodType
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from expert_cli.data.collate import LOSS_POSITIONS
from expert_cli.data.formatting import IGNORE

# Logit elements computed at once (2**28: 1,766 tokens of Qwen3's vocabulary; 512 MB in bf16,
# and as much again in fp32 for the plain-torch rows). Liger's own function takes about 128 tokens
# at a time for 16k: GEMMs too thin for a GPU's SMs.
CHUNK_ELEMENTS = 1 << 28
# the outputs' KV cache field: `cache` since transformers 5.25 (`past_key_values`, its old
# name, still read and written there, with a deprecation warning on the console)
_FIELDS = CausalLMOutputWithPast.__dataclass_fields__
CACHE_FIELD = "cache" if "cache" in _FIELDS else "past_key_values"
# the outputs' key under which the fused forward gives, in an evaluation, how many trained
# tokens the head's argmax predicts (train/token_accuracy.py reads it)
HITS = "expert_cli_hits"


def _chunks(n: int, vocab: int) -> list[tuple[int, int]]:
    size = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


def _torch_rows(
    logits: torch.Tensor, targets: torch.Tensor, out: torch.Tensor, smoothing: float = 0.0
) -> None:
    """Each row's cross-entropy against `targets` into `out` (0 where the target is -100,
    fp32), the gradient of their sum written over `logits` (softmax minus the target
    distribution, computed in fp32; 0 on ignored rows). With `smoothing` f the target is
    1 - f on the token and f / V on each of the V (torch's `label_smoothing`)."""
    x = logits.float()  # `logits` itself when it is fp32
    keep = (targets != IGNORE).unsqueeze(1)
    picked = targets.clamp(min=0).unsqueeze(1)
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    loss = lse - (1.0 - smoothing) * x.gather(1, picked)
    if smoothing:
        loss -= smoothing * x.mean(dim=-1, keepdim=True)
    out.copy_((loss * keep).squeeze(1))
    x.sub_(lse).exp_()
    x.scatter_add_(1, picked, torch.full_like(lse, smoothing - 1.0))
    if smoothing:
        x.sub_(smoothing / x.shape[1])
    x.mul_(keep)
    if x is not logits:
        logits.copy_(x)


def _liger_rows(
    logits: torch.Tensor, targets: torch.Tensor, out: torch.Tensor, smoothing: float = 0.0
) -> None:
    """`_torch_rows` in one pass of Liger-Kernel's Triton cross-entropy kernel (GPU); an
    ignored row's loss is not written: `out` comes zeroed."""
    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel

    n_cols = logits.shape[1]
    liger_cross_entropy_kernel[(logits.shape[0],)](
        **{**_liger_arguments(logits, targets, out), "label_smoothing": smoothing},
        BLOCK_SIZE=min(LIGER_BLOCK, 1 << (n_cols - 1).bit_length()),  # a power of 2
        num_warps=32,
    )


# the kernel's widest block, as Liger's own functions use it
LIGER_BLOCK = 32_768


def _liger_arguments(logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor) -> dict:
    """The arguments of Liger's cross-entropy kernel (0.8.5's names) for a summed loss with
    its gradient written over `logits`; with `reduction` "sum" the count of trained tokens is
    not read (its "mean" needs it on the host: a sync)."""
    return {
        "X_ptr": logits,
        "X_stride": logits.stride(-2),
        "Y_ptr": targets,
        "Y_stride": targets.stride(-1),
        "weight_ptr": None,
        "loss_ptr": rows,
        "z_loss_ptr": None,
        "loss_stride": rows.stride(-1),
        "token_accuracy_ptr": None,
        "token_accuracy_stride": 0,
        "predicted_tokens_ptr": None,
        "predicted_tokens_stride": 0,
        "n_cols": logits.shape[1],
        "n_non_ignore": 1,
        "sum_non_ignore_weight": 1,
        "weight_sum": 0.0,
        "ignore_index": IGNORE,
        "lse_square_scale": 0.0,
        "label_smoothing": 0.0,
        "reduction": "sum",
        "softcap": None,
        "RETURN_Z_LOSS": False,
        "RETURN_TOKEN_ACCURACY": False,
        "RETURN_PREDICTED_TOKENS": False,
        "HAS_WEIGHT": False,
        "HAS_SOFTCAPPING": False,
        "HAS_GRADIENTS": True,
    }


@functools.cache
def liger_kernel_fits() -> bool:
    """Whether the installed Liger-Kernel's cross-entropy kernel takes the arguments
    `_liger_arguments` gives (named as in 0.8.5); otherwise Liger's own function runs."""
    try:
        from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
    except ImportError:
        return False
    names = set(getattr(liger_cross_entropy_kernel, "arg_names", ()))
    empty = torch.empty(1, 1)
    return set(_liger_arguments(empty, empty[0], empty[0])) | {"BLOCK_SIZE"} == names


class LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `hidden @ weight.T` against `targets`, a chunk of tokens at a
    time: each chunk's logits in the compute dtype, their loss and gradient by `rows` (one
    kernel on a GPU), the input's gradient by one GEMM, all in the forward pass, as Liger's
    fused linear cross-entropy does. Unlike Liger's own function nothing is read back to the
    host (it reads the count of trained tokens in the forward, and compares the backward's
    incoming gradient with 1.0: two waits for the GPU a step); the backward scales the kept
    gradient by the incoming one on the device."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        rows: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None],
        hits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        dtype = _compute_dtype(hidden)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
            losses = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
            for start, end in _chunks(h.shape[0], w.shape[0]):
                logits = h[start:end] @ w.t()
                if hits is not None:  # before `rows` writes the gradient over the logits
                    hits += (logits.argmax(-1) == targets[start:end]).sum()
                rows(logits, targets[start:end].contiguous(), losses[start:end])
                if grad_h is not None:
                    torch.mm(logits, w, out=grad_h[start:end])
                if grad_w is not None:
                    grad_w.addmm_(logits.t().float(), h[start:end].float())
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return losses.sum()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any, None, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (
            (grad_h.float() * grad).to(h_dtype) if grad_h is not None else None,  # 1/n in fp32
            (grad_w * grad).to(w_dtype) if grad_w is not None else None,
            None,
            None,
            None,
        )


def summed_linear_cross_entropy(
    backend: str,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    hits: torch.Tensor | None = None,
    smoothing: float = 0.0,
) -> torch.Tensor:
    """Sum over tokens whose target is not -100 of the cross-entropy of `hidden @ weight.T`.

    hidden: [tokens, hidden_size]; weight: [vocab, hidden_size]; targets: [tokens].
    `liger`: Liger's kernel for each chunk's loss and gradient (Liger's own fused function
    where the installed version's kernel takes other arguments); `chunked`: plain torch.
    `hits` (an evaluation's): the count of tokens whose target is the argmax is added to it,
    from the chunks' logits the loss computes anyway. `smoothing`: label smoothing, as
    torch's cross-entropy takes it.
    """
    if backend == "liger":
        if LIGER_LOOP and liger_kernel_fits():
            rows = functools.partial(_liger_rows, smoothing=smoothing)
            return LinearCrossEntropy.apply(hidden, weight, targets, rows, hits)
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        if hits is not None:  # Liger's own function keeps no logits to count from
            hits += correct_tokens(hidden, weight, targets)
        return liger_fused_linear_cross_entropy(
            hidden, weight, targets, ignore_index=IGNORE, label_smoothing=smoothing, reduction="sum"
        )
    if backend == "chunked":
        rows = functools.partial(_torch_rows, smoothing=smoothing)
        return LinearCrossEntropy.apply(hidden, weight, targets, rows, hits)
    raise ValueError(f"fused_loss: unknown backend {backend!r}")


def correct_tokens(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> Any:
    """How many tokens' targets are the argmax of `hidden @ weight.T`, a chunk of tokens at a
    time (evaluation's token accuracy; an ignored target, -100, is no argmax)."""
    dtype = _compute_dtype(hidden)
    with torch.no_grad(), torch.autocast(hidden.device.type, enabled=False):
        h, w = hidden.to(dtype), weight.to(dtype)
        hits = torch.zeros((), dtype=torch.long, device=h.device)
        for start, end in _chunks(h.shape[0], w.shape[0]):
            hits += ((h[start:end] @ w.t()).argmax(-1) == targets[start:end]).sum()
    return hits


# False: `liger` runs Liger's own fused function, host syncs and all (scripts/bench_train.py
# measures the two against each other)
LIGER_LOOP = True
# False: the collator passes no loss positions, so the LM head runs on every token, as before
# them (scripts/bench_train.py's f_loss_every_token measures the two against each other)
TRAINED_ROWS_ONLY = True


def causal_lm_loss(
    backend: str,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: Any = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The loss transformers' causal LMs compute (labels shifted left by one, -100 ignored;
    summed over `num_items_in_batch` when given, else the mean over trained tokens).

    `positions`: the flat indices of the tokens whose shifted label is trained (the
    collator's `trained_positions`); only their hidden states meet the LM head, with the
    same loss and gradients (the others' gradient is 0 either way)."""
    flat, targets = _trained(hidden, labels, positions)
    total = summed_linear_cross_entropy(backend, flat, weight, targets)
    return per_item(total, targets, num_items_in_batch, positions)


def per_item(
    total: torch.Tensor, targets: torch.Tensor, num_items_in_batch: Any, positions: Any
) -> torch.Tensor:
    """A summed loss over `num_items_in_batch` when given, else over the trained tokens."""
    if num_items_in_batch is None:
        if positions is not None:  # every selected token is trained; the count is the host's
            return total / max(positions.numel(), 1)
        return total / (targets != IGNORE).sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _trained(
    hidden: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's hidden state and its next token's label, flat ([tokens, hidden],
    [tokens]); only the trained ones where `positions` names them."""
    targets = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE).reshape(-1)
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.to(flat.device)
    if positions is not None:
        positions = positions.to(flat.device, non_blocking=True)
        flat, targets = flat.index_select(0, positions), targets.index_select(0, positions)
    return flat, targets


def fused_forward(self: Any, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
    """A causal LM's forward that, given labels, returns the loss and no logits (every other
    argument but the collator's loss positions goes to the model's body as it came)."""
    positions = kwargs.pop(LOSS_POSITIONS, None)
    if labels is None:
        return self._expert_cli_forward(input_ids=input_ids, **kwargs)
    num_items = kwargs.pop("num_items_in_batch", None)
    kwargs.pop("logits_to_keep", None)
    out = self.model(input_ids=input_ids, **kwargs)
    flat, targets = _trained(out.last_hidden_state, labels, positions)
    # an evaluation's token accuracy, counted from the logits the loss computes a chunk at a
    # time (none are kept)
    hits = None if torch.is_grad_enabled() else flat.new_zeros((), dtype=torch.long)
    # label smoothing in training alone: an evaluation's loss is the plain cross-entropy
    smoothing = getattr(self, "_expert_cli_smoothing", 0.0) if hits is None else 0.0
    total = summed_linear_cross_entropy(
        self._expert_cli_loss, flat, self.lm_head.weight, targets, hits, smoothing
    )
    loss = per_item(total, targets, num_items, positions)
    result = CausalLMOutputWithPast(loss=loss, **{CACHE_FIELD: getattr(out, CACHE_FIELD, None)})
    if hits is not None:
        result[HITS] = hits
    return result


def takes_loss_positions(model: Any) -> bool:
    """Whether `model` (a causal LM, or peft's model around one) computes its loss through
    `install_fused_loss`'s forward, which takes the collator's loss positions."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return TRAINED_ROWS_ONLY and getattr(base, "_expert_cli_loss", None) is not None


def install_fused_loss(model: Any, backend: str, smoothing: float = 0.0) -> None:
    """Rebind `model.forward` (a transformers causal LM, before peft wraps it) to compute the
    loss through `backend` whenever labels are given (with label `smoothing` when gradients
    are taken)."""
    if not hasattr(model, "_expert_cli_forward"):
        model._expert_cli_forward = model.forward
    model._expert_cli_loss = backend
    model._expert_cli_smoothing = smoothing
    model.forward = MethodType(fused_forward, model)
