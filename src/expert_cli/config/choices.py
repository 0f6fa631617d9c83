"""What a run takes on this machine: precision, kernels, data loading, schedule and batch.

Each function reads the manifest's `training.config` and an `Environment`, returns resolved
fields, and appends a note ("field: what was decided and why") for every choice that differs
from what the manifest asked for, so nothing is dropped silently.
"""

from __future__ import annotations

import os
from typing import Any

from expert_cli.config.base import first
from expert_cli.config.environment import Environment
from expert_cli.config.kernels import choose_kernel
from expert_cli.config.optimizer import optimizer_choice
from expert_cli.config.training_config import CHECKPOINTING_NAMES, TrainingConfig
from expert_cli.errors import UserError
from expert_cli.paths import shown_path

# Defaults for a LoRA expert on a ~0.6B model; each is overridable in the manifest.
DEFAULT_LR = 2e-4
POLYNOMIAL_LR_END = 1e-7  # transformers' default final rate of the polynomial schedule
DEFAULT_WARMUP_RATIO = 0.03
MAX_AUTO_WORKERS = 4
WORKERS_PER_CPU = 4  # above this a manifest's worker count is refused
# adapter_kernel values that run train/fused_lora.py's function
FUSED_KERNELS = ("fused", "grouped")


def precision(cfg: TrainingConfig, env: Environment, notes: list[str]) -> tuple[bool, bool]:
    if not env.has_gpu:
        if cfg.fp16:
            notes.append("fp16: not applicable on CPU; training in fp32")
            return False, False
        if cfg.bf16:
            notes.append("bf16: running bf16 autocast on CPU as the manifest asks (slow)")
        return bool(cfg.bf16), False
    if cfg.bf16 and not env.bf16:
        notes.append(f"bf16: {env.gpu_name} has no bf16; using fp16 instead")
        return False, True
    # a flag left unset takes the machine's half precision (one `false` alone had turned
    # mixed precision off: `fp16: false` trained an A100 run in fp32)
    bf16 = first(cfg.bf16, env.bf16 and not cfg.fp16)
    fp16 = first(cfg.fp16, not env.bf16 and not bf16)
    if not bf16 and not fp16:
        notes.append(
            "bf16, fp16: mixed precision off, training in fp32 on the GPU (several times "
            "slower; no MFU): leave both unset for the GPU's own half precision"
        )
    return bool(bf16), bool(fp16)


def _attention(cfg: TrainingConfig, env: Environment, half: bool, notes: list[str]) -> str:
    """The attention kernel: `attention` when set, else the format's flags, else auto."""
    requested = cfg.attention or "auto"
    if cfg.attention is None and cfg.flash_attention_2:
        requested = "flash_attention_2"
    elif cfg.attention is None and cfg.use_sdpa is False:
        notes.append("use_sdpa: false; using eager attention (slowest)")
        requested = "eager"
    if cfg.memory_efficient_attention is not None:
        notes.append(
            "memory_efficient_attention: hint only; the attention kernel is chosen "
            "for packed rows (training.config.attention)"
        )
    exclude = frozenset({"flash_attention_2"}) if cfg.flash_attention_2 is False else frozenset()
    return choose_kernel(requested, env, half, notes, exclude)


def _fused_loss(cfg: TrainingConfig, env: Environment, notes: list[str]) -> str:
    """Which linear cross-entropy replaces full-vocabulary logits (off on a CPU by default).

    Measured on an H100 (docs/PERFORMANCE.md): Liger's is the fastest, expert-cli's chunked
    one next, both ahead of the standard loss, which also holds 28 GB more at 8 rows.
    """
    requested = cfg.fused_loss or "auto"
    liger = env.has_gpu and env.liger_kernel is not None
    if requested == "liger" and not liger:
        why = "needs a CUDA GPU" if not env.has_gpu else "liger-kernel is not installed"
        notes.append(f"fused_loss: liger {why}; choosing automatically")
        requested = "auto"
    if requested != "auto":
        return requested
    if not env.has_gpu:  # the standard loss, but where only a fused one smooths the labels
        return "chunked" if cfg.label_smoothing_factor else "off"
    return "liger" if liger else "chunked"


def sharded(distributed: dict[str, Any] | None) -> bool:
    """Whether the run's weights are sharded by FSDP or DeepSpeed: the manifest's
    training.distributed.strategy, or `accelerate launch` told so by its own config."""
    if (distributed or {}).get("strategy", "ddp") != "ddp":
        return True
    flags = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")
    return any(os.environ.get(flag, "").lower() in ("1", "true", "yes") for flag in flags)


