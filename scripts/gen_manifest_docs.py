"""Generate docs/manifest.md from the Pydantic manifest models, so the two cannot drift.

python scripts/gen_manifest_docs.py          # rewrite docs/manifest.md
python scripts/gen_manifest_docs.py --check  # exit 1 if docs/manifest.md is stale
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from expert_cli import config

DOC = Path(__file__).resolve().parents[1] / "docs" / "manifest.md"

SECTIONS: list[tuple[str, type[BaseModel], str]] = [
    (
        "Top level",
        config.Manifest,
        "Metadata blocks (`capabilities`, `routing`, `constraints`, `perf`, `runtime`, "
        "`limitations`, `quality_metrics`, `evaluation`, `integrity`, `soft_prompts`) are accepted "
        "and kept whole; unknown top-level keys are kept too.",
    ),
    (
        "Base model: `base_model` (1.0) or `base_models[]` (2.0)",
        config.BaseModelSpec,
        "Training uses the first entry of `base_models`. Unknown keys are errors.",
    ),
    (
        "Adapters: `adapters[]` (1.0) or `base_models[].adapters[]` (2.0)",
        config.AdapterSpec,
        "The first adapter supplies defaults for `training.config`; `training.config` wins.",
    ),
    (
        "`training`",
        config.TrainingSpec,
        "Keys other than these (for example `trained_on`, `checkpoint`, "
        "`alternative_checkpoints`) are kept, not acted on.",
    ),
    ("`training.dataset`", config.DatasetSpec, "Unknown keys are errors."),
    ("`training.dataset.tasks.<name>`", config.TaskSpec, "For `type: multi_task`."),
    (
        "`training.config`",
        config.TrainingConfig,
        "Unknown keys are errors. Unset fields are chosen for the machine and printed by "
        "`expert-cli check`; the choices are saved in `manifest.resolved.json`.",
    ),
    (
        "`training.distributed` (extension)",
        config.DistributedSpec,
        "Passed to the Hugging Face Trainer; launch with torchrun or accelerate.",
    ),
]

HEADER = """# Manifest reference

expert-cli reads HiveLLM expert manifests (`schema_version` "1.0" or "2.0") unchanged. Keys
that start with `_` are comments at any depth. In the blocks the trainer acts on, an unknown key
is an error naming its JSON path and the nearest valid key. Relative paths resolve against the
manifest's folder. Fields marked *extension* are expert-cli's additions to the format.

This page is generated from the Pydantic models in `src/expert_cli/config/` by
`python scripts/gen_manifest_docs.py`; a test fails when it is out of date.
"""


def _type_name(annotation: object) -> str:
    """A short readable type: `int`, `list[str]`, `"lora" | "dora"`, `float >= 0, < 1`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
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


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
        return "`{}`" if isinstance(value, BaseModel) else f"`{value!r}`"
    if info.default is PydanticUndefined:
        return "required"
    return f"`{info.default!r}`" if info.default is not None else "unset"


def _bounds(info: FieldInfo, annotation: object) -> str:
    parts = []
    for item in [*info.metadata, *_annotated_bounds(annotation)]:
        for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, key, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def section(title: str, model: type[BaseModel], intro: str) -> str:
    hints = typing.get_type_hints(model, include_extras=True)
    lines = [
        f"## {title}",
        "",
        intro,
        "",
        "| field | type | default | limits | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, info in model.model_fields.items():
        alias = f" (alias `{info.alias}`)" if info.alias else ""
        lines.append(
            f"| `{name}`{alias} | {_type_name(hints[name])} | {_default(info)} | "
            f"{_bounds(info, hints[name])} | {info.description or ''} |"
        )
    return "\n".join(lines) + "\n"


def generate() -> str:
    return HEADER + "\n" + "\n".join(section(*item) for item in SECTIONS)


def main() -> int:
    text = generate()
    if "--check" in sys.argv:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python scripts/gen_manifest_docs.py")
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
