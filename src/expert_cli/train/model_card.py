"""The README.md model card of `export-hub`'s folder: the Hugging Face Hub's metadata block
(base_model, library_name, pipeline_tag, license, tags, datasets) and what a person choosing
the adapter wants to read, from the run's own records: the expert's description (and its
README), how it was trained, what it reached (the train loss, the evaluation of the adapter
exported, each task's), and how to use it (peft, expert-cli, llama.cpp).

Every figure comes from the packaged manifest, manifest.resolved.json and metrics.json; what
a run did not record is left out. Text from the manifest is written as given (it is the
author's), in the metadata block as JSON strings, which YAML reads as written.
"""

from __future__ import annotations

import json
import re
from typing import Any

from expert_cli.train.adapter_entry import first_base, whole

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")  # owner/name, never a path
FRONT_MATTER = re.compile(r"\A---\r?\n.*?\r?\n---\r?\n", re.S)  # a README's own metadata


def hub_id(name: Any) -> str | None:
    """`name` where it is a hub id (`Qwen/Qwen3-0.6B`), else None (a local folder)."""
    if not isinstance(name, str) or name.startswith((".", "/", "~")) or "\\" in name:
        return None
    return name if HUB_ID.fullmatch(name) else None


def model_card(
    manifest: dict[str, Any],
    resolved: dict[str, Any],
    metrics: dict[str, Any],
    readme: str | None = None,
    repo_id: str | None = None,
) -> str:
    """The model card (Markdown with a YAML metadata block) of the packaged `manifest`'s
    adapter; `readme`: the expert's own README.md, kept under the card's summary; `repo_id`:
    the repository it will be uploaded to, for the usage example."""
    base = first_base(manifest).get("name")
    lines = ["---", *_metadata(manifest, resolved, base), "---", ""]
    title = " ".join(str(manifest.get(k) or "") for k in ("name", "version")).strip()
    lines += [f"# {title or 'expert'}", ""]
    if isinstance(manifest.get("description"), str) and manifest["description"].strip():
        lines += [manifest["description"].strip(), ""]
    on = f"[{base}](https://huggingface.co/{base})" if hub_id(base) else f"`{base}`"
    lines += [
        f"A {_kind(resolved)} adapter for {on}, trained with expert-cli from a HiveLLM expert "
        "manifest (`manifest.json` here).",
        "",
    ]
    if readme:
        lines += [FRONT_MATTER.sub("", readme).strip(), ""]
    lines += _training(resolved, metrics) + _results(manifest, metrics) + _usage(base, repo_id)
    return "\n".join(lines).rstrip() + "\n"


def _metadata(manifest: dict[str, Any], resolved: dict[str, Any], base: Any) -> list[str]:
    fields: list[tuple[str, Any]] = []
    if hub_id(base):
        fields.append(("base_model", base))
    fields += [("library_name", "peft"), ("pipeline_tag", "text-generation")]
    if isinstance(manifest.get("license"), str) and manifest["license"].strip():
        fields.append(("license", manifest["license"].strip()))
    tags = ["expert-cli", "hivellm", "lora", "peft"]
    if hub_id(base):
        tags.append(f"base_model:adapter:{base}")
    tags += [t for t in manifest.get("tags") or [] if isinstance(t, str) and t not in tags]
    fields.append(("tags", tags))
    sources = resolved.get("train_sources") or []
    datasets = [
        s.get("location") for s in sources if isinstance(s, dict) and s.get("kind") == "hub"
    ]
    if datasets := [d for d in dict.fromkeys(datasets) if hub_id(d)]:
        fields.append(("datasets", datasets))
    lines = []
    for key, value in fields:
        if isinstance(value, list):
            lines += [f"{key}:", *(f"- {json.dumps(v, ensure_ascii=False)}" for v in value)]
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
    return lines


def _kind(resolved: dict[str, Any]) -> str:
    kind = str(resolved.get("adapter_type") or "lora")
    names = {"lora": "LoRA", "qlora": "QLoRA", "dora": "DoRA", "adalora": "AdaLoRA", "ia3": "IA3"}
    shown = names.get(kind, kind)
    if resolved.get("use_dora") and shown != "DoRA":
        shown += " (DoRA)"
    return shown


