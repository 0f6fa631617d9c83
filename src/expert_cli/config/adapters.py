"""The adapter a run trains, from `training.config` and the manifest's adapter entries, with a
note for every value of the entries that is not acted on: a conflicting type or rank, DoRA
asked of an adapter that is not LoRA, entries or base models beyond the first."""

from __future__ import annotations

from typing import Any

from expert_cli.config.choices import FUSED_KERNELS, checkpointing_on, first
from expert_cli.config.models import Manifest
from expert_cli.errors import UserError

DEFAULT_RANK = 16
DEFAULT_DROPOUT = 0.05
# DoRA with dropout, as the DoRA authors' code and peft define it: y = x W^T + b + (c - 1) d W^T
# + c s (d A^T) B^T with d the dropped input, so the frozen weight meets x and d: 4 x 440 M
# more FLOPs a token for Qwen3-0.6B with all seven projections adapted, over the 2.8, 3.1
# and 3.9 GFLOP of dropout 0 with examples of 500, 1,000 and 2,048 tokens
# (telemetry.flops.lora_train_flops_per_token): 1.63x, 1.56x, 1.46x
DORA_DROPOUT = (
    "dropout: {dropout:g} with DoRA runs each adapted projection's frozen matmul twice, forward "
    "and backward (on the input and on the dropped input, as DoRA's reference code and peft "
    "define it): 1.5x to 1.6x the step's matmul FLOPs of dropout 0 for Qwen3-0.6B with every "
    "projection adapted (examples of 2,048 to 500 tokens; counted, not timed); dropout 0 runs "
    "it once"
)


# what IA3 (a learned scaling vector per layer) has no use for
IA3_UNREAD = ("rank", "alpha", "dropout")


