"""What every manifest block is built from: the strict base model, the shared field types, and
the rules every JSON value of a manifest follows wherever it sits (comments dropped, numbers
finite and within 64 bits, text valid Unicode)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError


def first(*values: Any) -> Any:
    """The first value that is not None (None if all are)."""
    return next((v for v in values if v is not None), None)


AdapterType = Literal["lora", "dora", "ia3", "lokr", "adalora"]
Quantization = Literal["int4", "int8", "fp16", "bf16", "none"]
# chat_template (an extension): instruction data laid out as a conversation by the tokenizer's
# own chat template (system, user, assistant turns)
PromptTemplate = Literal["chatml", "llama2", "alpaca", "vicuna", "chat_template", "custom"]
# Names used by existing manifests for a template we implement under another name.
PROMPT_TEMPLATE_ALIASES = {"qwen": "chatml", "qwen2": "chatml", "qwen3": "chatml"}
Probability = Annotated[float, Field(ge=0.0, lt=1.0)]
# module names to adapt: at least one (an empty list reached peft, which named its own
# arguments), each a name
ModuleNames = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]

# `name` and `version` become part of the package's file name (`{name}-{base}.v{version}.expert`)
FILE_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
FILE_NAME_PART_RULE = (
    "1 to 128 ASCII letters, digits, '.', '_', '+' or '-', starting with a letter or digit (it "
    "becomes part of the package's file name)"
)
# integers beyond 64 bits do not survive JSON readers in other languages (HiveLLM's is Rust)
MAX_JSON_INT = 2**63 - 1
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
TEXT = "expected valid Unicode text"
MAX_VALUE_ERRORS = 20
# a key shown in a message only when it reads as a name (not a line of text)
NAME_LIKE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def _file_name_part(value: str) -> str:
    if not FILE_NAME_PART.fullmatch(value):
        raise ValueError(f"expected {FILE_NAME_PART_RULE}, e.g. expert-sql or 0.1.0")
    return value


FileNamePart = Annotated[str, AfterValidator(_file_name_part)]


class Strict(BaseModel):
    """A block the trainer acts on: unknown keys are errors, numbers are numbers (not
    booleans or strings), booleans are booleans, and floats are finite."""

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, strict=True, allow_inf_nan=False
    )


def has_control_character(text: str) -> bool:
    """Whether `text` holds an ASCII control character (a line break, a tab, ESC, DEL): no
    file name a manifest gives should."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def strip_comments(value: Any) -> Any:
    """Drop keys that start with `_` at any depth (they are comments in this format)."""
    if isinstance(value, dict):
        return {k: strip_comments(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list):
        return [strip_comments(v) for v in value]
    return value


def encodes(text: str) -> bool:
    """Whether UTF-8 can write `text`: no lone surrogate (JSON's `\\ud800` alone, or a path's
    byte that is not UTF-8, as Python keeps it)."""
    return lone_surrogate_at(text) is None


def lone_surrogate_at(text: str) -> int | None:
    """Where `text` holds a lone surrogate (JSON's `\\ud800` escape without its pair decodes
    to one; nothing can write it as UTF-8), or None."""
    if text.isascii():
        return None
    found = _LONE_SURROGATE.search(text)
    return found.start() if found else None


def _value_problem(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return (
            "not a finite number (NaN, Infinity, or too large: past 1e308, or of thousands of "
            "digits); "
            "expected a finite number"
        )
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_JSON_INT:
        return "an integer beyond 64 bits (over 2**63 - 1); expected a smaller number"
    if isinstance(value, str) and lone_surrogate_at(value) is not None:
        return (
            "contains a lone surrogate (a \\ud800-\\udfff escape without its pair); "
            "expected valid Unicode text"
        )
    return None


def value_errors(data: Any) -> list[InitErrorDetails]:
    """Every value of a JSON document (comments included) that cannot be written back as
    JSON every reader accepts: a non-finite number, an integer beyond 64 bits, a string or key
    with a lone surrogate; in document order, at most MAX_VALUE_ERRORS of them. Walked without
    recursion (JSON may be nested ~1000 deep)."""
    found: list[InitErrorDetails] = []
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, dict):
            children = []
            for key, item in value.items():
                if isinstance(key, str) and lone_surrogate_at(key) is not None:
                    found.append(_error(loc, "a key here contains a lone surrogate; " + TEXT))
                else:
                    children.append(((*loc, key), item))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend(reversed([((*loc, i), item) for i, item in enumerate(value)]))
        elif (problem := _value_problem(value)) is not None:
            found.append(_error(loc, problem))
    if len(found) > MAX_VALUE_ERRORS:
        more = len(found) - MAX_VALUE_ERRORS
        found = [*found[:MAX_VALUE_ERRORS], _error((), f"{more} more values like these")]
    return found


def _error(loc: tuple[str | int, ...], message: str) -> InitErrorDetails:
    # "value_error", so that the loader prints it as `json.path: message`
    return InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)


def plain_json(title: str, data: Any) -> Any:
    """`data` without comments, after checking every value in it (comments included, since
    they are written back into packages); a ValidationError naming each bad value's path."""
    errors = value_errors(data)
    if errors:
        raise ValidationError.from_exception_data(title, errors)
    return strip_comments(data)
