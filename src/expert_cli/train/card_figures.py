"""The model card's tables and figures (train/model_card.py): the adapter as the folder ships
it and how it was trained, the data, the settings, the hardware, and the evaluation of the
adapter exported at its own step. Each value read from a record is type-checked: a damaged
or hand-edited record leaves its line out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from expert_cli.jsontext import finite_number
from expert_cli.train.adapter_entry import KINDS, whole
from expert_cli.train.lora_init import decomposes

RANDOM_BASE = (
    "**The base was built with random weights** (`init: random`, expert-cli's demo): the "
    "adapter means nothing on any other copy of it. It shows the files and the card, not a "
    "model to use."
)


@dataclass
class CardFacts:
    """What the card is made of: the packaged manifest, the adapter_config.json shipped, the
    run's records, the step the adapter holds, the expert's README, the member names."""

    manifest: dict[str, Any]
    config: dict[str, Any]
    resolved: dict[str, Any]
    metrics: dict[str, Any]
    step: int | None = None
    readme: str | None = None
    repo_id: str | None = None
    files: set[str] = field(default_factory=set)


def article(word: str) -> str:
    return "An" if word[:1].upper() in "AEIOU" else "A"


def kind_name(config: dict[str, Any]) -> str:
    kind = KINDS.get(str(config.get("peft_type")), str(config.get("peft_type") or "adapter"))
    return "DoRA" if kind == "LoRA" and config.get("use_dora") else kind


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.isprintable() and len(value) <= 200 else None


def _whole(value: Any) -> int | None:
    number = finite_number(value)
    fits = number is not None and number == int(number) and abs(number) < 2**63
    return int(number) if fits else None


def _shipped(config: dict[str, Any]) -> str:
    """The adapter as adapter_config.json ships it."""
    targets = config.get("target_modules")
    if isinstance(targets, list):  # a module's last name: layers.0.mlp.up_proj as up_proj
        targets = ", ".join(sorted({str(t).rsplit(".", 1)[-1] for t in targets}))
    on = f" on {targets}" if isinstance(targets, str) and targets else ""
    kind = kind_name(config)
    alpha = finite_number(config.get("lora_alpha", config.get("alpha")))
    alpha_text = f", alpha {whole(alpha)}" if alpha is not None else ""
    if kind == "IA3":
        return f"IA3{on}"
    if kind == "AdaLoRA":
        return f"AdaLoRA r {config.get('target_r')} (from {config.get('init_r')}){alpha_text}{on}"
    rank = _whole(config.get("r"))
    return f"{kind} r {rank}{alpha_text}{on}" if rank is not None else f"{kind}{on}"


def _trained_as(resolved: dict[str, Any]) -> str | None:
    """How the run trained it, where the folder's adapter is another form of the same update."""
    init = resolved.get("init_lora_weights")
    if decomposes(init):
        return (
            f"{init} at r {resolved.get('rank')}: shipped as the same update on the base itself, "
            "a LoRA of twice the rank and alpha (peft loads it on the original base)"
        )
    if resolved.get("use_rslora") is True:
        return (
            "rsLoRA (alpha / sqrt(r)): sqrt(r) is folded into lora_B, so the folder's adapter is "
            "a plain LoRA giving the same update"
        )
    return None


def _data(resolved: dict[str, Any]) -> str | None:
    stats = _dict(_dict(_dict(resolved.get("runtime")).get("data")).get("stats"))
    train, valid = _dict(stats.get("train")), _dict(stats.get("eval"))
    examples, tokens = _whole(train.get("examples")), _whole(train.get("tokens"))
    if examples is None:
        return None
    text = f"{examples:,} training examples" + (f" ({tokens:,} tokens)" if tokens else "")
    if (held := _whole(valid.get("examples"))) is not None:
        text += f", {held:,} held out for evaluation"
    sources = (
        resolved.get("train_sources") if isinstance(resolved.get("train_sources"), list) else []
    )
    tasks = [_dict(s) for s in sources if _dict(s).get("task")]
    if tasks:
        text += "; tasks " + ", ".join(
            f"{t['task']} (weight {t.get('weight'):g})"
            if finite_number(t.get("weight")) is not None
            else str(t["task"])
            for t in tasks[:20]
        )
    return text


def _schedule(resolved: dict[str, Any]) -> str | None:
    rate = finite_number(resolved.get("learning_rate"))
    if rate is None:
        return None
    warmup, ratio = (
        _whole(resolved.get("warmup_steps")),
        finite_number(resolved.get("warmup_ratio")),
    )
    warmup = warmup if warmup and warmup > 0 else None
    ratio = ratio if ratio and 0 < ratio < 1 else None
    warm = f", warm-up {warmup} steps" if warmup else f", warm-up ratio {ratio:g}" if ratio else ""
    return f"{rate:g}, {_text(resolved.get('lr_scheduler')) or 'linear'}{warm}"


