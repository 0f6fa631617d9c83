"""Generate docs/manifest.md from the Pydantic manifest models, so the two cannot drift.

python scripts/gen_manifest_docs.py          # rewrite docs/manifest.md
python scripts/gen_manifest_docs.py --check  # exit 1 if docs/manifest.md is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import BaseModel

from expert_cli import config
from expert_cli.config.fields import describe_fields
from expert_cli.config.training_config import CheckpointingKwargs

DOC = Path(__file__).resolve().parents[1] / "docs" / "manifest.md"

SECTIONS: list[tuple[str, type[BaseModel], str]] = [
    (
        "Top level",
        config.Manifest,
        "Metadata blocks (`capabilities`, `routing`, `constraints`, `perf`, `runtime`, "
        "`limitations`, `quality_metrics`, `evaluation`, `integrity`, `soft_prompts`) are accepted "
        "and kept whole (a package leaves `integrity` out: it describes other files); unknown "
        "top-level keys are kept too. `package` needs `description`, `capabilities` and "
        "`constraints` (HiveLLM's loader reads no package without them; docs/packaging.md).",
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
        "The descriptive keys (for example `trained_on`, `checkpoint`, "
        "`alternative_checkpoints`) are kept, not acted on. A key not listed here is an error "
        "(`training.foo: unknown field`).",
    ),
    (
        "`training.decoding`",
        config.DecodingSpec,
        "Inference settings. `expert-cli generate` samples with `temperature`, `top_p`, "
        "`top_k`, `repetition_penalty` and `max_new_tokens` (a key it does not use is named in a "
        "note); `package` carries `grammar_file`; the rest is kept for HiveLLM's runtime. "
        "Bounds are the format's; other keys are kept (the format allows them).",
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
        "`training.config.gradient_checkpointing_kwargs`",
        CheckpointingKwargs,
        "Options of the recomputation; unknown keys are errors.",
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
manifest's folder (written with `\\` on Windows, they are found too); a Windows drive path
such as `F:/models/Qwen3-0.6B` is refused on Linux and macOS with a message naming it. Fields
marked *extension* are expert-cli's additions to the format.

Anywhere in the manifest, metadata and comments included (a package carries them), a number
must be finite (no `NaN`, `Infinity`, or `1e400`, which reads as infinity) and an integer must
fit in 64 bits, and text must be valid Unicode (no lone `\\ud800`-`\\udfff` escape); otherwise
the error names the JSON path.

This page is generated from the Pydantic models in `src/expert_cli/config/` by
`python scripts/gen_manifest_docs.py`; a test fails when it is out of date.
"""


def section(title: str, model: type[BaseModel], intro: str) -> str:
    lines = [
        f"## {title}",
        "",
        intro,
        "",
        "| field | type | default | limits | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for doc in describe_fields(model):
        alias = f" (alias `{doc.alias}`)" if doc.alias else ""
        default = doc.default if doc.default in ("required", "unset") else f"`{doc.default}`"
        kind = doc.type.replace(" | ", " \\| ")
        limits = doc.limits
        lines.append(f"| `{doc.name}`{alias} | {kind} | {default} | {limits} | {doc.meaning} |")
    return "\n".join(lines) + "\n"


def generate() -> str:
    return HEADER + "\n" + "\n".join(section(*item) for item in SECTIONS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/manifest.md is stale")
    check = parser.parse_args().check  # --help prints this; an unknown argument is exit 2
    text = generate()
    if check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python scripts/gen_manifest_docs.py")
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
