"""`training.config` (hyperparameters and the fast path's switches) and `training.distributed`:
the manifest blocks a run's schedule, kernels and engines come from."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from expert_cli.config.base import AdapterType, ModuleNames, Probability, Strict
from expert_cli.config.optimizer import OptimizerFields
from expert_cli.config.schedules import MAX_STEPS, Scheduler, schedule_arguments_problem
from expert_cli.config.trackers import TRACKERS, Tracker, one_or_many

Strategy = Literal["no", "steps", "epoch"]
AttentionKernel = Literal[
    "auto",
    "flash_attention_4",
    "flash_attention_2",
    "torch_varlen",
    "flex_attention",
    "sdpa",
    "eager",
]
FusedLoss = Literal["auto", "liger", "chunked", "off"]
MAX_BATCH_ROWS = 4096
MAX_EPOCHS = 10_000
MAX_SEQ_LENGTH = 1 << 20  # tokens in one packed row
MAX_WORKERS = 512  # the machine's own bound (4 per CPU) is checked when resolving


# `gradient_checkpointing` as HiveLLM manifests write it: true/false, or a name
CHECKPOINTING_NAMES = {"full": True, "selective": True, "unsloth": True, "none": False}


def _checkpointing(value: Any) -> Any:
    """`gradient_checkpointing`: true, false, or one of CHECKPOINTING_NAMES (kept as given, so
    that resolving can say what a name becomes)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value in CHECKPOINTING_NAMES:
        return value
    names = ", ".join(f'"{n}"' for n in CHECKPOINTING_NAMES)
    raise ValueError(f"expected true, false or one of {names}")


def _rows_or_auto(value: Any) -> Any:
    """`batch_size`: a whole number of rows (1 to 4096) or "auto"; one clear error otherwise."""
    if value is None or value == "auto":
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_ROWS:
        raise ValueError(f'expected a whole number of rows from 1 to {MAX_BATCH_ROWS}, or "auto"')
    return value


LORA_INIT = re.compile(r"default|gaussian|pissa|pissa_niter_[1-9][0-9]?|olora")


class CheckpointingKwargs(Strict):
    """`training.config.gradient_checkpointing_kwargs`: options of the recomputation."""

    use_reentrant: bool | None = Field(
        None,
        description="Accepted; expert-cli always recomputes with torch's non-reentrant "
        "checkpoint (the one that works with frozen base weights and DDP), and says so when "
        "this is true.",
    )
    preserve_rng_state: bool | None = Field(
        None, description="Replay the random state (dropout) in the recomputation (default true)."
    )


