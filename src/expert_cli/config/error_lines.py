"""Pydantic's validation errors as the lines `check` and `train` print: `json.path: message`,
a suggestion for a misspelt key, a value described by its kind and never quoted, and a
union's refusals in one line."""

from __future__ import annotations

import difflib
import re
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from expert_cli.config.models import Manifest
from expert_cli.errors import value_kind


def loc_text(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the field at `loc` (walking lists and dicts)."""
    model: Any = Manifest
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            if isinstance(model, type) and issubclass(model, BaseModel):
                return None
            continue  # a dict key such as a task name
        model = _unwrap_model(field.annotation)
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None or getattr(annotation, "__args__", None):
        for arg in get_args(annotation):
            found = _unwrap_model(arg)
            if found is not None:
                return found
    return None


# names people carry over from other trainers, and the field each means here
SHORT_NAMES = {
    "lr": "learning_rate",
    "bs": "batch_size",
    "batch": "batch_size",
    "per_device_train_batch_size": "batch_size",
    "micro_batch_size": "batch_size",
    "seq_len": "max_seq_length",
    "max_len": "max_seq_length",
    "sequence_len": "max_seq_length",
    "cutoff_len": "max_seq_length",
    "grad_accum": "gradient_accumulation_steps",
    "accumulation_steps": "gradient_accumulation_steps",
    "r": "rank",
    "lora_r": "rank",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "warmup": "warmup_steps",
    "scheduler": "lr_scheduler",
    "lr_scheduler_type": "lr_scheduler",
    "num_workers": "dataloader_num_workers",
    "workers": "dataloader_num_workers",
    "steps": "max_steps",
    "num_train_epochs": "epochs",
}


def _suggest(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    names = list(model.model_fields) + [f.alias for f in model.model_fields.values() if f.alias]
    wrong = str(loc[-1])
    if SHORT_NAMES.get(wrong.lower()) in names:
        return f"; did you mean {SHORT_NAMES[wrong.lower()]}?"
    close = difflib.get_close_matches(wrong, names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def format_errors(exc: ValidationError) -> list[str]:
    """Pydantic errors as `json.path: message` lines, with a suggestion for unknown keys; a
    value is described by its kind, never quoted. The branches of a union that all refused a
    value make one line ("...; or ...")."""
    lines: dict[tuple[str, int], list[str]] = {}  # a union's branches share one entry
    for index, err in enumerate(exc.errors(include_url=False)):
        loc = tuple(p for p in err["loc"] if not _is_union_tag(p))
        tag = next((i for i, p in enumerate(err["loc"]) if _is_union_tag(p)), None)
        where = loc_text(loc if tag is None else err["loc"][:tag])
        kind = err["type"]
        if kind == "extra_forbidden":
            text = f"unknown field{_suggest(loc)}"
        elif kind == "missing":
            text = "required field is missing"
        elif kind == "value_error":
            text = str(err["msg"]).removeprefix("Value error, ")
        elif kind in SAYS_ENOUGH:
            text = str(err["msg"])
        else:
            text = f"{err['msg']} (got {value_kind(err.get('input'))})"
        if tag is not None and len(loc) > tag:  # inside one branch: say where
            text += f" (at {loc_text(loc[tag:]).lstrip('.')})"
        said = lines.setdefault((where, index if tag is None else -1), [])
        if text not in said:
            said.append(text)
    return list(
        dict.fromkeys(f"{where}: {'; or '.join(said)}" for (where, _), said in lines.items())
    )


# errors whose message says all there is (a bound, or the values allowed) when the value is of
# the right kind: the value itself is not quoted (it is the user's file's contents)
SAYS_ENOUGH = frozenset(
    {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "multiple_of",
        "finite_number",
        "too_short",
        "too_long",
        "string_too_short",
        "string_too_long",
        "string_pattern_mismatch",
        "literal_error",
        "enum",
    }
)


def _is_union_tag(part: Any) -> bool:
    """Pydantic adds union member names ('list[str]', 'str') to locations; they are noise (a
    task named `str` is taken for one: its line then names the tasks block)."""
    return isinstance(part, str) and (
        part in PLAIN_TYPES or bool(re.search(r"[\[\]']|^function-", part))
    )


PLAIN_TYPES = frozenset({"str", "int", "float", "bool", "bytes"})