def _batch(resolved: dict[str, Any]) -> str | None:
    size = _whole(resolved.get("batch_size"))
    if size is None:
        return None
    accumulation = _whole(resolved.get("gradient_accumulation_steps")) or 1
    world = _whole(_dict(resolved.get("runtime")).get("world_size")) or 1
    shown = f"{size} rows x {accumulation} accumulation"
    return shown + (f" x {world} processes" if world > 1 else "")


def _length(resolved: dict[str, Any]) -> str | None:
    steps = _whole(_dict(resolved.get("runtime")).get("max_steps")) or _whole(
        resolved.get("max_steps")
    )
    if steps and steps > 0:
        return f"max_steps {steps:,}"
    epochs = finite_number(resolved.get("epochs"))
    if epochs is None:
        return None
    return f"{epochs:g} epoch" + ("" if epochs == 1 else "s")


def _machine(resolved: dict[str, Any]) -> str | None:
    env = _dict(_dict(resolved.get("runtime")).get("environment"))
    packages = _dict(env.get("packages"))
    gpu, count = env.get("gpu_name"), _whole(env.get("gpu_count")) or 0
    where = f"{count} x {gpu}" if isinstance(gpu, str) and count else "CPU"
    precision = "bf16" if resolved.get("bf16") else "fp16" if resolved.get("fp16") else "fp32"
    versions = ", ".join(
        f"{name} {packages[name]}" for name in ("transformers", "peft") if packages.get(name)
    )
    torch = f"torch {env['torch']}" if isinstance(env.get("torch"), str) else ""
    return ", ".join(p for p in (where, precision, torch, versions) if p) or None


def training(facts: CardFacts) -> list[str]:
    """The table of what made the adapter."""
    resolved = facts.resolved
    summary = _dict(facts.metrics.get("summary"))
    windows = _dicts(facts.metrics.get("windows"))
    seen = _whole(windows[-1].get("tokens_seen")) if windows else None
    revision = _text(resolved.get("revision"))
    rows = [
        ("adapter (as shipped)", _shipped(facts.config)),
        ("trained as", _trained_as(resolved)),
        ("base revision", revision),
        ("data", _data(resolved)),
        ("prompt layout", _text(resolved.get("prompt_template"))),
        ("quantization of the base", _text(resolved.get("quantization"))),
        ("learning rate", _schedule(resolved)),
        ("batch", _batch(resolved)),
        ("max sequence length", _whole(resolved.get("max_seq_length"))),
        ("packing", "on" if resolved.get("packing") is True else None),
        ("length", _length(resolved)),
        ("the run's optimizer steps", _whole(summary.get("steps"))),
        ("the run's tokens seen", f"{seen:,}" if seen else None),
        (
            "the run's end",
            _text(summary.get("status")) if summary.get("status") != "completed" else None,
        ),
        ("machine", _machine(resolved)),
        ("seed", _whole(resolved.get("seed"))),
    ]
    shown = [(k, v) for k, v in rows if v not in (None, "", "none")]
    return (
        ["## Training", "", "| setting | value |", "| --- | --- |"]
        + [f"| {key} | {_cell(value)} |" for key, value in shown]
        + [""]
    )


def results(facts: CardFacts) -> list[str]:
    """The train loss and evaluation of the adapter exported, at its step (each task's)."""
    name = _dict(facts.manifest.get("training")).get("packaging_checkpoint") or "final"
    step = facts.step
    lines = ["## Results", ""]
    if step is None:
        return [*lines, f"- the step the {name} adapter holds is not recorded", ""]
    windows = _dicts(facts.metrics.get("windows"))
    before = [w for w in windows if (_whole(w.get("step")) or 0) <= step]
    loss = finite_number(before[-1].get("loss")) if before else None
    if loss is not None:
        lines.append(f"- train loss at step {_whole(before[-1].get('step'))}: {loss:.4g}")
    evals = _dicts(facts.metrics.get("evals"))
    at = [e for e in evals if _whole(e.get("step")) == step]
    if not at:
        lines.append(f"- the {name} adapter (step {step}) was not evaluated at its step")
        return [*lines, ""]
    e = at[-1]
    eval_loss, accuracy = finite_number(e.get("eval_loss")), finite_number(e.get("token_accuracy"))
    if eval_loss is not None:
        lines.append(f"- eval loss of the adapter here, {name} (step {step}): {eval_loss:.4g}")
    if accuracy is not None:
        lines.append(f"- its token accuracy: {accuracy:.1%}")
    for task, figures in list(_dict(e.get("tasks")).items())[:50]:
        task_loss = finite_number(_dict(figures).get("eval_loss"))
        task_accuracy = finite_number(_dict(figures).get("token_accuracy"))
        if task_loss is not None:
            tail = f", token accuracy {task_accuracy:.1%}" if task_accuracy is not None else ""
            lines.append(f"- task `{_cell(task)}`: eval loss {task_loss:.4g}{tail}")
    return [*lines, ""]


def _cell(value: Any) -> str:
    """A table cell: one line, its pipes escaped."""
    return " ".join(str(value).split()).replace("|", "\\|")
