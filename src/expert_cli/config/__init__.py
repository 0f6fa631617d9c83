"""The manifest and what a run is made of: the Pydantic models (models.py, with decoding.py and
training_config.py), reading a file into them (loading.py), what its references mean
(refs.py), the machine (environment.py), the kernels it can run (kernels.py), and the resolved
run configuration (resolve.py).

The manifest becomes these models once, here; nothing else reads raw manifest dicts.
"""

from expert_cli.config.base import (
    PROMPT_TEMPLATE_ALIASES,
    AdapterType,
    PromptTemplate,
    Quantization,
)
from expert_cli.config.decoding import DecodingSpec
from expert_cli.config.error_lines import format_errors
from expert_cli.config.loading import (
    apply_overrides,
    load_manifest,
    parse_override,
    read_manifest_json,
    strip_comments,
)
from expert_cli.config.models import (
    AdapterSpec,
    BaseModelSpec,
    DatasetSpec,
    LoadedManifest,
    Manifest,
    TaskSpec,
    TrainingSpec,
)
from expert_cli.config.optimizer import Optimizer
from expert_cli.config.training_config import (
    DistributedSpec,
    Scheduler,
    TrainingConfig,
)

__all__ = [
    "PROMPT_TEMPLATE_ALIASES",
    "AdapterSpec",
    "AdapterType",
    "BaseModelSpec",
    "DatasetSpec",
    "DecodingSpec",
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
    "parse_override",
    "read_manifest_json",
    "strip_comments",
]