def _training(resolved: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
    """The settings that made the adapter, as a table of what the run recorded."""
    summary = metrics.get("summary") or {}
    rows = [
        ("adapter", _adapter(resolved)),
        ("quantization of the base", resolved.get("quantization")),
        ("learning rate", _schedule(resolved)),
        ("batch", _batch(resolved)),
        ("max sequence length", resolved.get("max_seq_length")),
        ("packing", "on" if resolved.get("packing") else "off"),
        ("epochs", resolved.get("epochs")),
        ("optimizer steps", summary.get("steps")),
        ("tokens seen", _count(summary.get("tokens"))),
        ("tokens trained on (the loss's)", _count(summary.get("trained_tokens"))),
        ("seed", resolved.get("seed")),
    ]
    shown = [(k, v) for k, v in rows if v not in (None, "", "none")]
    return (
        ["## Training", "", "| setting | value |", "| --- | --- |"]
        + [f"| {key} | {_cell(value)} |" for key, value in shown]
        + [""]
    )


def _adapter(resolved: dict[str, Any]) -> str:
    targets = resolved.get("target_modules")
    targets = ", ".join(targets) if isinstance(targets, list) else targets
    alpha = resolved.get("alpha")
    alpha = whole(alpha) if isinstance(alpha, float) else alpha
    parts = [_kind(resolved), f"r {resolved.get('rank')}", f"alpha {alpha}"]
    if resolved.get("dropout"):
        parts.append(f"dropout {resolved['dropout']}")
    if resolved.get("use_rslora"):
        parts.append("rsLoRA")
    if resolved.get("init_lora_weights") not in (None, True, "default"):
        parts.append(f"init {resolved['init_lora_weights']}")
    return ", ".join(parts) + (f" on {targets}" if targets else "")


def _schedule(resolved: dict[str, Any]) -> str | None:
    rate = resolved.get("learning_rate")
    if rate is None:
        return None
    warmup = resolved.get("warmup_steps") or 0
    ratio = resolved.get("warmup_ratio") or 0
    warm = f", warm-up {warmup} steps" if warmup else f", warm-up ratio {ratio:g}" if ratio else ""
    return f"{rate:g}, {resolved.get('lr_scheduler') or 'linear'}{warm}"


def _batch(resolved: dict[str, Any]) -> str | None:
    size, accumulation = resolved.get("batch_size"), resolved.get("gradient_accumulation_steps")
    if not isinstance(size, int):
        return None
    return f"{size} x {accumulation or 1} accumulation"


def _results(manifest: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
    """The train loss, and the evaluation of the adapter exported (at its step, else the
    run's last), each task's too."""
    summary = metrics.get("summary") or {}
    evals = [e for e in metrics.get("evals") or [] if isinstance(e, dict)]
    adapter = (manifest.get("training") or {}).get("packaging_checkpoint") or "final"
    step = next(
        (a.get("checkpoint_step") for a in _entries(manifest) if "checkpoint_step" in a), None
    )
    at = [e for e in evals if e.get("step") == step] if step is not None else evals[-1:]
    lines = ["## Results", ""]
    if isinstance(summary.get("final_loss"), int | float):
        lines.append(f"- final train loss: {summary['final_loss']:.4g}")
    if at:
        e = at[-1]
        which = f"{adapter} (step {e.get('step')})"
        if isinstance(e.get("eval_loss"), int | float):
            lines.append(f"- eval loss of the adapter here, {which}: {e['eval_loss']:.4g}")
        if isinstance(e.get("token_accuracy"), int | float):
            lines.append(f"- its token accuracy: {e['token_accuracy']:.1%}")
        for task, figures in (e.get("tasks") or {}).items():
            if isinstance(figures, dict) and isinstance(figures.get("eval_loss"), int | float):
                lines.append(f"- task `{task}`: eval loss {figures['eval_loss']:.4g}")
    if len(lines) == 2:
        lines.append("- the run recorded no loss")
    return [*lines, ""]


def _entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    adapters = first_base(manifest).get("adapters") or manifest.get("adapters") or []
    return [a for a in adapters if isinstance(a, dict)]


def _usage(base: Any, repo_id: str | None) -> list[str]:
    repo = repo_id or "OWNER/NAME"
    comment = "" if repo_id else "  # the repository this folder is uploaded to"
    base_shown = base if isinstance(base, str) else "<the base model>"
    return [
        "## Use",
        "",
        "With peft (transformers loads the base named in adapter_config.json):",
        "",
        "```python",
        "from peft import AutoPeftModelForCausalLM",
        "from transformers import AutoTokenizer",
        "",
        f'model = AutoPeftModelForCausalLM.from_pretrained("{repo}"){comment}',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo}")',
        "```",
        "",
        "With llama.cpp: `expert-cli export-gguf --adapter RUN_DIR` writes the run's adapter "
        "as a GGUF adapter file, applied to a GGUF of the base:",
        "",
        "```bash",
        f"llama-cli -m <a GGUF of {base_shown}> --lora <the adapter's .gguf>",
        "```",
        "",
        "HiveLLM installs the `.expert` package of the same run (`expert-cli package`).",
        "",
    ]


def _count(value: Any) -> str | None:
    return f"{value:,}" if isinstance(value, int) else None


def _cell(value: Any) -> str:
    """A table cell: one line, its pipes escaped."""
    return " ".join(str(value).split()).replace("|", "\\|")
