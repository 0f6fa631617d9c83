"""Does the loaded model attend only to earlier tokens, and only inside each packed example?

Packing lays examples end to end in one row with no attention mask: the positions restart at
0 at every example, and no example may see the one before it. Most transformers decoders
build that block-diagonal mask from the restarting positions, and the varlen kernels read the
collator's boundaries; a few ignore both (OPT, Bloom, Falcon and MPT in transformers 5.23)
and let every example attend to the ones before it in its row. An encoder loaded as the base
(BERT and its kin, which transformers builds as a causal LM) lets every position see the
tokens after it, so the adapter learns to copy the next token rather than predict it. Both
train without an error and without a warning: the loss falls, the adapter is wrong.

`attention_isolation` finds both on the model as loaded, in a few forwards of 16 tokens,
through the collator, mask handling, kernel and precision the run will use: the logits of a
prefix must not change with what follows it, and with packing on, the logits of an example
must not change with the example packed before it. An isolated model gives exactly equal
logits (the compared positions see the same tokens through the same kernels), so the
tolerance only absorbs rounding.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from expert_cli.data.collate import PackedCollator
from expert_cli.data.formatting import IGNORE
from expert_cli.paths import shown_path
from expert_cli.train import distributed
from expert_cli.train.architecture import embedding_rows, model_type, not_causal
from expert_cli.train.attention import BOUNDARY_KERNELS, mask_free_mapping, skip_mask_building

FIRST, SECOND = 7, 9  # lengths of the two probe examples
PROBE_IDS = 1000  # ids drawn below this (and below the embedding's rows)
# The change allowed where none is expected, relative to the change the probe's own tokens
# make: an isolated model gives exactly none (the compared positions see the same tokens
# through the same kernels); the margin only absorbs a kernel that rounds differently.
FULL_TOLERANCE = 1e-4
HALF_TOLERANCE = 1e-2  # bf16 has 8 bits of mantissa
SEES_FUTURE = "sees later tokens"
PACKED_LEAK = "packed examples attend to each other"
ISOLATED = "verified"
MASK_PROXY = {"flex_attention": "sdpa"}
SEVERITY = {SEES_FUTURE: 2, PACKED_LEAK: 1}


def _not_probed(model: Any) -> str | None:
    """Why the model cannot run a forward outside the trainer here, or None when it can."""
    if any(p.is_meta for p in model.parameters()):
        return "weights not loaded on this rank"
    if getattr(model, "is_loaded_in_8bit", False):
        # LLM.int8 picks outlier columns over every token of a matmul: other tokens move a
        # token's result, so a leak cannot be told from the quantization's own effect
        return "int8 weights mix tokens in each matmul"
    from transformers.integrations import is_deepspeed_zero3_enabled

    return "DeepSpeed ZeRO-3 partitions the weights" if is_deepspeed_zero3_enabled() else None


def _logits(
    model: Any, collate: PackedCollator, mapping: Any, ids: list[int], positions: list[int]
) -> torch.Tensor:
    device = next(model.parameters()).device
    row = {"input_ids": ids, "labels": [IGNORE] * len(ids), "position_ids": positions}
    batch = collate([row])
    batch.pop("labels")
    batch = skip_mask_building(batch, mapping)
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return model(**batch, use_cache=False).logits[0].float()


def _changed(leak: torch.Tensor, moved: torch.Tensor, tolerance: float) -> bool:
    """Whether `leak` (the change at positions that must not see what changed) exceeds
    `tolerance` of `moved` (the change at positions whose own tokens changed)."""
    largest = leak.abs().max().item()
    return largest != 0.0 and largest > tolerance * max(moved.abs().max().item(), 1e-6)


def _tolerance(model: Any, autocast: bool) -> float:
    half = autocast or any(
        p.is_floating_point() and p.element_size() < 4 for p in model.parameters()
    )
    return HALF_TOLERANCE if half else FULL_TOLERANCE


def attention_isolation(
    model: Any, kernel: str, packing: bool, dtype: torch.dtype | None = None
) -> str:
    """ISOLATED, SEES_FUTURE, PACKED_LEAK, or "not probed: <why>" for `model` (before the
    adapter is attached) with attention `kernel`; `dtype` is the run's autocast dtype (None:
    no autocast). Every module's training mode is put back as it was."""
    if why := _not_probed(model):
        return f"not probed: {why}"
    rows = embedding_rows(model) or PROBE_IDS
    generator = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, min(rows, PROBE_IDS), (n,), generator=generator).tolist()

    first, other_first, second, other_second = (
        tokens(FIRST),
        tokens(FIRST),
        tokens(SECOND),
        tokens(SECOND),
    )
    # flex builds its block mask where sdpa builds its dense one (from the same positions), and
    # compiles for every new shape: the probe reads sdpa's mask rather than compile for 16 tokens
    probed = MASK_PROXY.get(kernel, kernel)
    collate = PackedCollator(0, boundaries=probed in BOUNDARY_KERNELS)
    mapping = mask_free_mapping(model, probed)
    one = list(range(FIRST + SECOND))
    two = list(range(FIRST)) + list(range(SECOND))
    device = next(model.parameters()).device
    autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
    tolerance = _tolerance(model, dtype is not None)
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        if probed != kernel:
            model.set_attn_implementation(probed)
        with torch.no_grad(), autocast:
            a = _logits(model, collate, mapping, first + second, one)
            b = _logits(model, collate, mapping, first + other_second, one)
            if _changed(a[:FIRST] - b[:FIRST], a[FIRST:] - b[FIRST:], tolerance):
                return SEES_FUTURE
            if not packing:
                return ISOLATED
            c = _logits(model, collate, mapping, first + second, two)
            d = _logits(model, collate, mapping, other_first + second, two)
            leaks = _changed(c[FIRST:] - d[FIRST:], c[:FIRST] - d[:FIRST], tolerance)
            return PACKED_LEAK if leaks else ISOLATED
    except Exception as exc:  # noqa: BLE001 - a model the probe cannot drive; the run decides
        return f"not probed: {type(exc).__name__}"
    finally:
        for module, mode in modes.items():
            module.training = mode
        if probed != kernel:
            model.set_attn_implementation(kernel)


def agreed(verdict: str) -> str:
    """The worst verdict of any process, so that every rank stops where one would (a rank
    whose weights are not loaded yet cannot probe; the others can)."""
    worst = -distributed.min_over_ranks(-SEVERITY.get(verdict, 0))
    return next((v for v, level in SEVERITY.items() if level == worst), verdict)


def isolation_problem(verdict: str, model: Any, source: str, kernel: str) -> str | None:
    """Why a run cannot train on `model` after `attention_isolation` gave `verdict`; None when
    it can."""
    shown = f"base model {shown_path(source)}{model_type(model)}"
    if verdict == SEES_FUTURE:
        return not_causal(shown)
    if verdict == PACKED_LEAK:
        return (
            f"{shown}: with packing on, the examples packed into one row attend to the ones "
            f"before them in this architecture (attention {kernel}), so each would train on "
            "another example's text. Set training.config.packing to false in the manifest "
            "(each example then has its row)"
        )
    return None
