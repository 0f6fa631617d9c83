"""The manifest: Pydantic models (models.py) and reading a file into them (loading.py).

The manifest becomes these models once, here; nothing else reads raw manifest dicts.
"""

from expert_cli.config.loading import (
    apply_overrides,
    format_errors,
    load_manifest,
    local_path,
    looks_like_hub_id,
    parse_override,
    read_manifest_json,
    split_hub_spec,
    strip_comments,
)
from expert_cli.config.models import (
    PROMPT_TEMPLATE_ALIASES,
    AdapterSpec,
    AdapterType,
    BaseModelSpec,
    DatasetSpec,
    DistributedSpec,
    LoadedManifest,
    Manifest,
    Optimizer,
    PromptTemplate,
    Quantization,
    Scheduler,
    TaskSpec,
    TrainingConfig,
    TrainingSpec,
)

__all__ = [
    "PROMPT_TEMPLATE_ALIASES",
    "AdapterSpec",
    "AdapterType",
    "BaseModelSpec",
    "DatasetSpec",
    "DistributedSpec",
    "LoadedManifest",
    "Manifest",
    "Optimizer",
    "PromptTemplate",
    "Quantization",
    "Scheduler",
    "TaskSpec",
    "TrainingConfig",
    "TrainingSpec",
    "apply_overrides",
    "format_errors",
    "load_manifest",
    "local_path",
    "looks_like_hub_id",
    "parse_override",
    "read_manifest_json",
    "split_hub_spec",
    "strip_comments",
]
