"""The package's manifest completed from the run: its adapter entry reconciled with the
adapter it ships, what HiveLLM's loader needs written from the run, and (said before
training, and by `check`) what its author must write because the run cannot."""

from __future__ import annotations

import copy
from typing import Any

from expert_cli.train.adapter_entry import ALPHA_KEYS, DROPOUT_KEYS, RANK_KEYS, reconciled
from expert_cli.train.hive_loader import for_hive_loader, loader_problems
from expert_cli.train.package_check import adapters_of

SHOWN_FIELDS = 6  # fields a note names


def completed_for_package(
    manifest: dict[str, Any], resolved: dict[str, Any], config: dict[str, Any]
) -> list[str]:
    """The manifest's adapter entry (made where there is none) reconciled with the adapter's
    configuration, and the rest HiveLLM's loader needs written from the run (in place)."""
    adapters, where = adapters_of(manifest)
    if not adapters:
        adapters.append({"type": resolved.get("adapter_type") or "lora"})
    notes = reconciled(adapters[0], config, f"{where}[0]", resolved.get("target_modules"))
    return notes + for_hive_loader(manifest, adapters, resolved, config)


def _planned_config(resolved: dict[str, Any]) -> dict[str, Any]:
    """The adapter_config.json a run of `resolved` writes, as far as the package's manifest
    reads it; all-linear's layers, known once the model is built, by a stand-in name."""
    kind = resolved.get("adapter_type") or "lora"
    peft = {"dora": "LORA"}.get(kind, kind.upper())
    targets = resolved.get("target_modules")
    config = {
        "peft_type": peft,
        "use_dora": kind == "dora" or resolved.get("use_dora") is True,
        "target_modules": targets if isinstance(targets, list) else ["linear"],
    }
    for keys, value in ((RANK_KEYS, "rank"), (ALPHA_KEYS, "alpha"), (DROPOUT_KEYS, "dropout")):
        if peft in keys:
            config[keys[peft]] = resolved.get(value)
    return config


def author_notes(manifest: Any, resolved: dict[str, Any]) -> list[str]:
    """A note naming the fields HiveLLM's loader needs that `package` cannot write from the
    run (description, capabilities, constraints, a soft prompt's tokens ...), found as
    `package` finds them: on a copy completed from the run `resolved` plans. Said before
    training, so they can be given before `package` stops on them; none when none."""
    if not isinstance(manifest, dict):
        return []
    filled = copy.deepcopy(manifest)
    if filled.get("schema_version") == "2.0" and isinstance(filled.get("base_models"), list):
        filled["base_models"] = filled["base_models"][:1]  # as plan_members ships it
    try:
        completed_for_package(filled, resolved, _planned_config(resolved))
    except (AttributeError, TypeError, KeyError, IndexError):  # a shape `check` names
        return []
    fields = list(dict.fromkeys(line.split(":", 1)[0] for line in loader_problems(filled)))
    if not fields:
        return []
    if len(fields) > SHOWN_FIELDS:
        shown = f"{', '.join(fields[:SHOWN_FIELDS])} and {len(fields) - SHOWN_FIELDS} more"
    else:
        shown = " and ".join([", ".join(fields[:-1]), fields[-1]] if len(fields) > 1 else fields)
    them = "them" if len(fields) > 1 else "it"
    return [
        f"package: HiveLLM's loader would refuse {shown} (missing, or not of its form), "
        f"which the run cannot write: give {them} in the manifest before `expert-cli "
        f"package`, which stops on {them}"
    ]
