"""From a validated manifest to one explicit, JSON-serialisable training configuration.

Every field the manifest leaves unset is chosen here for the machine described by an
`Environment`, and every choice that overrides or ignores what the manifest asked for is
recorded in `notes` ("field: what was decided and why"), so nothing is dropped silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from expert_cli.config import (
    AdapterType,
    LoadedManifest,
    TrainingConfig,
    local_path,
    looks_like_hub_id,
    split_hub_spec,
)
from expert_cli.environment import Environment
from expert_cli.train.attention import choose_kernel

# Defaults for a LoRA expert on a ~0.6B model; each is overridable in the manifest.
DEFAULT_RANK = 16
DEFAULT_DROPOUT = 0.05
DEFAULT_LR = 2e-4
DEFAULT_MAX_SEQ = 2048
DEFAULT_TOKENS_PER_STEP = 32_768  # batch_size auto: rows per optimizer step = this / seq
DEFAULT_CPU_BATCH = 2
DEFAULT_WARMUP_RATIO = 0.03
DEFAULT_EVAL_FRACTION = 0.02
DEFAULT_SAVE_STEPS = 500
DEFAULT_SAVE_LIMIT = 3
DEFAULT_LOGGING_STEPS = 10
MAX_AUTO_WORKERS = 4
TRAIN_FILE_FORMATS = {
    ".jsonl": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}


class SourceRef(BaseModel):
    """One data source: a local file/folder or a hub dataset."""

    kind: Literal["local", "hub"]
    location: str = Field(description="Absolute local path, or the hub dataset id.")
    split: str | None = None
    config: str | None = None
    revision: str | None = None
    format: str | None = None
    weight: float = 1.0
    task: str | None = None


class ResolvedConfig(BaseModel):
    """Everything a run needs, with every automatic choice made explicit."""

    expert: str
    expert_version: str
    manifest_path: str
    # model
    base_model: str
    base_model_kind: Literal["local", "hub"]
    init: Literal["pretrained", "random"]
    revision: str | None
    trust_remote_code: bool
    quantization: Literal["int4", "int8", "fp16", "bf16", "none"]
    prompt_template: str
    # adapter
    adapter_type: AdapterType
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str] | Literal["all-linear"]
    feedforward_modules: list[str] | None
    use_dora: bool
    # data
    train_sources: list[SourceRef]
    validation_sources: list[SourceRef]
    eval_fraction: float
    field_mapping: dict[str, str] | None
    overlong: Literal["truncate", "drop"]
    response_template: str | None
    max_seq_length: int
    packing: bool
    pretokenized_cache: str
    # schedule
    epochs: float
    max_steps: int
    learning_rate: float
    lr_scheduler: str
    warmup_steps: int
    warmup_ratio: float
    batch_size: int
    gradient_accumulation_steps: int
    batch_auto: bool = Field(
        description="batch_size is probed from GPU memory at start (the numbers above are "
        "then provisional; the run's choice is in runtime.batch)"
    )
    rows_per_step: int = Field(description="Packed rows per optimizer step per device.")
    optim: str
    weight_decay: float
    max_grad_norm: float
    seed: int
    # kernels and precision
    bf16: bool
    fp16: bool
    use_tf32: bool
    attn_implementation: Literal[
        "flash_attention_4", "flash_attention_2", "torch_varlen", "flex_attention", "sdpa", "eager"
    ]
    adapter_precision: Literal["compute", "fp32"]
    fused_loss: Literal["liger", "chunked", "off"]
    liger_kernels: bool
    gradient_checkpointing: bool
    torch_compile: bool
    torch_compile_backend: str | None
    torch_compile_mode: str | None
    # data loading
    dataloader_num_workers: int
    dataloader_pin_memory: bool
    dataloader_prefetch_factor: int | None
    dataloader_persistent_workers: bool
    group_by_length: bool
    # logging, saving, evaluation
    logging_steps: int
    save_strategy: str
    save_steps: int
    save_total_limit: int | None
    evaluation_strategy: str
    eval_steps: int
    load_best_model_at_end: bool
    metric_for_best_model: str
    greater_is_better: bool
    memory_clear_every: int
    distributed: dict[str, Any] | None
    notes: list[str] = Field(default_factory=list)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _source(
    folder: Path,
    spec: str,
    fmt: str | None,
    revision: str | None,
    weight: float = 1.0,
    task: str | None = None,
) -> SourceRef:
    """A local path when it exists (or looks like one), else a hub id."""
    name, split, config = split_hub_spec(spec)
    path = local_path(folder, name)
    if fmt != "huggingface" and (
        path.exists() or not looks_like_hub_id(name) or path.suffix in TRAIN_FILE_FORMATS
    ):
        return SourceRef(
            kind="local",
            location=str(path),
            split=split,
            config=config,
            format=fmt or TRAIN_FILE_FORMATS.get(path.suffix),
            weight=weight,
            task=task,
        )
    return SourceRef(
        kind="hub",
        location=name,
        split=split,
        config=config,
        revision=revision,
        format="huggingface",
        weight=weight,
        task=task,
    )


def resolve_sources(lm: LoadedManifest) -> tuple[list[SourceRef], list[SourceRef]]:
    """Training and validation sources of the manifest's dataset block."""
    ds = lm.manifest.training.dataset
    folder = lm.folder
    if ds.type == "multi_task":
        train, valid = [], []
        for name, task in (ds.tasks or {}).items():
            fmt = task.format if task.format in TRAIN_FILE_FORMATS.values() else ds.format
            train.append(_source(folder, task.train, fmt, ds.revision, task.weight, name))
            if task.valid:
                valid.append(_source(folder, task.valid, fmt, ds.revision, 1.0, name))
        return train, valid
    train = [_source(folder, ds.path or "", ds.format, ds.revision)]
    valid = (
        [_source(folder, ds.validation_path, ds.format, ds.revision)] if ds.validation_path else []
    )
    return train, valid


