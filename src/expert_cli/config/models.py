"""The HiveLLM expert manifest as Pydantic models, with their checks beside them.

The manifest becomes these models once, here; nothing else reads raw manifest dicts. The
blocks the trainer acts on (base model, adapters, `training.dataset`, `training.config`) reject
unknown keys; the metadata blocks are accepted and kept as they are. Keys that start with `_`
are comments at any depth and are dropped before validation. Choices that depend on the
machine are made in `expert_cli.resolve`, not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

AdapterType = Literal["lora", "dora", "ia3", "lokr", "adalora"]
Quantization = Literal["int4", "int8", "fp16", "bf16", "none"]
PromptTemplate = Literal["chatml", "llama2", "alpaca", "vicuna", "custom"]
# Names used by existing manifests for a template we implement under another name.
PROMPT_TEMPLATE_ALIASES = {"qwen": "chatml", "qwen2": "chatml", "qwen3": "chatml"}
Scheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
]
Optimizer = Literal[
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "adafactor",
    "sgd",
    "lion_8bit",
    "lion_32bit",
]
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
Probability = Annotated[float, Field(ge=0.0, lt=1.0)]
MAX_BATCH_ROWS = 4096


def _rows_or_auto(value: Any) -> Any:
    """`batch_size`: a whole number of rows (1 to 4096) or "auto"; one clear error otherwise."""
    if value is None or value == "auto":
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_ROWS:
        raise ValueError(
            f'expected a whole number of rows from 1 to {MAX_BATCH_ROWS}, or "auto" (got {value!r})'
        )
    return value


class Strict(BaseModel):
    """A block the trainer acts on: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --------------------------------------------------------------------------- base model


class AdapterSpec(Strict):
    """One entry of `adapters[]` (v1.0 top level, v2.0 inside `base_models[]`)."""

    type: AdapterType = Field("lora", description="Adapter type.")
    target_modules: list[str] | Literal["all-linear"] | None = Field(
        None, description='Module names to adapt, or "all-linear".'
    )
    feedforward_modules: list[str] | None = Field(
        None, description="Feed-forward modules (IA3 only)."
    )
    r: int | None = Field(None, ge=1, le=1024, description="Rank (LoRA, DoRA, LoKr, AdaLoRA).")
    alpha: float | None = Field(None, gt=0, description="Scaling numerator: scale = alpha / r.")
    scaling: str | None = Field(None, description="Descriptive scaling name; kept, not acted on.")
    dropout: Probability | None = Field(None, description="Dropout on the adapter input.")
    use_dora: bool | None = Field(None, description="Weight-decomposed LoRA (DoRA).")
    path: str | None = Field(None, description="Where packaged weights live; kept.")
    checkpoint_step: int | None = Field(None, ge=0, description="Packaged checkpoint; kept.")
    size_bytes: int | None = Field(None, ge=0, description="Packaged size; kept.")
    sha256: str | None = Field(None, description="Packaged hash; kept.")


class BaseModelSpec(Strict):
    """The base model: `base_model` (v1.0) or one entry of `base_models[]` (v2.0)."""

    name: str = Field(
        description="Hub id (owner/name) or local folder, relative to the manifest's folder."
    )
    sha256: str | None = Field(None, description="Hash of the weights; kept, not checked.")
    quantization: Quantization | None = Field(
        None, description="int4 = QLoRA (NF4), int8 = 8-bit, else full weights in that dtype."
    )
    rope_scaling: str | dict[str, Any] | None = Field(
        None, description="Inference-time RoPE scaling; kept, not applied when training."
    )
    prompt_template: PromptTemplate | None = Field(
        None, description="Template for instruction/input/response data (qwen3 = chatml)."
    )
    adapters: list[AdapterSpec] = Field(default_factory=list, description="Adapters (v2.0).")
    # expert-cli extensions
    revision: str | None = Field(None, description="Extension: hub revision (branch/tag/sha).")
    trust_remote_code: bool = Field(False, description="Extension: allow the model's own code.")
    init: Literal["pretrained", "random"] = Field(
        "pretrained",
        description="Extension: 'random' builds the architecture in `name`'s config.json "
        "with random weights (demo and benchmarks).",
    )

    @model_validator(mode="before")
    @classmethod
    def _template_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("prompt_template"), str):
            key = data["prompt_template"].lower()
            data = {**data, "prompt_template": PROMPT_TEMPLATE_ALIASES.get(key, key)}
        return data


