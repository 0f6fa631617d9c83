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

from expert_cli.errors import value_kind
from expert_cli.weights import shown_tensor

Shapes = dict[str, tuple[int, ...]]
PEFT_PREFIX = "base_model.model."  # what peft puts before a base model's module names
ADAPTER_PARTS = ("lora_", "ia3_", "lokr_")  # the first name part of an adapter's own tensor
RANK_FIRST = ("lora_A", "lora_embedding_A")  # shape (r, in)
RANK_SECOND = ("lora_B", "lora_embedding_B")  # shape (out, r, ...)
DEFAULT_RANK = 8  # peft's LoraConfig.r


def module_of(name: str) -> str | None:
    """The base model's module a tensor of the adapter adapts, as peft matches module names
    against target_modules (None for a tensor of no adapted module)."""
    parts = name.split(".")
    cut = next((i for i, p in enumerate(parts) if p.startswith(ADAPTER_PARTS)), 0)
    return ".".join(parts[:cut]).removeprefix(PEFT_PREFIX) if cut else None


def adapted_modules(shapes: Shapes) -> dict[str, str]:
    """The base model's module names the weights adapt, each with one tensor's name that
    adapts it."""
    modules: dict[str, str] = {}
    for name in shapes:
        if (module := module_of(name)) is not None:
            modules.setdefault(module, name)
    return modules


PATTERN_ERRORS = (re.error, OverflowError, RecursionError, TypeError)
# a repeated group that holds a repetition ((a+)+, (.*)*): matching it can take exponential time
NESTED_REPEAT = re.compile(r"\([^()]*[*+}][^()]*\)\s*[*+{]")
MAX_PATTERN_CHARS = 1000


def _pattern(text: str) -> re.Pattern[str]:
    """A pattern of the configuration compiled; re.error for one too long, or one whose
    matching could run for ever on a hostile package (peft's own matching would too)."""
    if len(text) > MAX_PATTERN_CHARS or NESTED_REPEAT.search(text):
        raise re.error("too long, or a repeated group holding a repetition")
    return re.compile(text)


def _targets(targets: Any, module: str) -> bool:
    """Whether peft's matching of `target_modules` picks `module` (a list: a name equal to
    it or to its last parts; a text: "all-linear" in any case, else a regular expression
    matching it whole)."""
    if isinstance(targets, str):
        return targets.lower() == "all-linear" or _pattern(targets).fullmatch(module) is not None
    return any(isinstance(t, str) and (module == t or module.endswith("." + t)) for t in targets)


def targets_problem(config: dict[str, Any], shapes: Shapes) -> str | None:
    """A layer the weights adapt that `target_modules` does not name, or a pattern that is no
    regular expression (or one that could take for ever to match)."""
    targets = config.get("target_modules")
    try:
        left_out = [
            (module, tensor)
            for module, tensor in adapted_modules(shapes).items()
            if not _targets(targets, module)
        ]
    except PATTERN_ERRORS:
        return (
            "target_modules: not a regular expression peft can match layer names with (or one "
            "too long, or with a repeated group holding a repetition)"
        )
    if not left_out:
        return None
    module, tensor = left_out[0]
    more = f" and {len(left_out) - 1} more" if len(left_out) > 1 else ""
    return (
        f"target_modules does not name {shown_tensor(module)}{more}, which the weights beside "
        f"it adapt ({shown_tensor(tensor)}); loading would drop those weights"
    )


def _layer_rank(config: dict[str, Any], module: str) -> Any:
    """The rank peft gives `module`: the value of the first `rank_pattern` key matching the
    end of its name (peft's `get_pattern_key`), else `r` (8 where the file gives none)."""
    pattern = config.get("rank_pattern")
    for key, value in pattern.items() if isinstance(pattern, dict) else ():
        if _pattern(rf"(.*\.)?({key})$").match(module):
            return value
    return config.get("r", DEFAULT_RANK)


