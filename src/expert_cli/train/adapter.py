"""The manifest's adapter as peft configures it, and what it asks of the base model: target
names that match its layers, checked on the architecture built without weights."""

from __future__ import annotations

import difflib
import functools
from typing import TYPE_CHECKING, Any

from peft import AdaLoraConfig, IA3Config, LoKrConfig, LoraConfig, get_peft_model
from peft.utils.constants import (
    TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING as IA3_FEEDFORWARD,
)
from torch import nn
from transformers.pytorch_utils import Conv1D

from expert_cli.config.adapters import decomposing, unfused_reason
from expert_cli.config.choices import FUSED_KERNELS
from expert_cli.errors import UserError
from expert_cli.train.adapter_entry import whole
from expert_cli.train.architecture import (
    device_memory,
    encoder_problem,
    memory_problem,
    meta_model,
    positions_problem,
    stored_quantization_problem,
    vocabulary_problem,
)
from expert_cli.train.args import deepspeed_problem
from expert_cli.train.causality import copy_isolation, isolation_problem
from expert_cli.train.fused_lora import unfused_bases
from expert_cli.train.speed import compile_problem

if TYPE_CHECKING:
    from peft import PeftConfig, PeftModel

    from expert_cli.config.resolve import ResolvedConfig


# the layer types each adapter type's peft layers wrap (peft 0.21); `all-linear` picks the
# nn.Linear and Conv1D layers (GPT-2's) but the output layer
ADAPTABLE: dict[str, tuple[type[nn.Module], ...]] = {
    "lora": (
        nn.Linear,
        nn.Embedding,
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        Conv1D,
        nn.MultiheadAttention,
    ),
    "adalora": (nn.Linear, Conv1D, nn.Conv2d),
    "ia3": (nn.Linear, Conv1D, nn.Conv2d),
    "lokr": (nn.Linear, nn.Conv1d, nn.Conv2d),
}
# IA3's feed-forward output layer for the model types peft names none for (OLMo-2, Granite,
# SmolLM3, Phi-3 ...): the llama family's name, which peft uses for every such type it lists
IA3_FEEDFORWARD_FALLBACK = "down_proj"

# AdaLoRA's schedule: the first tenth of the steps at the initial rank, the last fifth at the
# final rank pattern (divisors of the step count)
ADALORA_WARMUP, ADALORA_FINAL = 10, 5
INIT = {"default": True}  # init_lora_weights as peft names it; the others by their own names


