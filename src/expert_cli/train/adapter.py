"""The manifest's adapter as peft configures it, and what it asks of the base model: target
names that match its layers, checked on the architecture built without weights."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from peft import AdaLoraConfig, IA3Config, LoKrConfig, LoraConfig, get_peft_model
from peft.utils.constants import (
    TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING as IA3_FEEDFORWARD,
)

from expert_cli.errors import UserError
from expert_cli.train.architecture import (
    device_memory,
    encoder_problem,
    memory_problem,
    meta_model,
    positions_problem,
    vocabulary_problem,
)
from expert_cli.train.args import deepspeed_problem
from expert_cli.train.causality import copy_isolation, isolation_problem
from expert_cli.train.speed import compile_problem

if TYPE_CHECKING:
    from peft import PeftConfig

    from expert_cli.config.resolve import ResolvedConfig


# AdaLoRA's schedule: the first tenth of the steps at the initial rank, the last fifth at the
# final rank pattern (divisors of the step count)
ADALORA_WARMUP, ADALORA_FINAL = 10, 5


def adapter_config(
    resolved: ResolvedConfig, total_steps: int, model_type: str | None = None
) -> PeftConfig:
    """The peft configuration for the manifest's adapter type. IA3 without feed-forward
    modules takes peft's for the architecture (`model_type`): with none, its down projection
    was scaled at its output, not its input as IA3 scales feed-forward layers."""

    targets = resolved.target_modules
    kind = resolved.adapter_type
    if kind in ("lora", "dora"):
        return LoraConfig(
            r=resolved.rank,
            lora_alpha=resolved.alpha,
            lora_dropout=resolved.dropout,
            target_modules=targets,
            use_dora=resolved.use_dora,
            bias="none",
            task_type="CAUSAL_LM",
        )
    if kind == "ia3":
        return IA3Config(
            target_modules=targets,
            feedforward_modules=resolved.feedforward_modules
            or [m for m in IA3_FEEDFORWARD.get(model_type or "", []) if _targeted(m, targets)],
            task_type="CAUSAL_LM",
        )
    if kind == "lokr":
        return LoKrConfig(
            r=resolved.rank,
            alpha=resolved.alpha,
            rank_dropout=resolved.dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
    if kind == "adalora":
        if total_steps <= 0:
            raise UserError("adapter_type adalora: needs a known number of training steps")
        return AdaLoraConfig(
            init_r=resolved.rank,
            target_r=max(1, resolved.rank // 2),
            lora_alpha=resolved.alpha,
            lora_dropout=resolved.dropout,
            target_modules=targets,
            total_step=total_steps,
            # ranks are first learnt whole, then pruned, then trained at their final pattern
            # (peft's 0 and 0 pruned from the first step, on importance scores of one step,
            # and kept pruning to the last)
            tinit=total_steps // ADALORA_WARMUP,
            tfinal=total_steps // ADALORA_FINAL,
            task_type="CAUSAL_LM",
        )
    raise UserError(f"adapter_type: {kind!r} is not supported (lora, dora, ia3, lokr, adalora)")


def loadable_ia3(peft_model: Any) -> None:
    """IA3's feed-forward modules named as its targets are once `all-linear` is expanded (the
    layers' full names): peft saves those, and refused its own adapter_config.json on load
    when the feed-forward modules stayed short names (not a subset of the targets)."""
    for config in peft_model.peft_config.values():
        short, targets = getattr(config, "feedforward_modules", None), config.target_modules
        if not isinstance(short, set | list) or not isinstance(targets, set):
            continue
        if not set(short) <= targets:
            config.feedforward_modules = {
                t for t in targets if any(t == f or t.endswith(f".{f}") for f in short)
            }


def _targeted(name: str, targets: Any) -> bool:
    return targets == "all-linear" or name in targets


def adapter_error(resolved: ResolvedConfig, exc: ValueError | str) -> str:
    """A line naming the adapter and what is wrong with it."""
    return f"adapter ({resolved.adapter_type}): {exc}"


def unmatched_targets(model: Any, resolved: ResolvedConfig) -> str | None:
    """The named targets that match no module of `model` (peft's rule: the module's name, or
    its last dotted parts): peft adapts the others and says nothing, so a misspelt name
    would silently train a smaller adapter. None when every name matches. Each is named by
    its place in the list (not quoted), with the nearest layer name the model has."""
    targets = resolved.target_modules
    if isinstance(targets, str):
        return None
    names = [name for name, _ in model.named_modules()]
    layers = sorted({n.rsplit(".", 1)[-1] for n in names if n and not n[-1].isdigit()})
    lines = []
    for i, target in enumerate(targets):
        if any(n == target or n.endswith(f".{target}") for n in names):
            continue
        close = difflib.get_close_matches(target, layers, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"target_modules[{i}] names no layer of the model{hint}")
    if not lines:
        return None
    return adapter_error(resolved, "; ".join(lines))


def adapter_problem(
    resolved: ResolvedConfig,
    source: str,
    memory_bytes: int | None = None,
    tokens: int | None = None,
) -> str | None:
    """Why the base model at `source` (a local folder or a cached hub id) cannot take the
    manifest's adapter, found as a run finds it, on the architecture built on the meta
    device: no model can be built from its configuration, it is an encoder, its attention lets
    packed examples see each other (the probe on a one-layer copy), the tokenizer's `tokens`
    ids do not fit its embedding, its weights cannot fit this machine (`memory_bytes`, this
    machine's by default), a target names no layer, or peft refuses the adapter. None when
    it attaches, or when the configuration is not here to read (a hub model not yet
    downloaded)."""
    model, problem = meta_model(resolved, source)
    if model is None:
        return problem
    if problem := encoder_problem(model, source):
        return problem
    kernel = resolved.attn_implementation
    verdict = copy_isolation(model.config, kernel, resolved.packing, resolved.trust_remote_code)
    if problem := isolation_problem(verdict, model, source, kernel):
        return problem
    if tokens is not None and (problem := vocabulary_problem(model, tokens, source)):
        return problem
    if problem := positions_problem(model, resolved.max_seq_length, source):
        return problem
    memory = memory_bytes if memory_bytes is not None else device_memory()
    if problem := memory_problem(resolved, model, memory):
        return problem
    if missing := unmatched_targets(model, resolved):
        return missing
    try:
        get_peft_model(model, adapter_config(resolved, 1, model.config.model_type))
    except ValueError as exc:
        return adapter_error(resolved, exc)
    return None


def start_problem(resolved: ResolvedConfig, tokens: int | None = None) -> str | None:
    """What stops a run before its data is tokenized, as `check` and `train` both find it: a
    torch.compile setting this torch lacks, strategy deepspeed without DeepSpeed, or a base
    model that cannot take the adapter."""
    return (
        compile_problem(resolved)
        or deepspeed_problem(resolved)
        or adapter_problem(resolved, resolved.base_model, None, tokens)
    )