# --------------------------------------------------------------------------- dataset


class TaskSpec(Strict):
    """One task of a `multi_task` dataset."""

    train: str = Field(description="Training file or hub id of this task.")
    valid: str | None = Field(None, description="Validation file of this task.")
    test: str | None = Field(None, description="Test file of this task; kept.")
    weight: float = Field(
        1.0, gt=0, description="Sampling weight: below 1 samples a fraction, above 1 repeats."
    )
    format: str | None = Field(None, description="File format of this task (as `format`).")


class DatasetSpec(Strict):
    """`training.dataset`."""

    path: str | None = Field(
        None,
        description="Local file/folder (relative to the manifest) or hub id "
        "`name`, `name::split` or `name::split::config`.",
    )
    type: Literal["single", "multi_task"] = Field("single", description="One source or tasks.")
    tasks: dict[str, TaskSpec] | None = Field(None, description="Tasks of a multi_task dataset.")
    format: Literal["jsonl", "json", "huggingface", "csv", "parquet", "arrow"] | None = Field(
        None, description="Source format; guessed from the file name when unset."
    )
    streaming: bool = Field(
        False, description="Accepted; the token cache is built from the whole dataset."
    )
    field_mapping: dict[str, str] | None = Field(
        None,
        description='Which columns hold the data: {"text": col}, {"instruction": col, '
        '"input": col, "response": col} or {"messages": col}.',
    )
    validation_path: str | None = Field(None, description="Validation file or hub id.")
    test_path: str | None = Field(None, description="Test file; kept, not used in training.")
    # expert-cli extensions
    revision: str | None = Field(None, description="Extension: hub dataset revision.")
    eval_fraction: float | None = Field(
        None,
        ge=0.0,
        lt=0.5,
        description="Extension: fraction held out for evaluation when no validation_path.",
    )
    overlong: Literal["truncate", "drop"] = Field(
        "truncate", description="Extension: what to do with examples over max_seq_length."
    )
    response_template: str | None = Field(
        None,
        description="Extension: marker after which `text` examples are trained on "
        "(default: detected assistant marker).",
    )
    # descriptive blocks: kept, not acted on
    source: Any = Field(None, description="Descriptive; kept.")
    sources: Any = Field(None, description="Descriptive; kept.")
    splits: Any = Field(None, description="Descriptive; kept.")
    preprocessing: Any = Field(None, description="Descriptive; kept.")
    validation: Any = Field(None, description="Descriptive validation rules; kept.")
    augmentation: Any = Field(None, description="Descriptive; kept.")
    distributions: dict[str, Any] = Field(
        default_factory=dict, description="Every `*_distribution` key, kept."
    )

    @model_validator(mode="before")
    @classmethod
    def _collect_distributions(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        dist = {k: v for k, v in data.items() if k.endswith("_distribution")}
        if not dist:
            return data
        rest = {k: v for k, v in data.items() if k not in dist}
        return {**rest, "distributions": {**rest.get("distributions", {}), **dist}}

    @model_validator(mode="after")
    def _source_given(self) -> DatasetSpec:
        if self.type == "multi_task" and not self.tasks:
            raise ValueError("type multi_task needs a non-empty `tasks` object")
        if self.type == "single" and not self.path:
            raise ValueError("`path` is required (a local file or a hub dataset id)")
        return self


# --------------------------------------------------------------------------- training.config


class TrainingConfig(Strict):
    """`training.config`: hyperparameters. Unset (None) means "pick the best for this machine"."""

    method: Literal["sft"] = Field("sft", description="Training method; only sft is built.")
    adapter_type: AdapterType | None = Field(
        None, description="Adapter type; defaults to the base model's first adapter, else lora."
    )
    rank: int | None = Field(None, ge=1, le=1024, description="Adapter rank r.")
    alpha: float | None = Field(None, gt=0, description="LoRA alpha (scale = alpha / rank).")
    dropout: Probability | None = Field(None, description="Adapter dropout.")
    target_modules: list[str] | Literal["all-linear"] | None = Field(
        None, description='Modules to adapt, or "all-linear".'
    )
    feedforward_modules: list[str] | None = Field(None, description="IA3 feed-forward modules.")
    epochs: float | None = Field(None, gt=0, description="Epochs; fractions allowed.")
    num_epochs: float | None = Field(None, gt=0, description="Alias of epochs.")
    max_steps: int | None = Field(
        None, ge=0, description="Optimizer steps; overrides epochs when > 0."
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
    warmup_steps: int | None = Field(None, ge=0, description="Warmup steps.")
    warmup_ratio: float | None = Field(
        None, ge=0, le=1, description="Warmup as a fraction of all steps; wins over warmup_steps."
    )
    lr_scheduler: Scheduler | None = Field(None, description="Learning-rate schedule.")
    max_seq_length: int | None = Field(
        None, ge=16, description="Tokens per packed row (and per example)."
    )
    dataloader_num_workers: int | None = Field(None, ge=0, description="Data-loader processes.")
    dataloader_pin_memory: bool | None = Field(None, description="Pin host memory of batches.")
    dataloader_prefetch_factor: int | None = Field(None, ge=1, description="Batches per worker.")
    dataloader_persistent_workers: bool | None = Field(None, description="Keep workers alive.")
    fp16: bool | None = Field(None, description="fp16 mixed precision.")
    bf16: bool | None = Field(None, description="bf16 mixed precision.")
    use_tf32: bool | None = Field(None, description="TF32 matmuls on Ampere and newer.")
    use_sdpa: bool | None = Field(None, description="PyTorch scaled-dot-product attention.")
    flash_attention_2: bool | None = Field(None, description="flash-attn 2 (varlen for packing).")
    packing: bool | None = Field(None, description="Pack examples into full rows (default on).")
    optim: Optimizer | None = Field(None, description="Optimizer (Trainer's names).")
    group_by_length: bool | None = Field(
        None, description="Batch similar lengths; not needed with packing."
    )
    gradient_checkpointing: bool | None = Field(None, description="Recompute activations.")
    logging_steps: int | None = Field(None, ge=1, description="Steps per logging window.")
    save_strategy: Literal["no", "steps", "epoch", "best"] | None = Field(
        None, description="When to save checkpoints."
    )
    save_steps: int | None = Field(None, ge=1, description="Steps between checkpoints.")
    save_total_limit: int | None = Field(None, ge=1, description="Checkpoints kept (None = all).")
    evaluation_strategy: Strategy | None = Field(
        None, alias="eval_strategy", description="When to evaluate (alias eval_strategy)."
    )
    eval_steps: int | None = Field(None, ge=1, description="Steps between evaluations.")
    load_best_model_at_end: bool | None = Field(None, description="Keep the best checkpoint.")
    metric_for_best_model: str | None = Field(None, description="Metric for the best model.")
    greater_is_better: bool | None = Field(None, description="Direction of that metric.")
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
        None, ge=0, description="Empty the CUDA cache every N steps (0 = never)."
    )
    activation_checkpointing: str | bool | None = Field(
        None, description="Hint; whole-layer gradient_checkpointing is what is applied."
    )
    use_cuda_graphs: bool | None = Field(None, description="Hint; not applied (dynamic shapes).")
    cuda_graph_warmup_steps: int | None = Field(None, ge=0, description="Hint; see above.")
    # expert-cli extensions
    seed: int = Field(42, description="Extension: seed for data order, eval split and init.")
    weight_decay: float = Field(0.0, ge=0, description="Extension: AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Extension: gradient clipping norm.")
    tokens_per_step: int | None = Field(
        None,
        ge=16,
        le=1 << 24,
        description="Extension: tokens per optimizer step per device "
        "when batch_size is auto (default 32768: 16 rows of 2048).",
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
    fused_loss: FusedLoss | None = Field(
        None,
        description="Extension: the loss without full-vocabulary logits. auto (default): "
        "Liger's fused linear cross-entropy on a GPU where liger-kernel is installed, else "
        "chunked (expert-cli's own, plain torch); the standard loss on a CPU. off keeps the "
        "standard loss.",
    )
    liger_kernels: bool | None = Field(
        None,
        description="Extension: Liger's fused RMSNorm, SwiGLU and RoPE kernels "
        "(GPU, liger-kernel installed, a model type Liger supports). Default: on where usable.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        if self.fp16 and self.bf16:
            raise ValueError("fp16 and bf16 are both true; choose one")
        if self.epochs and self.num_epochs and self.epochs != self.num_epochs:
            raise ValueError(f"epochs ({self.epochs}) and num_epochs ({self.num_epochs}) differ")
        if self.load_best_model_at_end and self.evaluation_strategy == "no":
            raise ValueError("load_best_model_at_end needs evaluation_strategy steps or epoch")
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


class TrainingSpec(BaseModel):
    """`training`: dataset and config are acted on; every other key is kept."""

    model_config = ConfigDict(extra="allow")

    dataset: DatasetSpec
    config: TrainingConfig = Field(default_factory=TrainingConfig)
    decoding: dict[str, Any] | None = Field(None, description="Inference settings; kept.")
    distributed: DistributedSpec | None = Field(None, description="Extension: multi-GPU.")


# --------------------------------------------------------------------------- manifest


class Manifest(BaseModel):
    """A HiveLLM expert manifest, schema 1.0 or 2.0."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="Expert name, e.g. expert-sql.")
    version: str = Field("0.0.0", description="Expert version.")
    schema_version: Literal["1.0", "2.0"] = Field("1.0", description="Manifest schema.")
    description: str | None = None
    author: str | None = None
    homepage: str | None = None
    repository: Any = None
    license: str | None = None
    tags: list[str] = Field(default_factory=list)
    base_model: BaseModelSpec | None = Field(None, description="v1.0 base model.")
    base_models: list[BaseModelSpec] | None = Field(None, description="v2.0 base models.")
    adapters: list[AdapterSpec] | None = Field(None, description="v1.0 adapters.")
    training: TrainingSpec
    # metadata blocks: accepted and kept
    capabilities: Any = None
    routing: Any = None
    constraints: Any = None
    perf: Any = None
    runtime: Any = None
    limitations: Any = None
    quality_metrics: Any = None
    evaluation: Any = None
    integrity: Any = None
    soft_prompts: Any = None

    @model_validator(mode="after")
    def _one_base_model(self) -> Manifest:
        if self.schema_version == "2.0":
            if not self.base_models:
                raise ValueError("schema 2.0 needs `base_models` (a list with one entry or more)")
            if self.base_model is not None:
                raise ValueError("schema 2.0 uses `base_models`, not `base_model`")
        elif self.base_model is None:
            raise ValueError("schema 1.0 needs `base_model` {name, ...}")
        return self

    @property
    def primary_base_model(self) -> BaseModelSpec:
        """The base model training uses: v1.0's `base_model`, or v2.0's first entry."""
        return self.base_models[0] if self.base_models else self.base_model  # type: ignore[return-value]

    @property
    def primary_adapter(self) -> AdapterSpec | None:
        """The first adapter declared for the primary base model, if any."""
        adapters = self.primary_base_model.adapters or (self.adapters or [])
        return adapters[0] if adapters else None


class LoadedManifest(BaseModel):
    """A validated manifest with where it came from (paths resolve against `folder`)."""

    manifest: Manifest
    path: Path
    raw: dict[str, Any] = Field(description="The JSON as read, comments included.")

    @property
    def folder(self) -> Path:
        return self.path.parent