class TrainingConfig(OptimizerFields):
    """`training.config`: hyperparameters. Unset (None) means "pick the best for this machine"."""

    method: Literal["sft"] = Field("sft", description="Training method; only sft is built.")
    adapter_type: AdapterType | None = Field(
        None, description="Adapter type; defaults to the base model's first adapter, else lora."
    )
    rank: int | None = Field(None, ge=1, le=1024, description="Adapter rank r.")
    alpha: float | None = Field(
        None, gt=0, le=1e6, description="LoRA alpha (scale = alpha / rank)."
    )
    dropout: Probability | None = Field(None, description="Adapter dropout.")
    target_modules: ModuleNames | Literal["all-linear"] | None = Field(
        None, description='Modules to adapt, or "all-linear".'
    )
    feedforward_modules: list[str] | None = Field(None, description="IA3 feed-forward modules.")
    init_lora_weights: str | None = Field(
        None,
        description="Extension: how LoRA and DoRA start: default (B = 0), gaussian, pissa (A "
        "and B from the top singular directions of each weight, the rest left as the base), "
        "pissa_niter_N (the same by a randomised SVD of N iterations: faster), or olora (a QR "
        "decomposition). pissa and olora ship as a standard LoRA of rank 2r on the base itself.",
    )
    use_rslora: bool | None = Field(
        None,
        description="Extension: rank-stabilised LoRA (LoRA and DoRA): the adapter's output "
        "scaled by alpha / sqrt(rank) in place of alpha / rank, so a high rank learns as a low "
        "one does at the same alpha. A package folds sqrt(rank) into lora_B: HiveLLM's runtime "
        "applies alpha / rank.",
    )
    epochs: float | None = Field(
        None, gt=0, le=MAX_EPOCHS, description="Epochs; fractions allowed."
    )
    num_epochs: float | None = Field(None, gt=0, le=MAX_EPOCHS, description="Alias of epochs.")
    max_steps: int | None = Field(
        None, ge=0, le=MAX_STEPS, description="Optimizer steps; overrides epochs when > 0."
    )
    learning_rate: float | None = Field(None, gt=0, le=1, description="Peak learning rate.")
    batch_size: Annotated[int | Literal["auto"], BeforeValidator(_rows_or_auto)] | None = Field(
        None,
        description="Packed rows per device per micro-step, or auto (the default on a "
        "GPU): as many as fit in the GPU's memory (a short probe), with accumulation making up "
        "tokens_per_step.",
    )
    gradient_accumulation_steps: int | None = Field(
        None, ge=1, le=4096, description="Micro-batches per optimizer step."
    )
    warmup_steps: int | None = Field(None, ge=0, le=MAX_STEPS, description="Warmup steps.")
    warmup_ratio: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Warmup as a fraction of all steps (below 1: 1 warms up for the whole "
        "run); wins over warmup_steps.",
    )
    lr_scheduler: Scheduler | None = Field(None, description="Learning-rate schedule.")
    lr_scheduler_kwargs: dict[str, Any] | None = Field(
        None,
        validate_default=True,  # a schedule that needs arguments is checked without them too
        description="Arguments of the schedule (transformers' names), e.g. "
        '{"num_cycles": 3} for cosine_with_restarts; cosine_with_min_lr needs min_lr or '
        "min_lr_rate, warmup_stable_decay needs num_decay_steps. See docs/training.md.",
    )
    max_seq_length: int | None = Field(
        None, ge=16, le=MAX_SEQ_LENGTH, description="Tokens per packed row (and per example)."
    )
    dataloader_num_workers: int | None = Field(
        None, ge=0, le=MAX_WORKERS, description="Data-loader processes (at most 4 per CPU)."
    )
    dataloader_pin_memory: bool | None = Field(None, description="Pin host memory of batches.")
    dataloader_prefetch_factor: int | None = Field(
        None, ge=1, le=64, description="Batches per worker."
    )
    dataloader_persistent_workers: bool | None = Field(None, description="Keep workers alive.")
    fp16: bool | None = Field(
        None,
        description="fp16 mixed precision. Unset: on where the GPU has no bf16 and bf16 is "
        "not asked for.",
    )
    bf16: bool | None = Field(
        None,
        description="bf16 mixed precision. Unset: on where the GPU has it (Ampere and newer) "
        "and fp16 is not asked for; true on a GPU without it runs fp16, with a note.",
    )
    use_tf32: bool | None = Field(None, description="TF32 matmuls on Ampere and newer.")
    use_sdpa: bool | None = Field(None, description="PyTorch scaled-dot-product attention.")
    flash_attention_2: bool | None = Field(None, description="flash-attn 2 (varlen for packing).")
    packing: bool | None = Field(None, description="Pack examples into full rows (default on).")
    group_by_length: bool | None = Field(
        None, description="Batch similar lengths; not needed with packing."
    )
    gradient_checkpointing: Annotated[bool | str, BeforeValidator(_checkpointing)] | None = Field(
        None,
        description='Recompute activations: true, false, or "full" (true), "selective" or '
        '"unsloth" (both run as true: whole decoder layers are recomputed), "none" (false).',
    )
    gradient_checkpointing_kwargs: CheckpointingKwargs | None = Field(
        None, description="Options of the recomputation (see its fields)."
    )
    logging_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="Steps per logging window."
    )
    save_strategy: Literal["no", "steps", "epoch", "best"] | None = Field(
        None, description="When to save checkpoints."
    )
    save_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="Steps between checkpoints."
    )
    save_total_limit: int | None = Field(
        None, ge=1, le=10_000, description="Checkpoints kept (None = all)."
    )
    evaluation_strategy: Strategy | None = Field(
        None, alias="eval_strategy", description="When to evaluate (alias eval_strategy)."
    )
    eval_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="Steps between evaluations."
    )
    load_best_model_at_end: bool | None = Field(
        None,
        description="End with the checkpoint of the lowest eval loss as the final adapter "
        "(checkpoints must fall on evaluations: save_steps a multiple of eval_steps).",
    )
    eval_on_start: bool | None = Field(
        None,
        description="Extension: evaluate once before the first step: the eval loss every "
        "later one is measured against (the base model's; with init_adapter, that adapter's).",
    )
    metric_for_best_model: str | None = Field(
        None,
        description="Metric for the best checkpoint: the loss, `eval_loss` (token accuracy is "
        "reported, not chosen by), or a multi_task expert's task's, `eval_<task>_loss` "
        "(another name stopped the run at its first evaluation).",
    )
    greater_is_better: bool | None = Field(
        None, description="Direction of that metric: false (a loss is better lower)."
    )
    torch_compile: bool | None = Field(
        None,
        description="torch.compile each decoder layer (regional). Default: off (measured "
        "slower than Liger's kernels on an H100, docs/PERFORMANCE.md).",
    )
    torch_compile_backend: str | None = Field(None, description="torch.compile backend.")
    torch_compile_mode: str | None = Field(None, description="torch.compile mode.")
    pretokenized_cache: str | None = Field(
        None, description="Folder of token caches (default: .cache/pretokenized by the manifest)."
    )
    # runtime hints of the format: acted on where we can, else reported as not applicable
    use_unsloth: bool | None = Field(None, description="Hint; Unsloth is not integrated.")
    memory_efficient_attention: bool | None = Field(None, description="Hint; SDPA covers it.")
    memory_clear_every: int | None = Field(
        None, ge=0, le=MAX_STEPS, description="Empty the CUDA cache every N steps (0 = never)."
    )
    activation_checkpointing: str | bool | None = Field(
        None, description="Hint; whole-layer gradient_checkpointing is what is applied."
    )
    use_cuda_graphs: bool | None = Field(None, description="Hint; not applied (dynamic shapes).")
    cuda_graph_warmup_steps: int | None = Field(
        None, ge=0, le=MAX_STEPS, description="Hint; see above."
    )
    # expert-cli extensions
    report_to: Annotated[list[Tracker], BeforeValidator(one_or_many)] | None = Field(
        None,
        description="Extension: experiment trackers the Trainer logs to, besides metrics.json "
        "and TensorBoard (OUTPUT/runs): " + ", ".join(TRACKERS) + "; each must be installed "
        "(WANDB_PROJECT and the like configure them).",
        max_length=len(TRACKERS),
    )
    seed: int = Field(
        42, ge=0, lt=2**32, description="Extension: seed for data order, eval split and init."
    )
    init_adapter: str | None = Field(
        None,
        min_length=1,
        description="Extension: start the adapter from one trained before (its weights; the "
        "optimizer starts afresh): a folder holding adapter_config.json and "
        "adapter_model.safetensors (a run's output, one of its checkpoints), relative to the "
        "manifest; of this run's type, rank, alpha and layers (LoRA, DoRA).",
    )
    neftune_noise_alpha: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Extension: NEFTune's noise on the input embeddings while training, "
        "uniform within alpha / sqrt(L d), L each example's own length (in a packed row too).",
    )
    label_smoothing_factor: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Extension: label smoothing (the Trainer's name): each trained token's "
        "target is 1 - f on the next token and f spread over the vocabulary. Training only: "
        "the logged loss includes it, evaluations do not. Needs a fused_loss (on a CPU, "
        "chunked is chosen for it).",
    )
    tokens_per_step: int | None = Field(
        None,
        ge=16,
        le=1 << 24,
        description="Extension: tokens per optimizer step per device "
        "when batch_size is auto (default 32768: 16 rows of 2048).",
    )
    early_stopping_patience: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Extension: stop training once the evaluation loss has not improved "
        "(by more than early_stopping_threshold) for this many evaluations in a row. Needs "
        "evaluations; with load_best_model_at_end the best checkpoint is the final adapter.",
    )
    early_stopping_threshold: float | None = Field(
        None,
        ge=0,
        le=1e6,
        description="Extension: how much lower an evaluation loss must be to count as an "
        "improvement for early_stopping_patience (default 0).",
    )
    micro_batch: Literal["auto", "fixed"] | None = Field(
        None,
        description="Extension: with a numeric batch_size and gradient_accumulation_steps "
        "above 1, on a GPU. auto (default): batch_size x gradient_accumulation_steps rows "
        "make the optimizer step, and each micro-step takes as many of them as the GPU's "
        "memory holds (a short probe at start; a larger micro-batch keeps the GPU busier, "
        "and the same rows and loss make each step); fixed: batch_size rows a micro-step, as "
        "given.",
    )
    attention: AttentionKernel | None = Field(
        None,
        description="Extension: attention kernel for packed rows. auto (default): the "
        "fastest correct one this machine has (flash_attention_4, flash_attention_2, "
        "torch_varlen, flex_attention, sdpa); each keeps tokens within their own example.",
    )
    adapter_precision: Literal["compute", "fp32"] | None = Field(
        None,
        description="Extension: dtype the adapters compute in. compute (default with "
        "bf16/fp16): the mixed-precision dtype, no fp32 copy of each adapter's input; fp32: "
        "peft's upcast. Adapter weights and optimizer state stay fp32 either way.",
    )
    adapter_kernel: Literal["peft", "fused", "grouped"] | None = Field(
        None,
        description="Extension: how LoRA and DoRA linear layers run. fused (default on a GPU, "
        "not under FSDP/DeepSpeed nor with adapter_precision fp32 under bf16/fp16): one autograd "
        "function a layer, the scaled update accumulated into the base matmul (DoRA: its "
        "magnitude applied to the weights), forward and backward (unquantized or int4, any "
        "dropout; others keep peft's); grouped: fused, and the plain LoRA layers that read one "
        "input (q, k, v; gate, up) as one function; peft (default on a CPU): peft's forward.",
    )
    fused_loss: FusedLoss | None = Field(
        None,
        description="Extension: the loss without full-vocabulary logits. auto (default): "
        "Liger's cross-entropy kernel, in expert-cli's own loop, on a GPU where liger-kernel "
        "is installed, else "
        "chunked (expert-cli's own, plain torch); the standard loss on a CPU. off keeps the "
        "standard loss.",
    )
    liger_kernels: bool | None = Field(
        None,
        description="Extension: Liger's fused RMSNorm, SwiGLU and RoPE kernels "
        "(GPU, liger-kernel installed, a model type Liger supports). Default: on where usable.",
    )

    @field_validator("metric_for_best_model")
    @classmethod
    def _a_loss(cls, value: str | None) -> str | None:
        if value is None or value in ("eval_loss", "loss") or re.fullmatch(r"eval_.+_loss", value):
            return value
        raise ValueError("expected eval_loss, loss, or a task's eval_<task>_loss")

    @field_validator("init_lora_weights")
    @classmethod
    def _lora_init(cls, value: str | None) -> str | None:
        if value is not None and not LORA_INIT.fullmatch(value):
            raise ValueError(
                "expected default, gaussian, pissa, pissa_niter_N (N from 1 to 99) or olora"
            )
        return value

    @field_validator("lr_scheduler_kwargs")
    @classmethod
    def _schedule_arguments(
        cls, value: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        """Only arguments the schedule takes, each in its range, and every argument the
        schedule cannot run without (transformers would stop the run when it builds the
        schedule, after the model has loaded). Checked here, at this field, so that an error
        names it (and the `--set` that gave it)."""
        if "lr_scheduler" not in info.data:
            return value  # the schedule itself is wrong: that error is enough
        if problem := schedule_arguments_problem(info.data["lr_scheduler"] or "cosine", value):
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        if self.fp16 and self.bf16:
            raise ValueError("fp16 and bf16 are both true; choose one")
        if self.epochs and self.num_epochs and self.epochs != self.num_epochs:
            raise ValueError("epochs and num_epochs differ; give one of them")
        for name in ("load_best_model_at_end", "early_stopping_patience", "eval_on_start"):
            if getattr(self, name) and self.evaluation_strategy == "no":
                raise ValueError(f"{name} needs evaluation_strategy steps or epoch")
        if self.early_stopping_threshold is not None and not self.early_stopping_patience:
            raise ValueError("early_stopping_threshold is read with early_stopping_patience only")
        if self.label_smoothing_factor and self.fused_loss == "off":
            raise ValueError(
                "label_smoothing_factor is applied in the fused loss, which fused_loss off "
                "turns off (transformers' own loss has no smoothing); leave fused_loss unset"
            )
        if self.greater_is_better:
            raise ValueError(
                "greater_is_better: true would call the checkpoint of the highest loss the "
                "best; a loss is better lower: false, or leave it unset"
            )
        return self


class DistributedSpec(Strict):
    """Extension `training.distributed`: multi-GPU engines, passed to the Trainer."""

    strategy: Literal["ddp", "fsdp", "deepspeed"] = Field("ddp", description="Engine.")
    fsdp: str | None = Field(None, description='FSDP options, e.g. "full_shard auto_wrap".')
    fsdp_config: dict[str, Any] | None = Field(None, description="Trainer fsdp_config.")
    deepspeed: str | dict[str, Any] | None = Field(
        None, description="DeepSpeed config file (relative to the manifest) or object."
    )
    ddp_find_unused_parameters: bool | None = Field(None, description="DDP option.")
