"""The README.md model card of `export-hub`'s folder: the Hugging Face Hub's metadata block
(base_model, library_name, pipeline_tag, license, tags, datasets) and what a person choosing
the adapter wants to read, from the run's own records: the expert's description (and its
README), the adapter as the folder ships it (and how it was trained, where that differs), the
data, the settings, what it reached (the evaluation of the adapter exported, at its step, each
task's too), how it was trained (precision, hardware, versions) and how to use it.

Every figure comes from the packaged manifest, its adapter_config.json, manifest.resolved.json
and metrics.json, each value's type checked (a damaged record leaves a line out, never
fails); what a run did not record is left out. Text from the manifest is written as given (it
is the author's) in the body, and in the metadata block as JSON strings (tags that are not
printable left out), which YAML reads as written.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePath
from typing import Any

from expert_cli.train import card_figures as fig
from expert_cli.train.adapter_entry import first_base
from expert_cli.train.card_figures import CardFacts

# as huggingface_hub checks a repo id's parts: word characters, `-` and `.`, beginning and
# ending with a word character, no `--` or `..`, at most 96, not ending in `.git`
HUB_NAME = re.compile(
    r"(?!.*--)(?!.*\.\.)(?!.*\.git$)[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
)
# the Hub's own license ids that manifests commonly give (others are written as `other`)
LICENSES = {
    "apache-2.0", "mit", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-4.0",
    "cc-by-sa-4.0", "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-4.0",
    "gpl-2.0", "gpl-3.0", "llama2",
    "lgpl-2.1", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "unlicense", "openrail", "llama3",
    "llama3.1", "llama3.2", "llama3.3", "gemma", "other",
}  # fmt: skip
FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?\r?\n)?---[ \t]*(\r?\n|\Z)", re.S)


def hub_id(name: Any) -> str | None:
    """`name` where it is written as a Hub repository id, OWNER/NAME (`Qwen/Qwen3-0.6B`), else
    None: ASCII letters, digits, `-`, `_`, `.`, no `--` or `..`, beginning and ending with
    a letter, digit or `_`, not ending in `.git`."""
    if not isinstance(name, str) or name.count("/") != 1:
        return None
    return name if all(HUB_NAME.fullmatch(part) for part in name.split("/")) else None


def model_card(facts: CardFacts) -> tuple[str, list[str]]:
    """The model card (Markdown with a YAML metadata block), and notes on what it could not
    say as given (a license the Hub does not know, the README's own metadata left out)."""
    notes: list[str] = []
    manifest, resolved = facts.manifest, facts.resolved
    base = first_base(manifest).get("name")
    on_hub = resolved.get("base_model_kind") == "hub" and hub_id(base) is not None
    lines = ["---", *_metadata(facts, base if on_hub else None, notes), "---", ""]
    title = " ".join(str(manifest.get(k) or "") for k in ("name", "version")).strip()
    lines += [f"# {title or 'expert'}", ""]
    if isinstance(manifest.get("description"), str) and manifest["description"].strip():
        lines += [manifest["description"].strip(), ""]
    kind = fig.kind_name(facts.config)
    local = f"`{PurePath(str(base)).name}` (a local folder)"  # its name, not where it lies
    on = f"[{base}](https://huggingface.co/{base})" if on_hub else local
    lines += [
        f"{fig.article(kind)} {kind} adapter for {on}, trained with expert-cli from a HiveLLM "
        "expert manifest (`manifest.json` here).",
        "",
    ]
    if resolved.get("init") == "random":
        lines += [fig.RANDOM_BASE, ""]
    if facts.readme:
        if (found := FRONT_MATTER.match(facts.readme)) and (found.group(1) or "").strip():
            notes.append("the expert's README.md opens with a metadata block: left out of the card")
        lines += [FRONT_MATTER.sub("", facts.readme, count=1).strip(), ""]
    lines += fig.training(facts) + fig.results(facts) + _usage(facts, on_hub)
    return "\n".join(lines).rstrip() + "\n", notes


def _metadata(facts: CardFacts, base: str | None, notes: list[str]) -> list[str]:
    manifest = facts.manifest
    fields: list[tuple[str, Any]] = [("base_model", base)] if base else []
    fields += [("library_name", "peft"), ("pipeline_tag", "text-generation")]
    licensed = [f for f in ("LICENSE", "LICENSE.md", "LICENSE.txt") if f in facts.files]
    fields += _license(manifest.get("license"), licensed[0] if licensed else None, notes)
    lora = facts.config.get("peft_type") == "LORA" and not facts.config.get("use_dora")
    tags = ["expert-cli", "hivellm", *(["lora"] if lora else []), "peft"]
    if base:
        tags.append(f"base_model:adapter:{base}")
    given = manifest.get("tags") if isinstance(manifest.get("tags"), list) else []
    tags += [t for t in given if isinstance(t, str) and t.strip() and t.isprintable()]
    fields.append(("tags", list(dict.fromkeys(tags))))
    sources = facts.resolved.get("train_sources")
    sources = sources if isinstance(sources, list) else []
    hub = [s.get("location") for s in sources if isinstance(s, dict) and s.get("kind") == "hub"]
    if datasets := [d for d in dict.fromkeys(hub) if hub_id(d)]:
        fields.append(("datasets", datasets))
    lines = []
    for key, value in fields:
        if isinstance(value, list):
            lines += [f"{key}:", *(f"- {json.dumps(v, ensure_ascii=False)}" for v in value)]
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
    return lines


def _license(value: Any, has_file: str | None, notes: list[str]) -> list[tuple[str, Any]]:
    """The Hub's license fields for the manifest's `license`: its id where it is one the Hub
    knows (`Apache 2.0` read as apache-2.0), else `other` with the name as given."""
    if not isinstance(value, str) or not value.strip():
        return []
    words = re.sub(r"\b(license|version)\b|,", " ", value.strip().lower())
    key = re.sub(r"[\s_]+", "-", words.strip()).removesuffix("-only")
    key = {"apache-2": "apache-2.0", "apache2": "apache-2.0", "apache": "apache-2.0"}.get(key, key)
    if key in LICENSES:
        return [("license", key)]
    notes.append(
        "license: not one of the Hub's license ids, so the card says `other` with its name"
        + ("" if has_file else " (no LICENSE file ships beside it)")
    )
    name = re.sub(r"[^a-z0-9.]+", "-", key).strip("-")[:64] or "unnamed"
    named = [("license", "other"), ("license_name", name)]
    return named + ([("license_link", has_file)] if has_file else [])


def _usage(facts: CardFacts, on_hub: bool) -> list[str]:
    repo = facts.repo_id or "OWNER/NAME"
    comment = "" if facts.repo_id else "  # the repository this folder is uploaded to"
    lines = [
        "## Use",
        "",
        "With peft (transformers loads the base named in adapter_config.json"
        + ("" if on_hub else ", a local folder: set it to the base's hub id or path")
        + "):",
        "",
        "```python",
        "from peft import AutoPeftModelForCausalLM",
        "from transformers import AutoTokenizer",
        "",
        f'model = AutoPeftModelForCausalLM.from_pretrained("{repo}"){comment}',
    ]
    if "tokenizer_config.json" in facts.files or "tokenizer.json" in facts.files:
        lines.append(f'tokenizer = AutoTokenizer.from_pretrained("{repo}")')
    lines += ["```", ""]
    if ggufs := sorted(f for f in facts.files if f.endswith(".gguf")):
        lines += [
            f"With llama.cpp: `{ggufs[0]}` here is the adapter as a GGUF file, applied to a GGUF "
            f"of the base: `llama-cli -m BASE.gguf --lora {ggufs[0]}`.",
            "",
        ]
    elif facts.config.get("peft_type") == "LORA" and not facts.config.get("use_dora"):
        lines += [
            "With llama.cpp: llama.cpp's `convert_lora_to_gguf.py` turns this folder into a "
            "GGUF adapter (`--base` the base's folder), applied with "
            "`llama-cli -m BASE.gguf --lora ADAPTER.gguf`; from the run's own folder, "
            "`expert-cli export-gguf` writes it.",
            "",
        ]
    lines += ["HiveLLM installs the `.expert` package of the same run (`expert-cli package`).", ""]
    return lines