def adapter_settings(manifest: Manifest, notes: list[str], on_gpu: bool = True) -> dict[str, Any]:
    """The resolved adapter fields (type, rank, alpha, dropout, targets, DoRA); UserError for
    an adapter the base's quantization cannot train (`on_gpu`: the run's machine has one)."""
    cfg = manifest.training.config
    spec = manifest.primary_adapter
    kind = first(cfg.adapter_type, spec.type if spec else None, "lora")
    rank = first(cfg.rank, spec.r if spec else None, DEFAULT_RANK)
    pairs = (
        ("rank", cfg.rank, spec.r if spec else None),
        ("alpha", cfg.alpha, spec.alpha if spec else None),
        ("dropout", cfg.dropout, spec.dropout if spec else None),
        ("target_modules", cfg.target_modules, spec.target_modules if spec else None),
        (
            "feedforward_modules",
            cfg.feedforward_modules,
            spec.feedforward_modules if spec else None,
        ),
    )
    unread = IA3_UNREAD if kind == "ia3" else ("feedforward_modules",)
    if given := [n for n, ours, theirs in pairs if n in unread and (ours, theirs) != (None, None)]:
        notes.append(f"{', '.join(given)}: not applicable to {kind}, so not applied")
    for name, ours, theirs in pairs:
        if ours is not None and theirs is not None and ours != theirs and name not in unread:
            notes.append(_overridden(name, ours, theirs))
    if spec and "type" in spec.model_fields_set and cfg.adapter_type and spec.type != kind:
        notes.append(
            f"adapter_type: training.config.adapter_type={kind} is used; the adapter entry "
            f"says type={spec.type}"
        )
    if spec and spec.use_dora and kind not in ("lora", "dora"):
        notes.append(f"use_dora: DoRA decomposes LoRA weights; not applied to {kind}")
    init = _initialisation(manifest, kind, notes)
    rslora = bool(cfg.use_rslora) and kind in ("lora", "dora")
    if cfg.use_rslora and not rslora:
        notes.append(
            f"use_rslora: rank-stabilised scaling is LoRA's and DoRA's; not applied to {kind}"
        )
    loraplus = _loraplus(manifest, kind, notes)
    if spec and spec.use_dora and cfg.adapter_type == "lora":  # asked plain LoRA by name
        notes.append(
            "adapter_type: lora with the adapter entry's use_dora true trains DoRA (LoRA "
            "with weight decomposition); set use_dora false on the entry for plain LoRA"
        )
    notes += _unused_entries(manifest)
    if kind == "adalora" and rank < 2:  # peft's budget prunes to rank // 2: none from 1
        raise UserError(
            f"training.config.rank: {rank} with adapter_type adalora: "
            "AdaLoRA prunes each layer from its rank down to half of it, which rank 1 leaves "
            "nothing to prune from (peft fails at its first rank update); give 2 or more"
        )
    if kind == "adalora":
        notes.append(
            "adapter_type: adalora trains with peft's orthogonal regulariser (orth_reg_weight "
            "0.5) added to its loss; the loss logged and eval_loss are the language-model loss "
            "alone, as for the other adapter types"
        )
    targets = first(cfg.target_modules, spec.target_modules if spec else None, "all-linear")
    use_dora = kind == "dora" or bool(spec and spec.use_dora and kind == "lora")
    dropout = float(first(cfg.dropout, spec.dropout if spec else None, DEFAULT_DROPOUT))
    replay = cfg.gradient_checkpointing_kwargs
    dropped = dropout > 0 and kind != "ia3"  # IA3 has no dropout
    if dropped and checkpointing_on(cfg) and replay and replay.preserve_rng_state is False:
        raise UserError(
            "training.config.gradient_checkpointing_kwargs.preserve_rng_state: false recomputes "
            f"each layer with other adapter dropout masks (dropout {dropout:g}) than its forward "
            "drew, so the gradients are not those of the loss: set it true (the default), or "
            "dropout to 0"
        )
    quantization = manifest.primary_base_model.quantization
    if problem := quantized_problem(kind, use_dora, quantization, on_gpu):
        raise UserError(problem)
    kernel = cfg.adapter_kernel
    if kernel in FUSED_KERNELS and (unfused := unfused_reason(kind, quantization, kernel)):
        notes.append(f"adapter_kernel: {unfused}")
    elif kernel == "grouped" and use_dora:
        notes.append(
            "adapter_kernel: grouped groups plain LoRA layers; DoRA layers run fused, one by one"
        )
    if use_dora and dropout > 0:  # use_dora: the adapter is LoRA or DoRA
        notes.append(DORA_DROPOUT.format(dropout=dropout))
    feedforward = first(cfg.feedforward_modules, spec.feedforward_modules if spec else None)
    named_too = feedforward if kind == "ia3" and isinstance(targets, list) else []
    if outside := [i for i, name in enumerate(named_too or []) if name not in targets]:
        raise UserError(
            f"training.config.feedforward_modules[{outside[0]}]: not among target_modules; "
            "IA3 scales a feed-forward layer at its input only where it adapts that layer "
            "(name it in target_modules too)"
        )
    scaling = spec.scaling if spec else None
    named = ("rslora",) if rslora else ("standard", "default", *(("dora",) if use_dora else ()))
    if scaling and scaling not in named:
        notes.append(
            "scaling: kept as written, not applied: the adapter's output is scaled by "
            + (
                "alpha / sqrt(r) (training.config.use_rslora; rslora names it)"
                if rslora
                else "alpha / r (peft's standard LoRA scaling; standard, default and, for DoRA, "
                "dora name it; training.config.use_rslora true scales by alpha / sqrt(r))"
            )
        )
    return dict(
        adapter_type=kind,
        rank=rank,
        alpha=float(first(cfg.alpha, spec.alpha if spec else None, 2 * rank)),
        dropout=dropout,
        target_modules=targets,
        feedforward_modules=feedforward,
        use_dora=use_dora,
        use_rslora=rslora,
        init_lora_weights=init,
        loraplus_lr_ratio=loraplus,
    )


def _loraplus(manifest: Manifest, kind: str, notes: list[str]) -> float | None:
    """training.config.loraplus_lr_ratio as the run takes it: LoRA's and DoRA's (a note for
    another adapter type); UserError under DeepSpeed, whose configuration may make its own
    optimizer, which would train without it."""
    ratio = manifest.training.config.loraplus_lr_ratio
    if ratio is None or ratio == 1:
        return None
    if kind not in ("lora", "dora"):
        notes.append(f"loraplus_lr_ratio: LoRA+ trains LoRA's and DoRA's B; not applied to {kind}")
        return None
    distributed = manifest.training.distributed
    if distributed is not None and distributed.strategy == "deepspeed":
        raise UserError(
            "training.config.loraplus_lr_ratio: under DeepSpeed, whose configuration may make "
            "its own optimizer (without the ratio); use fsdp or ddp, or leave it unset"
        )
    return float(ratio)


def decomposing(init: str | None) -> bool:
    """Whether a LoRA initialisation moves part of the base weight into the adapter (PiSSA,
    OLoRA: the base's weights are rewritten as their residual; train/lora_init.py)."""
    return bool(init) and (init in ("pissa", "olora") or init.startswith("pissa_niter_"))


