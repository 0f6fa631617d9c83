"""Whether a causal LM can take the fused loss (train/loss.py): its logits must be its LM
head's weight times its body's last hidden state, with nothing the fused loss would leave out
(a bias, a softcap or scale, an adapter on the head, a router's loss, a partitioned head)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations import is_deepspeed_zero3_enabled

from expert_cli.errors import UserError
from expert_cli.train.attention import probing

# head_problem: tokens run through the model, and the difference allowed between its logits and
# the head's product, relative to the largest logit (the same GEMM on the same input gives none;
# the margin absorbs rounding; a multiplier as Falcon-H1's 0.078 moves them by 92%)
HEAD_TOKENS = 8
HEAD_TOLERANCE = 1e-2


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
    if is_deepspeed_zero3_enabled():  # gathered only inside the head's own forward
        return "DeepSpeed ZeRO-3 partitions the LM head's weight, which it reads directly"
    for field in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, field, None) not in (None, 1, 1.0):
            return f"the model scales its logits ({field})"
    if getattr(config, "output_router_logits", False):
        return "the model adds its router's balancing loss (output_router_logits), left out"
    return head_problem(model)


def head_problem(model: Any) -> str | None:
    """Why the model's logits are not its LM head's weight times its body's last hidden state,
    the product the fused loss computes (a multiplier or a transform of the head's input or
    output that no config field above names: Falcon-H1's lm_head_multiplier); None when they
    are, or when this process holds no weights to run. One forward of HEAD_TOKENS tokens in
    eval mode, the body's output and the head's input and output caught by hooks, with sdpa
    where the run's kernel is a varlen or flex one (they need the collator's boundaries, or
    compile for the shape), as the causality probe does."""
    weight = getattr(model.lm_head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return "the LM head is no linear layer with a weight matrix"
    if not weight.is_floating_point():
        return "the LM head's weight is quantized"
    if any(p.is_meta for p in model.parameters()):
        return None
    ids = torch.arange(HEAD_TOKENS, device=weight.device).unsqueeze(0) % weight.shape[0]
    seen: dict[str, torch.Tensor] = {}
    hooks = [  # each returns None: a value returned would replace the module's output
        model.model.register_forward_hook(
            lambda _m, _a, out: seen.update(body=out.last_hidden_state)
        ),
        model.lm_head.register_forward_hook(
            lambda _m, args, out: seen.update(head_in=args[0], head_out=out)
        ),
    ]
    kernel = getattr(model.config, "_attn_implementation", None)
    probed = kernel if kernel in ("sdpa", "eager", None) else "sdpa"
    try:
        with probing(model, kernel, probed), torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits
    except Exception as exc:  # noqa: BLE001 - a model that cannot run here: the loss decides
        return f"its logits could not be compared with its LM head's ({type(exc).__name__})"
    finally:
        for hook in hooks:
            hook.remove()
    head_in, head_out = seen.get("head_in"), seen.get("head_out")
    with torch.no_grad():
        product = None if head_in is None else F.linear(head_in.to(weight), weight)
    if not (
        _close(head_in, seen.get("body")) and _close(logits, head_out) and _close(head_out, product)
    ):
        return "the model's logits are not its LM head's product with the last hidden state"
    return None


def _close(got: torch.Tensor | None, want: torch.Tensor | None) -> bool:
    """Equal within HEAD_TOLERANCE of `want`'s largest value (rounding only)."""
    if got is None or want is None or got.shape[-1] != want.shape[-1]:
        return False
    got, want = got.float(), want.float()
    if got.shape != want.shape:  # the head ran on the last positions only (logits_to_keep)
        want = want[..., -got.shape[-2] :, :]
    if got.shape != want.shape:
        return False
    scale = max(want.abs().max().item(), 1e-6)
    return (got - want).abs().max().item() <= HEAD_TOLERANCE * scale


def unfused_note(why: str, smoothing: float) -> str:
    """The note that the standard loss runs in place of the fused one, for `why`; UserError
    where the run smooths its labels (`smoothing` > 0), which transformers' own loss does not."""
    if smoothing:
        raise UserError(
            f"training.config.label_smoothing_factor: applied in the fused loss, which this "
            f"model cannot take ({why}); remove label_smoothing_factor"
        )
    return f"fused_loss: {why}; using the standard loss"
