"""Pydantic's validation errors as the lines `check` and `train` print: `json.path: message`,
a suggestion for a misspelt key, a value described by its kind and never quoted, and a
union's refusals in one line."""

from __future__ import annotations

import difflib
import re
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from expert_cli.config.models import BaseModelSpec, DatasetSpec, Manifest
from expert_cli.config.training_config import TrainingConfig
from expert_cli.errors import value_kind

SHOWN_KEY_CHARS = 64  # a key longer than this is named by its length


def loc_text(loc: tuple[Any, ...]) -> str:
    """A JSON path as lines name it (`training.config.rank`, `tags[0]`); a key of over
    SHOWN_KEY_CHARS characters by its length (a 3,000-character key filled the terminal)."""
    text = ""
    for part in loc:
        if not isinstance(part, int) and len(str(part)) > SHOWN_KEY_CHARS:
            part = f"<a {len(str(part)):,}-character key>"
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


def takes_text_only(loc: tuple[Any, ...]) -> bool:
    """Whether the manifest field at `loc` takes text and no number (a string, or a choice of
    strings such as schema_version's '1.0' and '2.0'): a `--set` value there is its text."""
    if not loc or isinstance(loc[-1], int):
        return False
    owner = _model_at(loc[:-1])
    field = owner.model_fields.get(str(loc[-1])) if owner is not None else None
    if field is None:
        return False
    kinds = _leaf_kinds(field.annotation)
    return str in kinds and kinds <= {str, type(None)}


def _leaf_kinds(annotation: Any) -> set[Any]:
    """The types a field's annotation takes, through unions, Annotated and Literal values."""
    if get_origin(annotation) is Literal:
        return {type(value) for value in get_args(annotation)}
    if get_origin(annotation) in (Union, UnionType, Annotated):
        args = get_args(annotation)
        args = args[:1] if get_origin(annotation) is Annotated else args
        return set().union(*(_leaf_kinds(arg) for arg in args))
    return {annotation}


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


def _other_block(name: str) -> str | None:
    """The block a training.config key given by mistake belongs to (a bare `--set` key is
    training.config's: `--set chat_template=chatml` was only "unknown field")."""
    for block, model in (("base_models.0", BaseModelSpec), ("training.dataset", DatasetSpec)):
        if name in model.model_fields:
            return block
    return None


def _suggest(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    names = list(model.model_fields) + [f.alias for f in model.model_fields.values() if f.alias]
    wrong = str(loc[-1])
    if model is TrainingConfig and (elsewhere := _other_block(wrong)):
        label = elsewhere.replace(".0", "[0]")
        return f"; it is a field of {label} (with --set: {elsewhere}.{wrong}=...)"
    if SHORT_NAMES.get(wrong.lower()) in names:
        return f"; did you mean {SHORT_NAMES[wrong.lower()]}?"
    close = difflib.get_close_matches(wrong, names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def format_errors(exc: ValidationError) -> list[str]:
    """Pydantic errors as `json.path: message` lines, with a suggestion for unknown keys; a
    value is described by its kind, never quoted. The branches of a union that all refused a
    value make one line ("...; or ...")."""
    # a union's branches share one entry (by branch, what each refused)
    lines: dict[tuple[str, int], dict[Any, list[str]]] = {}
    for index, err in enumerate(exc.errors(include_url=False)):
        tags = _tag_positions(err["loc"])
        loc = tuple(p for i, p in enumerate(err["loc"]) if i not in tags)
        tag = tags[0] if tags else None
        where = loc_text(loc if tag is None else err["loc"][:tag])
        text = _message(err, loc)
        if tag is not None and len(loc) > tag:  # inside one branch: say where
            text += f" (at {loc_text(loc[tag:]).lstrip('.')})"
        branches = lines.setdefault((where, index if tag is None else -1), {})
        said = branches.setdefault(None if tag is None else err["loc"][tag], [])
        if text not in said:
            said.append(text)
    return list(
        dict.fromkeys(
            f"{where}: {'; or '.join(' and '.join(said) for said in branches.values())}"
            for (where, _), branches in lines.items()
        )
    )


def _message(err: Any, loc: tuple[Any, ...]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown field{_suggest(loc)}"
    if kind == "missing":
        return "required field is missing"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if kind in SAYS_ENOUGH:
        return str(err["msg"])
    if kind == "int_type" and isinstance(err.get("input"), float) and err["input"].is_integer():
        return "expected a whole number, written without a decimal point (got a decimal number)"
    return f"{err['msg']} (got {value_kind(err.get('input'))})"


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


def _tag_positions(loc: tuple[Any, ...]) -> list[int]:
    """Where in `loc` pydantic put a union member's name ('list[str]', 'str', 'TaskSpec'):
    noise in a path. Found by walking the manifest's schema, so that a dict key that reads
    like one (a task named `str`) stays a key; below a place the schema does not describe,
    only names no key would have ('list[str]', 'function-after[...]') are taken."""
    positions = []
    annotation: Any = Manifest
    for i, part in enumerate(loc):
        annotation = _plain(annotation)
        members = _union_members(annotation)
        if members and isinstance(part, str):
            positions.append(i)
            annotation = next((m for m in members if getattr(m, "__name__", "") == part), None)
        elif annotation is None:
            if isinstance(part, str) and re.search(r"[\[\]']|^function-", part):
                positions.append(i)
        else:
            annotation = _step(annotation, part)
    return positions


def _plain(annotation: Any) -> Any:
    """`annotation` without Annotated's metadata and an Optional's None."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
            continue
        members = _union_members(annotation, with_none=True)
        kept = [m for m in members or () if m is not type(None)]
        if members and len(kept) == 1:
            annotation = kept[0]
            continue
        return annotation


def _union_members(annotation: Any, with_none: bool = False) -> list[Any] | None:
    """The members of a union (None left out unless `with_none`), None for anything else."""
    if get_origin(annotation) not in (Union, UnionType):
        return None
    return [a for a in get_args(annotation) if with_none or a is not type(None)]


def _step(annotation: Any, part: Any) -> Any:
    """The annotation one step down `part` (a field, a dict key, a list index); None where the
    schema does not say."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = annotation.model_fields
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        return field.annotation if field is not None else None
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is dict and len(args) == 2:
        return args[1]
    if origin in (list, tuple) and args:
        return args[0]
    return None