def _precision(cfg: TrainingConfig, env: Environment, notes: list[str]) -> tuple[bool, bool]:
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
    if cfg.bf16 is None and cfg.fp16 is None:
        return env.bf16, not env.bf16
    return bool(cfg.bf16), bool(cfg.fp16)


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
    if not env.has_gpu:
        return "off"
    return "liger" if liger else "chunked"


def _kernels(cfg: TrainingConfig, env: Environment, half: bool, notes: list[str]) -> dict[str, Any]:
    liger = bool(_first(cfg.liger_kernels, True)) and env.has_gpu and env.liger_kernel is not None
    if cfg.liger_kernels and not liger:
        why = "needs a CUDA GPU" if not env.has_gpu else "liger-kernel is not installed"
        notes.append(f"liger_kernels: {why}; using the model's own layers")
    if cfg.torch_compile and not env.has_gpu:
        notes.append(
            "torch_compile: on as the manifest asks (on a CPU the compile time rarely pays back)"
        )
    return dict(
        attn_implementation=_attention(cfg, env, half, notes),
        adapter_precision=_first(cfg.adapter_precision, "compute" if half else "fp32"),
        fused_loss=_fused_loss(cfg, env, notes),
        liger_kernels=liger,
        torch_compile=bool(cfg.torch_compile),
    )