def kernels(
    cfg: TrainingConfig, env: Environment, half: bool, notes: list[str], sharded: bool = False
) -> dict[str, Any]:
    """The step's kernels. The fused LoRA linear is the default on a GPU (1.22x peft's
    tokens/s at 8 rows, 1.13x at 16, on an H100: docs/PERFORMANCE.md) but not under FSDP or
    DeepSpeed (`sharded`: not measured there) nor with adapter_precision fp32 under mixed
    precision (the fused layers compute in the mixed-precision dtype); on a CPU peft's
    layers run."""
    liger = bool(first(cfg.liger_kernels, True)) and env.has_gpu and env.liger_kernel is not None
    if cfg.liger_kernels and not liger:
        why = "needs a CUDA GPU" if not env.has_gpu else "liger-kernel is not installed"
        notes.append(f"liger_kernels: {why}; using the model's own layers")
    if cfg.torch_compile and not env.has_gpu:
        notes.append(
            "torch_compile: on as the manifest asks (on a CPU the compile time rarely pays back)"
        )
    precision = first(cfg.adapter_precision, "compute" if half else "fp32")
    # the fused layers compute in the mixed-precision dtype: peft's fp32 adapter inputs,
    # asked for under bf16/fp16, keep peft's layers
    fp32_asked = half and precision == "fp32"
    if cfg.adapter_kernel in FUSED_KERNELS and fp32_asked:
        notes.append(
            f"adapter_kernel: {cfg.adapter_kernel} computes the adapters in the mixed-precision "
            "dtype; adapter_precision fp32 applies to the layers it leaves to peft only"
        )
    return dict(
        attn_implementation=_attention(cfg, env, half, notes),
        adapter_precision=precision,
        adapter_kernel=first(
            cfg.adapter_kernel,
            "fused" if env.has_gpu and not sharded and not fp32_asked else "peft",
        ),
        fused_loss=_fused_loss(cfg, env, notes),
        liger_kernels=liger,
        torch_compile=bool(cfg.torch_compile),
    )


