"""The manifest's adapter entry against the adapter it describes.

A package's `manifest.json` names the adapter's type, rank and alpha in its adapter entry
(`base_models[0].adapters[0]`); its `adapter_config.json` holds what the weights were trained
with. They part when `training.config` overrode the entry (it wins, with a note at train time)
or a file was edited: a loader that reads the manifest then describes, or sizes, an adapter
the package does not hold. `package` writes the adapter's values into the entry (naming each
it changed); `check --package` names each that disagrees.
"""

from __future__ import annotations

from typing import Any

# peft's key for each entry field, per peft type (AdaLoRA's r is its initial rank)
RANK_KEYS = {"LORA": "r", "LOKR": "r", "ADALORA": "init_r"}
ALPHA_KEYS = {"LORA": "lora_alpha", "LOKR": "alpha", "ADALORA": "lora_alpha"}


def described(config: dict[str, Any]) -> dict[str, Any]:
    """The entry fields (`type`, `r`, `alpha`) an adapter_config.json says; none it lacks."""
    kind = config.get("peft_type")
    if not isinstance(kind, str):
        return {}
    found: dict[str, Any] = {"type": kind.lower()}
    if kind == "LORA" and config.get("use_dora") is True:
        found["type"] = "dora"
    for field, keys in (("r", RANK_KEYS), ("alpha", ALPHA_KEYS)):
        value = config.get(keys.get(kind, ""))
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[field] = int(value) if float(value).is_integer() else value
    return found


def entry_type(entry: dict[str, Any]) -> Any:
    """The entry's adapter type, `lora` with `use_dora` read as `dora`."""
    kind = entry.get("type", "lora")
    return "dora" if kind == "lora" and entry.get("use_dora") is True else kind


def disagreements(entry: dict[str, Any], config: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, the entry's value, the adapter's) for each field the entry gives otherwise."""
    found = []
    for field, value in described(config).items():
        given = entry_type(entry) if field == "type" else entry.get(field)
        if given is None and field != "type":
            continue
        if given != value:
            found.append((field, given, value))
    return found


def reconciled(entry: dict[str, Any], config: dict[str, Any], where: str) -> list[str]:
    """Write the adapter's type, rank and alpha into `entry`; a note for each value changed
    (a field the entry left out is added without one)."""
    notes = [
        f"{where}.{field}: {given} in the manifest, {value} in the adapter it ships "
        "(training.config or --set chose it): the package says the adapter's"
        for field, given, value in disagreements(entry, config)
    ]
    adapter = described(config)
    if "type" in adapter and entry_type(entry) != adapter["type"]:
        entry["type"] = adapter["type"]
        entry.pop("use_dora", None)  # the type says it
    for field in ("r", "alpha"):
        if field in adapter:
            entry[field] = adapter[field]
        elif adapter.get("type") == "ia3":  # IA3 has neither: a value left would mislead
            entry.pop(field, None)
    return notes