def adapter_config(
    resolved: ResolvedConfig,
    total_steps: int,
    model_type: str | None = None,
    kept: list[str] | None = None,
) -> PeftConfig:
    """The peft configuration for the manifest's adapter type. IA3 without feed-forward
    modules takes peft's for the architecture (`model_type`), or down_proj for a type peft
    names none for: with none, its down projection was scaled at its output, not its input as
    IA3 scales feed-forward layers. `kept`: IA3's as a resumed checkpoint recorded them."""

    targets = resolved.target_modules
    kind = resolved.adapter_type
    if kind in ("lora", "dora"):
        return LoraConfig(
            r=resolved.rank,
            lora_alpha=whole(resolved.alpha),
            lora_dropout=resolved.dropout,
            target_modules=targets,
            use_dora=resolved.use_dora,
            use_rslora=resolved.use_rslora,
            init_lora_weights=INIT.get(resolved.init_lora_weights, resolved.init_lora_weights),
            bias="none",
            task_type="CAUSAL_LM",
        )
    if kind == "ia3":
        return IA3Config(
            target_modules=targets,
            feedforward_modules=kept if kept is not None else _feedforward(resolved, model_type),
            task_type="CAUSAL_LM",
        )
    if kind == "lokr":
        return LoKrConfig(
            r=resolved.rank,
            alpha=whole(resolved.alpha),
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
            lora_alpha=whole(resolved.alpha),
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


def saved_loadable(peft_model: Any) -> None:
    """What `peft_model` saves, as plain peft loads it:
    - no copy of the base model's embedding or LM head: peft saves the whole frozen matrix
      beside an adapter on `embed_tokens` or `lm_head` ("auto"), 622 MB in fp32 for
      Qwen3-0.6B, needed only for a vocabulary resized in training, which expert-cli never
      does (the base's own matrix is used on load);
    - IA3's feed-forward modules named as its targets are once `all-linear` is expanded (the
      layers' full names): peft saves those, and refused its own adapter_config.json on load
      when the feed-forward modules stayed short names (not a subset of the targets)."""
    save = type(peft_model).save_pretrained
    peft_model.save_pretrained = functools.partial(save, peft_model, save_embedding_layers=False)
    for config in peft_model.peft_config.values():
        short, targets = getattr(config, "feedforward_modules", None), config.target_modules
        if not isinstance(short, set | list) or not isinstance(targets, set):
            continue
        if not set(short) <= targets:
            config.feedforward_modules = {
                t for t in targets if any(t == f or t.endswith(f".{f}") for f in short)
            }


def _feedforward(resolved: ResolvedConfig, model_type: str | None) -> list[str]:
    """IA3's feed-forward modules for a new run: the manifest's, else those of the model type
    among the targets."""
    targets = resolved.target_modules
    named = resolved.feedforward_modules
    return named or [m for m in _ia3_feedforward(model_type) if _targeted(m, targets)]


def _ia3_feedforward(model_type: str | None) -> list[str]:
    return IA3_FEEDFORWARD.get(model_type or "", [IA3_FEEDFORWARD_FALLBACK])


def _targeted(name: str, targets: Any) -> bool:
    return targets == "all-linear" or name in targets


def ia3_note(
    peft_model: Any,
    resolved: ResolvedConfig,
    model_type: str | None,
    kept: list[str] | None = None,
) -> str | None:
    """What IA3 took for feed-forward layers where peft names none for the model type (the
    manifest naming none either): down_proj where the model has it, else nothing, every
    target then scaled at its output; on a resume that `kept` none where a new run would
    take some, that it goes on as it was trained."""
    if resolved.adapter_type != "ia3" or resolved.feedforward_modules:
        return None
    if kept is not None:
        if kept or not (new := _feedforward(resolved, model_type)):
            return None
        return (
            "adapter_type: ia3: resumed as its checkpoint was trained, with no feed-forward "
            f"layers (every target scaled at its output); a new run scales {', '.join(new)} "
            "at its input"
        )
    if (model_type or "") in IA3_FEEDFORWARD:
        return None
    scaled = sum(1 for m in peft_model.modules() if getattr(m, "is_feedforward", False))
    if scaled:
        return (
            f"adapter_type: ia3: peft names no feed-forward layers for this model type; its "
            f"{scaled} {IA3_FEEDFORWARD_FALLBACK} layers are scaled at their input, as IA3 "
            "scales feed-forward layers (feedforward_modules names others)"
        )
    return (
        "adapter_type: ia3: peft names no feed-forward layers for this model type and no "
        f"target is a {IA3_FEEDFORWARD_FALLBACK}: every target is scaled at its output; name "
        "the feed-forward output layers in training.config.feedforward_modules"
    )


def adapter_error(resolved: ResolvedConfig, exc: ValueError | str) -> str:
    """A line naming the adapter and what is wrong with it."""
    return f"adapter ({resolved.adapter_type}): {exc}"


def target_problem(model: Any, resolved: ResolvedConfig) -> str | None:
    """A named target that matches no layer, or one of a type the adapter cannot adapt."""
    return unmatched_targets(model, resolved) or unadaptable_targets(model, resolved)


def unadaptable_targets(model: Any, resolved: ResolvedConfig) -> str | None:
    """The targets that name layers of a type the adapter cannot adapt (a LayerNorm, a block;
    GPT-2's Conv1D for LoKr), each by its place in the list, or `all-linear` when it picks
    such layers: peft's error quoted the layer's repr (LoKr's was a traceback)."""
    kind = resolved.adapter_type
    kinds = ADAPTABLE.get("lora" if kind == "dora" else kind)
    if kinds is None:
        return None
    targets = resolved.target_modules
    can = ", ".join(k.__name__ for k in kinds)
    if isinstance(targets, str):
        picked = _types(model, lambda n, m: isinstance(m, nn.Linear | Conv1D), kinds)
        if not picked:
            return None
        return adapter_error(
            resolved,
            f"target_modules all-linear picks the model's {picked} layers, which {kind} cannot "
            f"adapt (it adapts {can}): use lora, dora, ia3 or adalora, or name its other layers",
        )
    lines = []
    for i, target in enumerate(targets):
        if wrong := _types(model, lambda n, m, t=target: n == t or n.endswith(f".{t}"), kinds):
            lines.append(f"target_modules[{i}] names {wrong} layers, which {kind} cannot adapt")
    if not lines:
        return None
    return adapter_error(resolved, "; ".join(lines) + f" (it adapts {can})")


def _types(model: Any, picks: Any, kinds: tuple[type[nn.Module], ...]) -> str:
    """The type names, joined, of `model`'s layers `picks(name, module)` selects that are not
    among `kinds`; empty when there are none."""
    wrong = {
        type(m).__name__
        for n, m in model.named_modules()
        if n and picks(n, m) and not isinstance(m, kinds)
    }
    return " and ".join(sorted(wrong))


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
    if problem := stored_quantization_problem(resolved, model.config):
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
    if missing := target_problem(model, resolved):
        return missing
    try:
        # shapes alone: a decomposing init (PiSSA) cannot run on the meta device's weights
        shaped = resolved.model_copy(update={"init_lora_weights": "default"})
        adapted = get_peft_model(model, adapter_config(shaped, 1, model.config.model_type))
    except ValueError as exc:
        return adapter_error(resolved, exc)
    return decomposed_rank_problem(adapted, resolved)


def decomposed_rank_problem(adapted: Any, resolved: ResolvedConfig) -> str | None:
    """PiSSA and OLoRA take a weight's first r singular (or QR) directions: a layer with
    fewer (its smaller side) got fewer, its adapter_config.json still saying r, and the run's
    adapter was one no loader takes. None where every adapted layer has r."""
    init = resolved.init_lora_weights
    if not (isinstance(init, str) and decomposing(init)):
        return None
    sides = {
        name.removeprefix("base_model.model."): min(weight.shape)
        for name, module in adapted.named_modules()
        if hasattr(module, "lora_A")
        and (weight := getattr(getattr(module, "base_layer", None), "weight", None)) is not None
        and weight.ndim == 2
    }
    if not sides or (fewest := min(sides.values())) >= resolved.rank:
        return None
    name = min(sides, key=sides.__getitem__)
    return (
        f"training.config.rank: {resolved.rank} with init_lora_weights {init}: {name} has "
        f"{fewest} directions to take (the smaller side of its weight); give a rank of at most "
        f"{fewest}, or init_lora_weights default"
    )


def start_problem(resolved: ResolvedConfig, tokens: int | None = None) -> str | None:
    """What stops a run before its data is tokenized, as `check` and `train` both find it: a
    torch.compile setting this torch lacks, strategy deepspeed without DeepSpeed, or a base
    model that cannot take the adapter."""
    return (
        compile_problem(resolved)
        or deepspeed_problem(resolved)
        or adapter_problem(resolved, resolved.base_model, None, tokens)
    )


def adapter_notes(
    peft_model: PeftModel, resolved: ResolvedConfig, kept: list[str] | None = None
) -> list[str]:
    """Notes on the attached adapter: IA3's feed-forward layers where peft names none for
    the model type (or as a resumed checkpoint `kept` them); the LoRA layers the fused kernel
    cannot take for their base layer's type (GPT-2's Conv1D), where the configuration's own
    note did not say it runs none."""
    notes = []
    model_type = getattr(peft_model.config, "model_type", None)
    if note := ia3_note(peft_model, resolved, model_type, kept):
        notes.append(note)
    plain = not unfused_reason(resolved.adapter_type, resolved.quantization)
    kernel = resolved.adapter_kernel
    if kernel in FUSED_KERNELS and plain and (left := unfused_bases(peft_model)):
        notes.append(
            f"adapter_kernel: {kernel} runs LoRA and DoRA on nn.Linear layers; the adapters of the "
            f"model's {left} layers run peft's own"
        )
    return notes
