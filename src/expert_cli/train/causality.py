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

`copy_isolation` runs the same probe before any weight is read (in `check`, and in `train`
before the data is tokenized): on a copy of the architecture cut to one layer, a small
vocabulary and a short feed-forward, with random weights on the CPU. Attention is what the
probe tests, and the cut leaves it as it is.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from expert_cli.data.collate import PackedCollator
from expert_cli.data.formatting import IGNORE
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train import distributed
from expert_cli.train.architecture import embedding_rows, model_type, not_causal
from expert_cli.train.attention import (
    BOUNDARY_KERNELS,
    mask_free_mapping,
    probing,
    skip_mask_building,
)

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
CPU_KERNELS = ("eager", "sdpa", "flex_attention")  # what the copy can run here
COPY_MAX_PARAMS = 100_000_000  # a copy larger than this is not built (seconds, not minutes)
FEED_FORWARD_KEYS = ("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner")
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
    try:
        with probing(model, kernel, probed), torch.no_grad(), autocast:
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


def agreed(verdict: str) -> str:
    """The worst verdict of any process, so that every rank stops where one would (a rank
    whose weights are not loaded yet cannot probe; the others can)."""
    worst = -distributed.min_over_ranks(-SEVERITY.get(verdict, 0))
    return next((v for v, level in SEVERITY.items() if level == worst), verdict)


def checked_isolation(model: Any, kernel: str, resolved: Any, dtype: Any) -> str:
    """`attention_isolation` of the run's loaded model, as every process agrees it; a model
    the run cannot train on (`isolation_problem`) is a UserError."""
    verdict = agreed(attention_isolation(model, kernel, resolved.packing, dtype))
    if problem := isolation_problem(verdict, model, resolved.base_model, kernel):
        raise UserError(problem)
    return verdict


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


def copy_isolation(config: Any, kernel: str, packing: bool, remote_code: bool = False) -> str:
    """`attention_isolation` on a copy of `config`'s architecture with one layer, a
    PROBE_IDS-row vocabulary, a 256-wide feed-forward and random fp32 weights on the CPU (the
    global random state kept), with the kernel the run would load it with (a model that
    refuses sdpa falls back to eager, as a run does). "not probed: <why>" for a kernel the
    CPU cannot run, a copy over COPY_MAX_PARAMS, or an architecture the cut breaks: the loaded
    model's probe decides then."""
    if kernel not in CPU_KERNELS:
        return f"not probed: {kernel} runs on a GPU only"
    small = copy.deepcopy(config)
    small.num_hidden_layers = 1  # transformers maps the name (n_layer, n_layers...)
    small.vocab_size = PROBE_IDS
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids past the small vocabulary
        setattr(small, key, None)
    for key in FEED_FORWARD_KEYS:
        if isinstance(getattr(small, key, None), int):
            setattr(small, key, 256)
    try:
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(small, trust_remote_code=remote_code)
        if sum(p.numel() for p in meta.parameters()) > COPY_MAX_PARAMS:
            return "not probed: one layer of this architecture is too large to build here"
        model, kernel = _built(small, kernel, remote_code)
    except Exception as exc:  # noqa: BLE001 - a cut this architecture does not take
        return f"not probed: {type(exc).__name__}"
    return attention_isolation(model.float(), kernel, packing)


def _built(config: Any, kernel: str, remote_code: bool) -> tuple[Any, str]:
    """The model of `config` with seeded random weights and the first kernel it takes of
    `kernel`, sdpa, eager (a ValueError when none)."""
    order = list(dict.fromkeys([kernel, "sdpa", "eager"]))
    for attn in order:
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = AutoModelForCausalLM.from_config(
                    config, attn_implementation=attn, trust_remote_code=remote_code
                )
            return model, attn
        except (ValueError, ImportError):
            if attn == order[-1]:
                raise
    raise ValueError("no attention kernel to try")