def _loader(cfg: TrainingConfig, env: Environment, notes: list[str]) -> dict[str, Any]:
    auto_workers = min(MAX_AUTO_WORKERS, max(1, env.cpu_count // 2)) if env.has_gpu else 0
    workers = _first(cfg.dataloader_num_workers, auto_workers)
    if env.has_gpu and cfg.dataloader_num_workers == 0:
        notes.append(
            "dataloader_num_workers: 0 as the manifest asks; batches are collated on "
            "the training thread (cheap with the pretokenized cache)"
        )
    prefetch = _first(cfg.dataloader_prefetch_factor, 4) if workers > 0 else None
    if cfg.dataloader_prefetch_factor is not None and workers == 0:
        notes.append("dataloader_prefetch_factor: not applicable with 0 workers")
    persistent = bool(_first(cfg.dataloader_persistent_workers, workers > 0)) and workers > 0
    pin = bool(_first(cfg.dataloader_pin_memory, env.has_gpu)) and env.has_gpu
    if cfg.dataloader_pin_memory and not env.has_gpu:
        notes.append("dataloader_pin_memory: not applicable without a GPU")
    return dict(
        dataloader_num_workers=workers,
        dataloader_prefetch_factor=prefetch,
        dataloader_persistent_workers=persistent,
        dataloader_pin_memory=pin,
    )


def _hints(cfg: TrainingConfig, env: Environment, notes: list[str]) -> None:
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
    if cfg.torch_compile_backend and not cfg.torch_compile:
        notes.append("torch_compile_backend/mode: not applicable, torch_compile is off")


def _adapter(lm: LoadedManifest, notes: list[str]) -> dict[str, Any]:
    cfg = lm.manifest.training.config
    spec = lm.manifest.primary_adapter
    kind = _first(cfg.adapter_type, spec.type if spec else None, "lora")
    rank = _first(cfg.rank, spec.r if spec else None, DEFAULT_RANK)
    if spec and spec.r and cfg.rank and spec.r != cfg.rank:
        notes.append(
            f"rank: training.config.rank={cfg.rank} is used; the adapter entry says r={spec.r}"
        )
    targets = _first(cfg.target_modules, spec.target_modules if spec else None, "all-linear")
    use_dora = kind == "dora" or bool(spec and spec.use_dora and kind == "lora")
    return dict(
        adapter_type=kind,
        rank=rank,
        alpha=float(_first(cfg.alpha, spec.alpha if spec else None, 2 * rank)),
        dropout=float(_first(cfg.dropout, spec.dropout if spec else None, DEFAULT_DROPOUT)),
        target_modules=targets,
        feedforward_modules=_first(
            cfg.feedforward_modules, spec.feedforward_modules if spec else None
        ),
        use_dora=use_dora,
    )


def _base_model(lm: LoadedManifest) -> dict[str, Any]:
    bm = lm.manifest.primary_base_model
    path = local_path(lm.folder, bm.name)
    local = path.exists() or not looks_like_hub_id(bm.name) or bm.init == "random"
    return dict(
        base_model=str(path) if local else bm.name,
        base_model_kind="local" if local else "hub",
        init=bm.init,
        revision=bm.revision,
        trust_remote_code=bm.trust_remote_code,
        quantization=bm.quantization or "none",
        prompt_template=bm.prompt_template or "chatml",
    )


def _schedule(cfg: TrainingConfig, env: Environment, notes: list[str]) -> dict[str, Any]:
    optim = _first(cfg.optim, "adamw_torch_fused" if env.has_gpu else "adamw_torch")
    if optim in {
        "adamw_bnb_8bit",
        "adamw_8bit",
        "paged_adamw_8bit",
        "paged_adamw_32bit",
        "lion_8bit",
        "lion_32bit",
    }:
        if not env.has_gpu:
            notes.append(f"optim: {optim} keeps its states on a GPU; using adamw_torch on CPU")
            optim = "adamw_torch"
        elif env.bitsandbytes is None:
            notes.append(f"optim: {optim} needs bitsandbytes, not installed; using adamw_torch")
            optim = "adamw_torch_fused"
    ratio = cfg.warmup_ratio if cfg.warmup_ratio else 0.0
    steps = 0 if ratio else (cfg.warmup_steps or 0)
    if not ratio and cfg.warmup_steps is None:
        ratio = DEFAULT_WARMUP_RATIO
    if cfg.warmup_ratio and cfg.warmup_steps:
        notes.append("warmup_steps: warmup_ratio is set and wins")
    return dict(
        epochs=float(_first(cfg.epochs, cfg.num_epochs, 1.0)),
        max_steps=cfg.max_steps if cfg.max_steps else -1,
        learning_rate=_first(cfg.learning_rate, DEFAULT_LR),
        lr_scheduler=_first(cfg.lr_scheduler, "cosine"),
        warmup_steps=steps,
        warmup_ratio=ratio,
        **_batch(cfg, env, notes),
        optim=optim,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        seed=cfg.seed,
    )


def _batch(cfg: TrainingConfig, env: Environment, notes: list[str]) -> dict[str, Any]:
    """Micro-batch, accumulation and rows per optimizer step (see train/batch.py)."""
    seq = _first(cfg.max_seq_length, DEFAULT_MAX_SEQ)
    auto = cfg.batch_size == "auto" or (cfg.batch_size is None and env.has_gpu)
    if not auto:
        batch = cfg.batch_size if isinstance(cfg.batch_size, int) else DEFAULT_CPU_BATCH
        accumulation = _first(cfg.gradient_accumulation_steps, 1)
        if cfg.tokens_per_step:
            notes.append(
                "tokens_per_step: not applicable; batch_size x "
                "gradient_accumulation_steps set the step"
            )
        return dict(
            batch_size=batch,
            gradient_accumulation_steps=accumulation,
            batch_auto=False,
            rows_per_step=batch * accumulation,
        )
    rows = max(1, _first(cfg.tokens_per_step, DEFAULT_TOKENS_PER_STEP) // seq)
    if cfg.gradient_accumulation_steps:
        notes.append(
            "gradient_accumulation_steps: follows from batch_size auto "
            f"({rows} rows per optimizer step)"
        )
    if not env.has_gpu:
        micro = max(d for d in range(1, min(rows, DEFAULT_CPU_BATCH) + 1) if rows % d == 0)
        notes.append(f"batch_size: auto on a CPU: {micro} rows x {rows // micro} accumulation")
        return dict(
            batch_size=micro,
            gradient_accumulation_steps=rows // micro,
            batch_auto=False,
            rows_per_step=rows,
        )
    return dict(batch_size=rows, gradient_accumulation_steps=1, batch_auto=True, rows_per_step=rows)


def _evaluation(lm: LoadedManifest, has_validation: bool) -> dict[str, Any]:
    cfg = lm.manifest.training.config
    ds = lm.manifest.training.dataset
    wants_eval = cfg.evaluation_strategy != "no"
    fraction = (
        0.0
        if has_validation
        else _first(ds.eval_fraction, DEFAULT_EVAL_FRACTION if wants_eval else 0.0)
    )
    has_eval = has_validation or fraction > 0
    save_steps = _first(cfg.save_steps, DEFAULT_SAVE_STEPS)
    strategy = _first(cfg.evaluation_strategy, "steps" if has_eval else "no")
    eval_steps = _first(cfg.eval_steps, save_steps)
    best = bool(cfg.load_best_model_at_end) and strategy != "no"
    save_strategy = _first(cfg.save_strategy, "steps")
    if best and save_strategy == "steps" and strategy == "steps" and save_steps % eval_steps:
        from expert_cli.errors import UserError

        raise UserError(
            f"{lm.path.name}: training.config.save_steps: {save_steps} must be a "
            f"multiple of eval_steps ({eval_steps}) for load_best_model_at_end"
        )
    return dict(
        eval_fraction=fraction,
        evaluation_strategy=strategy,
        eval_steps=eval_steps,
        save_strategy=save_strategy,
        save_steps=save_steps,
        save_total_limit=cfg.save_total_limit
        if "save_total_limit" in cfg.model_fields_set
        else DEFAULT_SAVE_LIMIT,
        load_best_model_at_end=best,
        metric_for_best_model=_first(cfg.metric_for_best_model, "eval_loss"),
        greater_is_better=bool(_first(cfg.greater_is_better, False)),
        logging_steps=_first(cfg.logging_steps, DEFAULT_LOGGING_STEPS),
    )


def resolve(lm: LoadedManifest, env: Environment) -> ResolvedConfig:
    """Make every automatic choice for `env` and return the explicit configuration."""
    cfg = lm.manifest.training.config
    ds = lm.manifest.training.dataset
    notes: list[str] = []
    train, valid = resolve_sources(lm)
    bf16, fp16 = _precision(cfg, env, notes)
    tf32 = bool(_first(cfg.use_tf32, env.tf32)) and env.tf32
    if cfg.use_tf32 and not env.tf32:
        notes.append("use_tf32: not applicable on this machine (needs an Ampere or newer GPU)")
    if ds.streaming:
        notes.append(
            "streaming: the token cache is built once from the whole dataset and "
            "read memory-mapped, so streaming is not needed"
        )
    _hints(cfg, env, notes)
    dist = lm.manifest.training.distributed
    dist_dict = dist.model_dump(exclude_none=True) if dist else None
    if dist_dict and isinstance(dist_dict.get("deepspeed"), str):
        dist_dict["deepspeed"] = str(local_path(lm.folder, dist_dict["deepspeed"]))
    cache = local_path(lm.folder, cfg.pretokenized_cache or ".cache/pretokenized")
    return ResolvedConfig(
        expert=lm.manifest.name,
        expert_version=lm.manifest.version,
        manifest_path=str(lm.path),
        **_base_model(lm),
        **_adapter(lm, notes),
        train_sources=train,
        validation_sources=valid,
        field_mapping=ds.field_mapping,
        overlong=ds.overlong,
        response_template=ds.response_template,
        max_seq_length=_first(cfg.max_seq_length, DEFAULT_MAX_SEQ),
        packing=_first(cfg.packing, True),
        pretokenized_cache=str(cache),
        **_schedule(cfg, env, notes),
        bf16=bf16,
        fp16=fp16,
        use_tf32=tf32,
        **_kernels(cfg, env, bf16 or fp16, notes),
        gradient_checkpointing=bool(cfg.gradient_checkpointing),
        torch_compile_backend=cfg.torch_compile_backend,
        torch_compile_mode=cfg.torch_compile_mode,
        **_loader(cfg, env, notes),
        group_by_length=bool(cfg.group_by_length) and cfg.packing is False,
        **_evaluation(lm, bool(valid)),
        memory_clear_every=(cfg.memory_clear_every or 0) if env.has_gpu else 0,
        distributed=dist_dict,
        notes=notes,
    )