def loader(cfg: TrainingConfig, env: Environment, notes: list[str]) -> dict[str, Any]:
    # the machine's CPUs are shared by its training processes (8 under torchrun on an 8-GPU
    # machine took 4 workers each, 32 workers and 8 trainers on 16 CPUs)
    cpus = max(1, env.cpu_count // env.local_processes)
    auto_workers = min(MAX_AUTO_WORKERS, max(1, cpus // 2)) if env.has_gpu else 0
    workers = first(cfg.dataloader_num_workers, auto_workers)
    if workers > WORKERS_PER_CPU * env.cpu_count:
        raise UserError(
            f"training.config.dataloader_num_workers: {workers} is more than "
            f"{WORKERS_PER_CPU} per CPU on this machine ({env.cpu_count} CPUs); one per CPU, "
            f"{env.cpu_count}, is the most that helps (or leave it unset to choose "
            "automatically)"
        )
    if workers > cpus:
        shared = (
            f" shared by {env.local_processes} training processes" if cpus < env.cpu_count else ""
        )
        notes.append(
            f"dataloader_num_workers: {workers} processes on {env.cpu_count} CPUs{shared}; "
            "more than one per CPU only adds memory and switching"
        )
    if env.has_gpu and cfg.dataloader_num_workers == 0:
        notes.append(
            "dataloader_num_workers: 0 as the manifest asks; batches are collated on "
            "the training thread (cheap with the pretokenized cache)"
        )
    prefetch = first(cfg.dataloader_prefetch_factor, 4) if workers > 0 else None
    if cfg.dataloader_prefetch_factor is not None and workers == 0:
        notes.append("dataloader_prefetch_factor: not applicable with 0 workers")
    persistent = bool(first(cfg.dataloader_persistent_workers, workers > 0)) and workers > 0
    pin = bool(first(cfg.dataloader_pin_memory, env.has_gpu)) and env.has_gpu
    if cfg.dataloader_pin_memory and not env.has_gpu:
        notes.append("dataloader_pin_memory: not applicable without a GPU")
    return dict(
        dataloader_num_workers=workers,
        dataloader_prefetch_factor=prefetch,
        dataloader_persistent_workers=persistent,
        dataloader_pin_memory=pin,
    )


EPOCHS_UNAPPLIED = "epochs: not applied; "  # a manifest's max_steps sets the length


def hints(cfg: TrainingConfig, env: Environment, notes: list[str]) -> None:
    """Report the format's runtime hints that this run does not act on."""
    if cfg.use_unsloth:
        notes.append(
            "use_unsloth: not applicable; expert-cli trains with peft and its own fast data path"
        )
    if cfg.activation_checkpointing not in (None, False):
        notes.append(
            "activation_checkpointing: per-module checkpointing is not built; "
            "gradient_checkpointing decides"
        )
    if cfg.use_cuda_graphs:
        notes.append("use_cuda_graphs: not applied (packed rows have dynamic shapes)")
    if cfg.cuda_graph_warmup_steps is not None:
        notes.append("cuda_graph_warmup_steps: not applicable (no CUDA graphs)")
    if cfg.memory_clear_every and not env.has_gpu:
        notes.append("memory_clear_every: not applicable without a GPU")
    if cfg.group_by_length and cfg.packing is not False:
        notes.append("group_by_length: not applicable to packed rows (all the same length)")
    if (cfg.torch_compile_backend or cfg.torch_compile_mode) and not cfg.torch_compile:
        notes.append("torch_compile_backend/mode: not applicable, torch_compile is off")
    if cfg.save_strategy in ("no", "epoch") and cfg.save_steps is not None:
        notes.append(f"save_steps: not applicable, save_strategy is {cfg.save_strategy}")
    if cfg.save_strategy == "no" and cfg.save_total_limit is not None:
        notes.append("save_total_limit: not applicable, save_strategy is no")
    if cfg.evaluation_strategy in ("no", "epoch") and cfg.eval_steps is not None:
        notes.append(
            f"eval_steps: not applicable, evaluation_strategy is {cfg.evaluation_strategy}"
        )
    if cfg.max_steps and (cfg.epochs or cfg.num_epochs):
        notes.append(f"{EPOCHS_UNAPPLIED}max_steps {cfg.max_steps} sets the run's length")
    if cfg.gradient_checkpointing in ("selective", "unsloth"):
        notes.append(
            f"gradient_checkpointing: {cfg.gradient_checkpointing} recomputation is not built; "
            "whole decoder layers are recomputed (gradient_checkpointing true)"
        )
    kwargs = cfg.gradient_checkpointing_kwargs
    if kwargs is not None and not checkpointing_on(cfg):
        notes.append("gradient_checkpointing_kwargs: not applicable, gradient_checkpointing is off")
    elif kwargs is not None and kwargs.use_reentrant:
        notes.append(
            "gradient_checkpointing_kwargs.use_reentrant: true is not applied; layers are "
            "recomputed with torch's non-reentrant checkpoint (it works with frozen base "
            "weights and DDP)"
        )


def checkpointing_on(cfg: TrainingConfig) -> bool:
    """`gradient_checkpointing` as true/false (a name as CHECKPOINTING_NAMES reads it)."""
    on = cfg.gradient_checkpointing
    return CHECKPOINTING_NAMES[on] if isinstance(on, str) else bool(on)


def checkpointing(cfg: TrainingConfig) -> dict[str, Any]:
    """Whether activations are recomputed, and the options of the recomputation."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    given = cfg.gradient_checkpointing_kwargs
    if given is not None and given.preserve_rng_state is not None:
        kwargs["preserve_rng_state"] = given.preserve_rng_state
    return dict(gradient_checkpointing=checkpointing_on(cfg), gradient_checkpointing_kwargs=kwargs)


def _schedule_arguments(cfg: TrainingConfig, learning_rate: float) -> dict[str, Any]:
    """`lr_scheduler_kwargs` (checked against the schedule by the manifest's model); a final
    learning rate at or above the peak is refused here, where the peak is known."""
    kwargs = dict(cfg.lr_scheduler_kwargs or {})
    finals = dict(kwargs)
    if first(cfg.lr_scheduler, "cosine") == "polynomial":
        finals.setdefault("lr_end", POLYNOMIAL_LR_END)  # transformers' default, checked too
    for key in ("lr_end", "min_lr"):
        if key in finals and finals[key] >= learning_rate:
            given = "" if key in kwargs else " (transformers' default)"
            raise UserError(
                f"training.config.lr_scheduler_kwargs.{key}: {finals[key]:g}{given} is the "
                f"final learning rate and must be below the peak learning_rate "
                f"({learning_rate:g})"
            )
    return kwargs


def schedule(cfg: TrainingConfig, env: Environment, notes: list[str]) -> dict[str, Any]:
    ratio = cfg.warmup_ratio or 0.0  # a written 0 is no warmup, not the default's
    steps = 0 if ratio else (cfg.warmup_steps or 0)
    if cfg.warmup_ratio is None and cfg.warmup_steps is None:
        ratio = DEFAULT_WARMUP_RATIO
    if cfg.warmup_ratio and cfg.warmup_steps:
        notes.append("warmup_steps: warmup_ratio is set and wins")
    learning_rate = first(cfg.learning_rate, DEFAULT_LR)
    scheduler = first(cfg.lr_scheduler, "cosine")
    if scheduler == "constant":  # transformers' constant schedule passes over any warmup
        if cfg.warmup_ratio or cfg.warmup_steps:
            scheduler = "constant_with_warmup"
            notes.append(
                "lr_scheduler: constant with the manifest's warmup runs as "
                "constant_with_warmup (the constant schedule has none)"
            )
        else:  # the default warmup is not the manifest's: constant is what it asked
            ratio = 0.0
    return dict(
        epochs=float(first(cfg.epochs, cfg.num_epochs, 1.0)),
        max_steps=cfg.max_steps if cfg.max_steps else -1,
        learning_rate=learning_rate,
        lr_scheduler=scheduler,
        lr_scheduler_kwargs=_schedule_arguments(cfg, learning_rate),
        warmup_steps=steps,
        warmup_ratio=ratio,
        seed=cfg.seed,
        **optimizer_choice(cfg, env, notes),
    )


# training.packaging_checkpoint best in a run that never evaluates: package has no loss to
# compare, and refuses
BEST_UNEVALUATED = (
    "training.packaging_checkpoint: best ships the adapter of lowest eval loss, and evaluation "
    "is off: package will have no loss to compare and ask for --checkpoint NAME; turn "
    "evaluation on, or name the checkpoint to ship"
)


def dataset_notes(ds: Any) -> list[str]:
    """A note for each of the dataset block's settings that a run does not act on."""
    notes = []
    if ds.streaming or ds.max_in_memory_samples is not None:
        notes.append(
            "streaming, max_in_memory_samples: the token cache is built once from the whole "
            "dataset and read memory-mapped, so streaming is not needed"
        )
    if ds.error_injection_ratio:
        notes.append(
            "error_injection_ratio: not applied; the examples are trained as the data holds "
            "them (inject errors when making the data)"
        )
    if ds.use_pretokenized is False:
        notes.append("use_pretokenized: false is not applied; training reads the token cache")
    return notes


def checkpoint_problem(
    best: bool, save: str, evaluation: str, save_steps: int, eval_steps: int
) -> str | None:
    """`field: what is wrong` in the resolved checkpoint settings: what the Trainer refuses (a
    traceback at its start) or silently skips; None when they work together."""
    if save == "best" and evaluation == "no":
        return (
            "save_strategy: best saves at each new best evaluation, and evaluation is off; "
            "set evaluation_strategy steps or epoch, or save_strategy steps"
        )
    if not best or save == "best":
        return None
    if save != evaluation:
        return (
            f"save_strategy: {save} with load_best_model_at_end: checkpoints must be saved "
            f"when the evaluations run (save_strategy {evaluation}, or best)"
        )
    if save == "steps" and save_steps % eval_steps:
        return (
            f"save_steps: {save_steps} must be a multiple of eval_steps ({eval_steps}) for "
            "load_best_model_at_end"
        )
    return None


def shared_sources(train: list[Any], valid: list[Any]) -> list[str]:
    """A note for each validation source that is also read for training (the same file, or
    the same hub split): its eval loss then measures examples the run trains on."""

    def key(ref: Any) -> tuple[Any, ...]:
        place = os.path.realpath(ref.location) if ref.kind == "local" else ref.location
        return ref.kind, place, ref.split, ref.config

    def field(ref: Any) -> str:
        return f"tasks.{ref.task}.valid" if ref.task else "validation_path"

    trained = {key(ref) for ref in train}
    return [  # local sources: by the files they read (refs.held_out_notes)
        f"training.dataset.{field(ref)}: {shown_path(ref.location)} is also read for "
        "training; the eval loss then measures examples the run trains on"
        for ref in valid
        if key(ref) in trained and ref.kind != "local"
    ]