def rank_problem(config: dict[str, Any], shapes: Shapes) -> str | None:
    """A LoRA matrix whose rank is not the one peft would build its layer with."""
    if config.get("peft_type") != "LORA":
        return None  # AdaLoRA's rank is init_r; LoKr's factors are not of rank r
    try:
        for name, shape in shapes.items():
            parts = set(name.split("."))
            axis = 0 if parts & set(RANK_FIRST) else 1 if parts & set(RANK_SECOND) else None
            module = module_of(name)
            if axis is None or len(shape) <= axis or module is None:
                continue
            rank = _layer_rank(config, module)
            if shape[axis] != rank:
                where = "rank_pattern" if rank != config.get("r", DEFAULT_RANK) else "r"
                return (
                    f"{where}: {value_kind(rank) if type(rank) is not int else rank} for "
                    f"{shown_tensor(module)}, but its weights are of rank {shape[axis]} "
                    f"({shown_tensor(name)})"
                )
    except PATTERN_ERRORS:
        return "rank_pattern: a key that is no regular expression peft can match layer names with"
    return None


PAIRS = (("lora_A", "lora_B"), ("lora_embedding_A", "lora_embedding_B"))
# how peft finds a layer's number in a module's name (its layers_pattern defaults)
LAYER_NUMBER = re.compile(r"(?:^|\.)(?:layers|h|block|blocks|layer)\.(\d{1,9})(?:\.|$)")


def pairs_problem(config: dict[str, Any], shapes: Shapes) -> str | None:
    """A LoRA matrix without its other half (or a DoRA layer without the magnitude the
    others hold): peft fills a missing one with its initial values, random for A, and says
    so only in a warning; the adapter answers and merges as another, a new one at each load.
    A DoRA setting no weights match is adapter_config_problem's to say."""
    if config.get("peft_type") not in ("LORA", "ADALORA"):
        return None
    held: dict[str, set[str]] = {}
    for name in shapes:
        if (module := module_of(name)) is not None:
            part = next(p for p in name.split(".") if p.startswith(ADAPTER_PARTS))
            held.setdefault(module, set()).add(part)
    dora = any("lora_magnitude_vector" in parts for parts in held.values())  # some, not all
    for module, parts in held.items():
        wants = [b for a, b in PAIRS if a in parts and b not in parts]
        wants += [a for a, b in PAIRS if b in parts and a not in parts]
        if dora and "lora_A" in parts and "lora_magnitude_vector" not in parts:
            wants.append("lora_magnitude_vector")
        if wants:
            return (
                f"lacks {wants[0]} of {shown_tensor(module)}, which peft would make up anew at "
                "each load (random values for lora_A, zeros for lora_B): the file is incomplete"
            )
    return None


def layers_problem(config: dict[str, Any], shapes: Shapes) -> str | None:
    """A layer the weights adapt that `layers_to_transform` leaves out (peft drops its
    weights), or a value peft cannot read as layer numbers."""
    wanted = config.get("layers_to_transform")
    if wanted is None:
        return None
    layers = [wanted] if isinstance(wanted, int) else wanted
    if not isinstance(layers, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in layers
    ):
        got = value_kind(wanted)
        return f"layers_to_transform: expected a layer number or a list of them (got {got})"
    for module, tensor in adapted_modules(shapes).items():
        found = LAYER_NUMBER.search(module)
        if found and int(found[1]) not in layers:
            return (
                f"layers_to_transform leaves out layer {found[1]}, which the weights beside it "
                f"adapt ({shown_tensor(tensor)}); loading would drop those weights"
            )
    return None


def dropout_problem(config: dict[str, Any]) -> str | None:
    """A LoRA dropout torch cannot build (a probability from 0 up to, not including, 1)."""
    value = config.get("lora_dropout", 0.0)
    if config.get("peft_type") not in ("LORA", "ADALORA"):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        got = value if number else value_kind(value)
        return f"lora_dropout: expected a number from 0 up to (not including) 1 (got {got})"
    return None


def fit_problem(config: dict[str, Any], shapes: Shapes | None) -> str | None:
    """What in the configuration does not fit the weights (None: it fits, or no shapes were
    read). Left out: exclude_modules and modules_to_save, which narrow or add to what the
    targets pick."""
    if problem := dropout_problem(config):
        return problem
    if not shapes:
        return None
    return (
        rank_problem(config, shapes)
        or targets_problem(config, shapes)
        or layers_problem(config, shapes)
    )
