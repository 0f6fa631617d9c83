"""Whether an adapter_config.json describes the weights beside it: the rank of each LoRA
matrix, and the layers the weights adapt. Read from the safetensors header's shapes alone.

peft loads a configuration whose `r` differs from the weights' rank in a size-mismatch
traceback, and one whose `target_modules` leave out layers the weights adapt by dropping those
layers' weights with a warning at most: the adapter would answer as another. A hand edit, or
a configuration copied from another run, does either; `generate`, `merge`, `package` and
`check --package` refuse it before anything loads.
"""

from __future__ import annotations

import re
from typing import Any

from expert_cli.weights import shown_tensor

Shapes = dict[str, tuple[int, ...]]
PEFT_PREFIX = "base_model.model."  # what peft puts before a base model's module names
ADAPTER_PARTS = ("lora_", "ia3_", "lokr_")  # the first name part of an adapter's own tensor
RANK_FIRST = ("lora_A", "lora_embedding_A")  # shape (r, in)
RANK_SECOND = ("lora_B", "lora_embedding_B")  # shape (out, r, ...)


def adapted_modules(shapes: Shapes) -> dict[str, str]:
    """The base model's module names the weights adapt (as peft matches them against
    target_modules), each with one tensor's name that adapts it."""
    modules: dict[str, str] = {}
    for name in shapes:
        parts = name.split(".")
        cut = next((i for i, p in enumerate(parts) if p.startswith(ADAPTER_PARTS)), 0)
        if cut:
            modules.setdefault(".".join(parts[:cut]).removeprefix(PEFT_PREFIX), name)
    return modules


def _targets(targets: Any, module: str) -> bool:
    """Whether peft's matching of `target_modules` picks `module` (a list: a name equal to
    it or to its last parts; a text: a regular expression matching it whole)."""
    if isinstance(targets, str):
        return targets == "all-linear" or re.fullmatch(targets, module) is not None
    return any(isinstance(t, str) and (module == t or module.endswith("." + t)) for t in targets)


def targets_problem(config: dict[str, Any], shapes: Shapes) -> str | None:
    """A layer the weights adapt that `target_modules` does not name, or a pattern that is no
    regular expression."""
    targets = config.get("target_modules")
    try:
        left_out = [
            (module, tensor)
            for module, tensor in adapted_modules(shapes).items()
            if not _targets(targets, module)
        ]
    except re.error:
        return "target_modules: not a regular expression peft can match layer names with"
    if not left_out:
        return None
    module, tensor = left_out[0]
    more = f" and {len(left_out) - 1} more" if len(left_out) > 1 else ""
    return (
        f"target_modules does not name {shown_tensor(module)}{more}, which the weights beside "
        f"it adapt ({shown_tensor(tensor)}); loading would drop those weights"
    )


def rank_problem(config: dict[str, Any], shapes: Shapes) -> str | None:
    """A LoRA matrix whose rank is neither `r` nor one `rank_pattern` gives."""
    if config.get("peft_type") != "LORA":
        return None  # AdaLoRA's rank is init_r; LoKr's factors are not of rank r
    rank, pattern = config.get("r"), config.get("rank_pattern")
    allowed = {rank, *(pattern.values() if isinstance(pattern, dict) else ())}
    for name, shape in shapes.items():
        parts = set(name.split("."))
        axis = 0 if parts & set(RANK_FIRST) else 1 if parts & set(RANK_SECOND) else None
        if axis is not None and len(shape) > axis and shape[axis] not in allowed:
            return (
                f"r: {rank}, but the weights beside it are of rank {shape[axis]} "
                f"({shown_tensor(name)})"
            )
    return None


def fit_problem(config: dict[str, Any], shapes: Shapes | None) -> str | None:
    """What in the configuration does not fit the weights (None: it fits, or no shapes were
    read)."""
    if not shapes:
        return None
    return rank_problem(config, shapes) or targets_problem(config, shapes)
