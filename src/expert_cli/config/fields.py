"""The manifest's fields described from the Pydantic models: name, type, default, limits and
meaning. docs/manifest.md and `expert-cli check --list-settings` are both made from this, so
neither can drift from what the loader accepts."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from expert_cli.config.adapters import DEFAULT_DROPOUT, DEFAULT_RANK
from expert_cli.config.batching import DEFAULT_CPU_BATCH, DEFAULT_MAX_SEQ
from expert_cli.config.choices import DEFAULT_LR, DEFAULT_WARMUP_RATIO
from expert_cli.config.optimizer import ADAM_DEFAULTS
from expert_cli.config.resolve import (
    DEFAULT_LOGGING_STEPS,
    DEFAULT_SAVE_LIMIT,
    DEFAULT_SAVE_STEPS,
)
from expert_cli.config.training_config import MAX_BATCH_ROWS


@dataclass(frozen=True)
class FieldDoc:
    """One field as a reader sees it (`type` uses ` | ` between alternatives)."""

    name: str
    alias: str | None
    type: str
    default: str
    limits: str
    meaning: str


# what the resolution chooses for a training.config field left unset (config/resolve.py and
# the modules it calls), as `check --list-settings` and docs/manifest.md say it
UNSET_MEANS = {
    "rank": f"the adapter's r, else {DEFAULT_RANK}",
    "alpha": "the adapter's, else 2 x rank",
    "dropout": f"the adapter's, else {DEFAULT_DROPOUT:g}",
    "target_modules": "the adapter's, else all-linear",
    "epochs": "1",
    "learning_rate": f"{DEFAULT_LR:g}",
    "lr_scheduler": "cosine",
    "warmup_ratio": f"{DEFAULT_WARMUP_RATIO:g} where warmup_steps is unset too",
    "batch_size": f"auto on a GPU, {DEFAULT_CPU_BATCH} on a CPU",
    "max_seq_length": f"{DEFAULT_MAX_SEQ}",
    "packing": "true",
    "logging_steps": f"{DEFAULT_LOGGING_STEPS}",
    "save_steps": f"{DEFAULT_SAVE_STEPS}",
    "save_total_limit": f"{DEFAULT_SAVE_LIMIT}",
    "eval_steps": "save_steps",
    "warmup_steps": f"0 (warmup_ratio {DEFAULT_WARMUP_RATIO:g} then)",
    "gradient_accumulation_steps": "1 for a numeric batch_size (auto: from tokens_per_step)",
    "save_strategy": "steps",
    "evaluation_strategy": "steps where there is validation data or a held-out share, else no",
    "use_rslora": "false",
    "init_lora_weights": "default",
    "loraplus_lr_ratio": "off (B at the learning rate)",
    "eval_on_start": "false",
    "init_adapter": "none (the adapter starts as init_lora_weights says)",
    "optim": "adamw_torch_fused on a GPU, adamw_torch on a CPU",
    **{key: f"{value:g}" for key, value in ADAM_DEFAULTS.items()},
}


# limits a validator enforces (not a Field bound, which describe_fields reads)
VALIDATOR_LIMITS = {"batch_size": f'>= 1, <= {MAX_BATCH_ROWS}, or "auto"'}


def describe_fields(model: type[BaseModel]) -> list[FieldDoc]:
    """Every field of `model`, in declaration order, a model's own before those it inherits
    (training.config's with what an unset one resolves to)."""
    hints = typing.get_type_hints(model, include_extras=True)
    training = model.__name__ == "TrainingConfig"
    unset, limits = (UNSET_MEANS, VALIDATOR_LIMITS) if training else ({}, {})
    return [
        FieldDoc(
            name=name,
            alias=info.alias,
            type=type_name(hints[name]),
            default=_default(info, unset.get(name)),
            limits=_bounds(info, hints[name]) or (limits.get(name, "")),
            meaning=info.description or "",
        )
        for name, info in sorted(model.model_fields.items(), key=lambda f: _inherited(model, f[0]))
    ]


def _inherited(model: type[BaseModel], name: str) -> bool:
    """Whether a field is declared by a base class of `model` (training.config's optimizer
    fields), not by the model itself."""
    return name not in model.__dict__.get("__annotations__", {})


def type_name(annotation: object) -> str:
    """A short readable type: `int`, `list[str]`, `"lora" | "dora"`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _annotated_bounds(annotation: object) -> list[object]:
    """Constraints hidden inside Annotated aliases such as `Probability`."""
    found: list[object] = []
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in typing.get_args(annotation)[1:]:
            found += getattr(meta, "metadata", [meta])
    for arg in typing.get_args(annotation):
        if typing.get_origin(annotation) is not typing.Annotated:
            found += _annotated_bounds(arg)
    return found


def _default(info: FieldInfo, unset: str | None) -> str:
    """The field's default; `unset`, what the resolution chooses for a field left unset."""
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "{}" if isinstance(value, BaseModel) else repr(value)
    if info.default is PydanticUndefined:
        return "required"
    if info.default is not None:
        return repr(info.default)
    return f"unset: {unset}" if unset else "unset"


def _bounds(info: FieldInfo, annotation: object) -> str:
    parts = []
    for item in [*info.metadata, *_annotated_bounds(annotation)]:
        for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, key, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)
