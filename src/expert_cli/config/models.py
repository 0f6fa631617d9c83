"""The HiveLLM expert manifest as Pydantic models, with their checks beside them.

The manifest becomes these models once, here; nothing else reads raw manifest dicts. The
blocks the trainer acts on (base model, adapters, `training.dataset`, `training.config`) reject
unknown keys; the metadata blocks are accepted and kept as they are. Keys that start with `_`
are comments at any depth and are dropped before validation. Choices that depend on the
machine are made in `expert_cli.config.resolve`, not here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from expert_cli.config.base import (
    FILE_NAME_PART_RULE,
    MAX_JSON_INT,
    PROMPT_TEMPLATE_ALIASES,
    AdapterType,
    FileNamePart,
    ModuleNames,
    Probability,
    PromptTemplate,
    Quantization,
    Strict,
    plain_json,
)
from expert_cli.config.decoding import DecodingSpec
from expert_cli.config.training_config import DistributedSpec, TrainingConfig

MAX_TASK_WEIGHT = 100
DataFormat = Literal["jsonl", "json", "huggingface", "csv", "parquet", "arrow"]

# --------------------------------------------------------------------------- base model


class AdapterSpec(Strict):
    """One entry of `adapters[]` (v1.0 top level, v2.0 inside `base_models[]`)."""

    type: AdapterType = Field("lora", description="Adapter type.")
    target_modules: ModuleNames | Literal["all-linear"] | None = Field(
        None, description='Module names to adapt, or "all-linear" (the default).'
    )
    feedforward_modules: list[str] | None = Field(
        None, description="Feed-forward modules (IA3 only)."
    )
    r: int | None = Field(None, ge=1, le=1024, description="Rank (LoRA, DoRA, LoKr, AdaLoRA).")
    alpha: float | None = Field(
        None, gt=0, le=1e6, description="Scaling numerator: scale = alpha / r."
    )
    scaling: str | None = Field(None, description="Descriptive scaling name; kept, not acted on.")
    dropout: Probability | None = Field(None, description="Dropout on the adapter input.")
    use_dora: bool | None = Field(None, description="Weight-decomposed LoRA (DoRA).")
    path: str | None = Field(
        None,
        description="Where packaged weights lived (HiveLLM's loader reads them at the "
        "package root); accepted, left out of a package.",
    )
    checkpoint_step: int | None = Field(
        None, ge=0, le=10**12, description="Packaged checkpoint; kept."
    )
    size_bytes: int | None = Field(None, ge=0, le=2**60, description="Packaged size; kept.")
    sha256: str | None = Field(None, description="Packaged hash; kept.")


class BaseModelSpec(Strict):
    """The base model: `base_model` (v1.0) or one entry of `base_models[]` (v2.0)."""

    name: str = Field(
        description="Hub id (owner/name) or local folder, relative to the manifest's folder."
    )
    sha256: str | None = Field(None, description="Hash of the weights; kept, not checked.")
    quantization: Quantization | None = Field(
        None,
        description="int4 = QLoRA (NF4), int8 = 8-bit, else full weights in that dtype. A base "
        "stored in bitsandbytes 4-bit or 8-bit (a `-bnb-4bit` model) needs int4 or int8; one "
        "stored by another method (GPTQ, AWQ, FP8) is not trained on.",
    )
    rope_scaling: str | dict[str, Any] | None = Field(
        None, description="Inference-time RoPE scaling; kept, not applied when training."
    )
    prompt_template: PromptTemplate | None = Field(
        None,
        description="Template for instruction/input/response data (qwen3 = chatml; "
        "chat_template: the tokenizer's own chat template, an extension).",
    )
    adapters: list[AdapterSpec] = Field(default_factory=list, description="Adapters (v2.0).")
    # expert-cli extensions
    chat_template: str | None = Field(
        None,
        min_length=1,
        description="Extension: the chat template conversations are laid out by, in place "
        'of the tokenizer\'s: "chatml", or a Jinja file relative to the manifest (a base '
        "without one).",
    )
    revision: str | None = Field(None, description="Extension: hub revision (branch/tag/sha).")
    trust_remote_code: bool = Field(False, description="Extension: allow the model's own code.")
    init: Literal["pretrained", "random"] = Field(
        "pretrained",
        description="Extension: 'random' builds the architecture in `name`'s config.json "
        "(a folder, or a hub model: no weights downloaded) with random weights (demo and "
        "benchmarks).",
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
    test: str | None = Field(None, description="Test file of this task: what `evaluate` scores.")
    weight: float = Field(
        1.0,
        gt=0,
        le=MAX_TASK_WEIGHT,
        description="Sampling weight: below 1 samples a fraction, above 1 repeats (at most "
        f"{MAX_TASK_WEIGHT} times).",
    )
    format: DataFormat | None = Field(None, description="File format of this task (as `format`).")


class DatasetSpec(Strict):
    """`training.dataset`."""

    path: str | None = Field(
        None,
        description="Local file/folder (relative to the manifest) or hub id "
        "`name`, `name::split` or `name::split::config`.",
    )
    type: Literal["single", "multi_task"] = Field("single", description="One source or tasks.")
    tasks: dict[str, TaskSpec] | None = Field(None, description="Tasks of a multi_task dataset.")
    format: DataFormat | None = Field(
        None, description="Source format; guessed from the file name when unset."
    )
    streaming: bool = Field(
        False, description="Accepted; the token cache is built from the whole dataset."
    )
    field_mapping: dict[str, str] | None = Field(
        None,
        description='Which columns hold the data: {"text": col}, {"instruction": col, '
        '"input": col, "response": col} or {"messages": col} (and "tools": col; "response": '
        "col for the turns that answer the conversation, TRL's conversational prompt and "
        'completion; "system": col for its system prompt).',
    )
    validation_path: str | None = Field(None, description="Validation file or hub id.")
    validation_split: float | None = Field(
        None,
        ge=0.0,
        lt=0.5,
        description="Fraction of the training examples held out for evaluation when there is "
        "no validation_path (as eval_fraction).",
    )
    test_path: str | None = Field(
        None, description="Test file or hub id: what `evaluate` scores, after training."
    )
    max_in_memory_samples: int | None = Field(
        None,
        ge=0,
        le=MAX_JSON_INT,
        description="Streaming hint; not needed: the token cache is read memory-mapped.",
    )
    use_pretokenized: bool | None = Field(
        None, description="Train from the token cache; it is always used (false is reported)."
    )
    # expert-cli extensions
    revision: str | None = Field(None, description="Extension: hub dataset revision.")
    eval_fraction: float | None = Field(
        None,
        ge=0.0,
        lt=0.5,
        description="Extension: fraction held out for evaluation when no validation_path.",
    )
    eval_seed: int | None = Field(
        None,
        ge=0,
        lt=2**32,
        description="Extension: seed of the held-out examples (default 42, whatever "
        "training.config.seed is: runs that differ only in seed evaluate on the same examples).",
    )
    overlong: Literal["truncate", "drop", "split"] = Field(
        "truncate",
        description="Extension: what to do with examples over max_seq_length: cut them to it, "
        "leave them out, or split them into pieces of it, each trained as an example.",
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
    generation: Any = Field(None, description="Descriptive (how the data was generated); kept.")
    error_injection_ratio: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Share of examples with injected errors, as the data was made; reported, "
        "not applied (the data is trained as it is).",
    )
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
        if self.type == "multi_task" and self.validation_path:  # it was never read
            raise ValueError(
                "validation_path is not read with type multi_task; give each task its own "
                "`valid` file (tasks.NAME.valid)"
            )
        if self.type == "single" and not (self.path or "").strip():
            raise ValueError("`path` is required (a local file or a hub dataset id)")
        return self

    @field_validator("eval_fraction")
    @classmethod
    def _one_fraction(cls, value: float | None, info: ValidationInfo) -> float | None:
        split = info.data.get("validation_split")
        if split is not None and value is not None and split != value:
            raise ValueError(
                f"{value:g} differs from validation_split ({split:g}), which means the same; "
                "give one of them"
            )
        return value

    @property
    def held_out(self) -> float | None:
        """The fraction to hold out, as either name gives it (None when neither does)."""
        return self.eval_fraction if self.eval_fraction is not None else self.validation_split


CHECKPOINT_NAME = re.compile(r"checkpoint-[0-9]{1,12}|final")  # HiveLLM's packaging_checkpoint
# what the manifest may name: HiveLLM's names, or best (`package` writes the one it picks)
PACKAGING_CHOICE = re.compile(r"checkpoint-[0-9]{1,12}|final|best")
PACKAGING_CHOICES = "checkpoint-N (e.g. checkpoint-500), final, or best (the lowest eval loss)"


def _checkpoint_name(value: str) -> str:
    if not PACKAGING_CHOICE.fullmatch(value):
        raise ValueError(f"expected {PACKAGING_CHOICES}")
    return value


class TrainingSpec(BaseModel):
    """`training`: dataset and config are acted on; the format's descriptive keys are kept;
    any other key is an error (a misspelt `confg` would otherwise train on every default)."""

    model_config = ConfigDict(extra="forbid")

    dataset: DatasetSpec
    config: TrainingConfig = Field(default_factory=TrainingConfig)
    decoding: DecodingSpec | None = Field(
        None, description="Inference settings (see `training.decoding`)."
    )
    distributed: DistributedSpec | None = Field(None, description="Extension: multi-GPU.")
    # descriptive keys of the HiveLLM format (its schema's `Training` and the experts' own)
    trained_on: Any = Field(None, description="Descriptive (date of training); kept.")
    base_model_version: Any = Field(None, description="Descriptive; kept.")
    packaging_checkpoint: Annotated[str, AfterValidator(_checkpoint_name)] | None = Field(
        None,
        description="What `package` ships: checkpoint-N (that checkpoint's adapter), final "
        "(the run's adapter, the default) or best (the kept adapter of lowest eval loss; the "
        "package records the one shipped); read from the manifest file as it is when packaging.",
    )
    checkpoint: Any = Field(None, description="Descriptive; kept.")
    alternative_checkpoints: Any = Field(None, description="Descriptive; kept.")
    quality_score: Any = Field(None, description="Descriptive; kept.")
    test_scenarios: Any = Field(None, description="Descriptive; kept.")
    metadata: Any = Field(None, description="Descriptive (training time, GPU); kept.")


# --------------------------------------------------------------------------- manifest


class Manifest(BaseModel):
    """A HiveLLM expert manifest, schema 1.0 or 2.0."""

    model_config = ConfigDict(extra="allow")

    name: FileNamePart = Field(
        description=f"Expert name, e.g. expert-sql: {FILE_NAME_PART_RULE}. HiveLLM's own "
        "experts are named expert- and lowercase letters, digits and dashes."
    )
    version: FileNamePart = Field(
        "0.0.0", description="Expert version, e.g. 0.1.0 (HiveLLM: major.minor.patch); as name."
    )
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

    @model_validator(mode="before")
    @classmethod
    def _plain_json(cls, data: Any) -> Any:
        """Every value, comments included (packages carry them), finite and valid Unicode;
        then the comments dropped."""
        return plain_json(cls.__name__, data)

    @model_validator(mode="after")
    def _one_base_model(self) -> Manifest:
        if self.schema_version == "2.0":
            if not self.base_models:
                raise ValueError("schema 2.0 needs `base_models` (a list with one entry or more)")
            if self.base_model is not None:
                raise ValueError("schema 2.0 uses `base_models`, not `base_model`")
            if self.adapters and self.base_models[0].adapters:  # the top-level list: unread
                raise ValueError(
                    "schema 2.0 reads base_models[0].adapters; the top-level `adapters` (1.0's) "
                    "beside it would be shipped but never trained: remove one"
                )
        elif self.base_model is None:
            raise ValueError("schema 1.0 needs `base_model` {name, ...}")
        elif self.base_models:
            raise ValueError("schema 1.0 uses `base_model`, not `base_models` (2.0's): give one")
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


# --------------------------------------------------------------------------- a package's


class LoadedManifest(BaseModel):
    """A validated manifest with where it came from (paths resolve against `folder`)."""

    manifest: Manifest
    path: Path
    raw: dict[str, Any] = Field(description="The JSON as read, comments included.")

    @property
    def folder(self) -> Path:
        return self.path.parent
