"""`training.config.init_adapter` (an extension): a run whose adapter starts from one trained
before (its weights; the optimizer starts afresh), to go on training an expert on more or
newer data. The adapter must be of the same kind: its type, rank, scale, DoRA and rsLoRA are
this run's, read here from its adapter_config.json before anything loads; its layers and
shapes are checked against the adapter the run builds (train/warm_start.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from expert_cli.config.adapters import decomposing
from expert_cli.config.base import NAME_LIKE
from expert_cli.config.models import LoadedManifest
from expert_cli.config.refs import local_path
from expert_cli.errors import UserError
from expert_cli.paths import shown_path

FIELD = "training.config.init_adapter"
CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20


def start_adapter(lm: LoadedManifest, adapter: dict[str, Any]) -> str | None:
    """The folder `init_adapter` names, absolute (its adapter is checked by
    `init_adapter_problem`, which `check` and a run starting afresh call: a resume reads its
    checkpoint, not this); UserError where this run's settings (`adapter`, as resolved)
    cannot start from one."""
    given = lm.manifest.training.config.init_adapter
    if given is None:
        return None
    kind = adapter["adapter_type"]
    if kind not in ("lora", "dora"):
        raise UserError(f"{FIELD}: starts LoRA and DoRA adapters; this run trains {kind}")
    if decomposing(adapter["init_lora_weights"]):
        raise UserError(
            f"{FIELD}: and init_lora_weights {adapter['init_lora_weights']} both choose the "
            "adapter's start; give one of them"
        )
    return str(local_path(lm.folder, given, FIELD))


def init_adapter_problem(resolved: Any, output: Path | None = None) -> str | None:
    """What keeps a run from starting from `resolved.init_adapter`: not a folder holding an
    adapter, one of other settings than the run's, or one inside the run's `output` folder
    (--overwrite sets its adapter aside before it is read); None where it can."""
    if not resolved.init_adapter:
        return None
    folder = Path(resolved.init_adapter)
    label = f"{FIELD} {shown_path(folder)}"
    if output is not None and folder.resolve().is_relative_to(output.resolve()):
        return (
            f"{label}: is in this run's --output folder, whose adapter the run replaces; copy "
            "it elsewhere and name the copy, or train into another --output"
        )
    config_file, weights = folder / CONFIG, folder / WEIGHTS
    if not folder.is_dir() or not config_file.is_file() or not weights.is_file():
        return (
            f"{label}: expected a folder holding {CONFIG} and {WEIGHTS} (a run's output "
            "folder, or one of its checkpoints)"
        )
    try:
        if config_file.stat().st_size > MAX_CONFIG_BYTES:
            return f"{label}: {CONFIG} is over 1 MB, larger than any adapter's configuration"
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, ValueError, RecursionError):
        return f"{label}: {CONFIG} is not readable JSON"
    if not isinstance(config, dict):
        return f"{label}: {CONFIG} is not a JSON object"
    if differs := _differences(config, resolved):
        return (
            f"{label}: its adapter differs from this run's ({'; '.join(differs)}); give this "
            "run the adapter's settings, or start afresh (leave init_adapter unset)"
        )
    return None


def _differences(config: dict[str, Any], resolved: Any) -> list[str]:
    """What in a saved adapter's configuration is not this run's adapter, as `there / here`."""
    if config.get("peft_type") != "LORA":
        return [f"peft_type {_shown(config.get('peft_type'))} there, LORA here"]
    init = config.get("init_lora_weights")
    if isinstance(init, str) and decomposing(init):  # peft's residual form: not W's
        return [
            f"it applies to a decomposed base (init_lora_weights "
            f"{_shown(config.get('init_lora_weights'))}): give the run's final adapter, which "
            "is the same update on the base itself"
        ]
    pairs = (
        ("r", config.get("r"), resolved.rank),
        ("lora_alpha", config.get("lora_alpha"), resolved.alpha),
        ("use_dora", bool(config.get("use_dora")), resolved.use_dora),
        ("use_rslora", bool(config.get("use_rslora")), resolved.use_rslora),
    )
    found = [
        f"{name} {_shown(there)} there, {_shown(here)} here"
        for name, there, here in pairs
        if not _same(there, here)
    ]
    there, here = config.get("target_modules"), resolved.target_modules
    lists = isinstance(there, list) and isinstance(here, list)  # all-linear: train's check
    if lists and (extra := sorted({str(t) for t in there} - set(here))):
        shown = [t for t in extra if NAME_LIKE.fullmatch(t)][:4] or [f"{len(extra)} names"]
        found.append(f"target_modules {', '.join(shown)} there, not here")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        found.append("a rank or alpha pattern there, one r and alpha here")
    return found


def _same(there: Any, here: Any) -> bool:
    if isinstance(here, bool) or isinstance(there, bool):
        return there is here
    numbers = all(isinstance(v, int | float) for v in (there, here))
    return numbers and math.isclose(float(there), float(here))


def _shown(value: Any) -> str:
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    return repr(value)[:40] if isinstance(value, str) else type(value).__name__