def _initialisation(manifest: Manifest, kind: str, notes: list[str]) -> str:
    """training.config.init_lora_weights as the run takes it: LoRA's and DoRA's only (a
    note for another adapter type); UserError where the base cannot be decomposed."""
    init = manifest.training.config.init_lora_weights or "default"
    if init != "default" and kind not in ("lora", "dora"):
        notes.append(f"init_lora_weights: {init} starts LoRA and DoRA; not applied to {kind}")
        return "default"
    where = "training.config.init_lora_weights"
    quantization = manifest.primary_base_model.quantization
    if decomposing(init) and quantization in ("int4", "int8"):
        raise UserError(
            f"{where}: {init} decomposes each base weight in full precision, which an "
            f"{quantization} base does not hold; train on the unquantized base, or leave "
            "init_lora_weights unset"
        )
    distributed = manifest.training.distributed
    if decomposing(init) and distributed is not None and distributed.strategy == "deepspeed":
        raise UserError(
            f"{where}: {init} under DeepSpeed: ZeRO-3 partitions the weights as they load, "
            "before peft could decompose them; use fsdp or ddp, or leave init_lora_weights unset"
        )
    if decomposing(init):
        notes.append(
            f"init_lora_weights: {init} decomposes each adapted weight as the run starts ("
            + ("a QR" if init == "olora" else "an SVD")
            + " of each: minutes on a CPU for a 0.6B model); the adapter is saved and shipped "
            "as a LoRA of twice the rank on the base itself, its start kept in "
            "adapter_init.safetensors"
        )
    return init


def quantized_problem(kind: str, dora: bool, quantization: str | None, on_gpu: bool) -> str | None:
    """An adapter a quantized base cannot train, which peft and bitsandbytes accept and then
    fail on in a step (a traceback after `check` called the manifest usable)."""
    where = "base_models[0].quantization"
    if quantization == "int4" and kind == "lokr":
        return (
            f"{where}: int4 cannot carry adapter_type lokr (peft shapes the Kronecker update "
            "as the 4-bit weight's packed storage and fails at the first step); use int8 or "
            "none, or a LoRA adapter"
        )
    if quantization == "int8" and dora and not on_gpu:
        return (
            f"{where}: int8 with DoRA fails on a CPU at the second step (bitsandbytes' 8-bit "
            "backward); use int4 or none, or LoRA without DoRA"
        )
    return None


def unfused_reason(kind: str, quantization: str | None, kernel: str = "fused") -> str | None:
    """Why the fused adapter `kernel` (fused or grouped) runs none of the run's layers (it
    runs LoRA and DoRA on unquantized and int4 layers, with or without dropout; the others
    keep peft's forward); None where it runs."""
    if kind not in ("lora", "dora"):
        return f"{kernel} runs LoRA and DoRA layers; {kind} layers run peft's own"
    if quantization == "int8":
        return (
            f"{kernel} runs LoRA and DoRA on unquantized and int4 layers; the int8 base's "
            "layers run peft's own"
        )
    return None


def _overridden(name: str, ours: Any, theirs: Any) -> str:
    """The note of an adapter entry's value that training.config overrides (lists named, not
    quoted in full)."""
    entry = {"rank": "r"}.get(name, name)
    if isinstance(ours, list) or isinstance(theirs, list):
        return f"{name}: training.config.{name} is used; the adapter entry gives other {name}"
    return f"{name}: training.config.{name}={ours} is used; the adapter entry says {entry}={theirs}"


def _unused_entries(manifest: Manifest) -> list[str]:
    """Adapter entries after the first, and base models after the first: kept as written
    (and packaged so), not trained."""
    notes = []
    base = manifest.primary_base_model
    entries, where = (
        (base.adapters, "base_models[0].adapters")
        if base.adapters
        else (manifest.adapters, "adapters")
    )
    if entries and len(entries) > 1:
        extra = len(entries) - 1
        notes.append(
            f"{where}: the first entry is the adapter trained; {extra} more "
            f"entr{'ies are' if extra > 1 else 'y is'} kept as written, not trained"
        )
    if manifest.base_models and len(manifest.base_models) > 1:
        extra = len(manifest.base_models) - 1
        notes.append(
            f"base_models: the adapter is trained on base_models[0] only; {extra} more "
            f"entr{'ies are' if extra > 1 else 'y is'} kept as written (the package lists "
            "them too), with no adapter trained for them"
        )
    return notes
