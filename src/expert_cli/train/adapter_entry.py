"""The manifest's adapter entry against the adapter it describes.

A package's `manifest.json` names the adapter's type, rank, alpha, dropout and target modules
in its adapter entry
(`base_models[0].adapters[0]`); its `adapter_config.json` holds what the weights were trained
with. They part when `training.config` overrode the entry (it wins, with a note at train time)
or a file was edited: a loader that reads the manifest then describes, or sizes, an adapter
the package does not hold. `package` writes the adapter's values into the entry (naming each
it changed); `check --package` names each that disagrees.
"""

from __future__ import annotations

from typing import Any

from expert_cli.config.adapters import decomposing

# peft's key for each entry field, per peft type (AdaLoRA's r is its initial rank)
RANK_KEYS = {"LORA": "r", "LOKR": "r", "ADALORA": "init_r"}
ALPHA_KEYS = {"LORA": "lora_alpha", "LOKR": "alpha", "ADALORA": "lora_alpha"}
DROPOUT_KEYS = {"LORA": "lora_dropout", "ADALORA": "lora_dropout"}  # LoKr's are its own
ALL_LINEAR = "all-linear"
# peft's types as people write them
KINDS = {
    "LORA": "LoRA", "ADALORA": "AdaLoRA", "IA3": "IA3", "LOKR": "LoKr", "LOHA": "LoHa",
    "VERA": "VeRA",
}  # fmt: skip


def described(config: dict[str, Any]) -> dict[str, Any]:
    """The entry fields (`type`, `r`, `alpha`, `dropout`, `target_modules`) an
    adapter_config.json says; none it lacks."""
    kind = config.get("peft_type")
    if not isinstance(kind, str):
        return {}
    found: dict[str, Any] = {"type": kind.lower()}
    if kind == "LORA" and config.get("use_dora") is True:
        found["type"] = "dora"
    for field, keys in (("r", RANK_KEYS), ("alpha", ALPHA_KEYS), ("dropout", DROPOUT_KEYS)):
        value = config.get(keys.get(kind, ""))
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[field] = value if field == "dropout" else whole(value)
    targets = config.get("target_modules")
    if isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
        found["target_modules"] = sorted(targets)  # peft saves a set: its order means nothing
    elif isinstance(targets, str) and targets:
        found["target_modules"] = targets
    return found


def _same(field: str, given: Any, value: Any) -> bool:
    """Whether the entry's value says what the adapter's does (target lists in any order;
    an entry's `all-linear` cannot be told from the list peft saved for it)."""
    if field == "target_modules":
        if isinstance(given, str) and given.lower() == ALL_LINEAR:
            return True
        if isinstance(given, list) and isinstance(value, list):
            return sorted(map(str, given)) == value
    if field == "dropout" and isinstance(given, int | float) and isinstance(value, int | float):
        return float(given) == float(value)
    return given == value


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
        if not _same(field, given, value):
            found.append((field, _shown(given), _shown(value)))
    return found


def _shown(value: Any) -> Any:
    return ", ".join(map(str, value)) if isinstance(value, list) else value


def reconciled(
    entry: dict[str, Any], config: dict[str, Any], where: str, trained_targets: Any = None
) -> list[str]:
    """Write the adapter's type, rank, alpha, dropout and target modules into `entry`; a note
    for each value changed (a field the entry left out is added without one).
    `trained_targets`: the target_modules the run resolved; `all-linear` stays so in the
    entry (peft saves the layers it found), a list or an entry's `all-linear` for a run that
    trained fewer layers becomes the adapter's list."""
    conflicts = disagreements(entry, config)
    adapter = described(config)
    given = entry.get("target_modules")
    if (
        isinstance(given, str)
        and given.lower() == ALL_LINEAR
        and "target_modules" in adapter
        and not (isinstance(trained_targets, str) and trained_targets.lower() == ALL_LINEAR)
    ):
        conflicts.append(("target_modules", given, _shown(adapter["target_modules"])))
    notes = [
        f"{where}.{field}: {was} in the manifest, {value} in the adapter it ships (its "
        "adapter_config.json: training.config or --set chose it, or the file was edited): "
        "the package says the adapter's"
        for field, was, value in conflicts
    ]
    if "type" in adapter and ("type" not in entry or entry_type(entry) != adapter["type"]):
        entry["type"] = adapter["type"]
        entry.pop("use_dora", None)  # the type says it
    for field in ("r", "alpha", "dropout"):
        if field in adapter:
            entry[field] = adapter[field]
        elif adapter.get("type") == "ia3":  # IA3 has none: a value left would mislead
            entry.pop(field, None)
    if "target_modules" in adapter and any(c[0] == "target_modules" for c in conflicts):
        entry["target_modules"] = adapter["target_modules"]
    elif "target_modules" in adapter and given is None:
        trained_all = isinstance(trained_targets, str) and trained_targets.lower() == ALL_LINEAR
        entry["target_modules"] = ALL_LINEAR if trained_all else adapter["target_modules"]
    return notes


def entry_problems(adapter: dict[str, Any], config: dict[str, Any], where: str) -> list[str]:
    """`check --package`: each type, rank or alpha of the manifest's adapter entry (at `where`)
    that the adapter_config.json shipped with it gives otherwise (the manifest would describe
    an adapter not shipped)."""
    return [
        f"{where}[0].{field}: {given} in manifest.json, {value} in adapter_config.json"
        for field, given, value in disagreements(adapter, config)
    ]


# training.config's names for the adapter entry's fields
CONFIG_FIELDS = {
    "adapter_type": "type",
    "rank": "r",
    "alpha": "alpha",
    "dropout": "dropout",
    "target_modules": "target_modules",
}


def config_notes(training_config: Any, config: dict[str, Any]) -> list[str]:
    """`check --package`: each adapter setting of the manifest's `training.config` that the
    adapter_config.json shipped gives otherwise (HiveLLM's loader reads the adapter entry,
    so the manifest only misdescribes how the adapter was trained)."""
    if not isinstance(training_config, dict):
        return []
    given = {CONFIG_FIELDS[k]: v for k, v in training_config.items() if k in CONFIG_FIELDS}
    init = training_config.get("init_lora_weights")
    if decomposing(init if isinstance(init, str) else None):  # shipped at twice r and alpha
        given = {k: v * 2 if k in ("r", "alpha") and _number(v) else v for k, v in given.items()}
    named = {field: name for name, field in CONFIG_FIELDS.items()}
    return [
        f"training.config.{named[field]}: {was} in manifest.json, {value} in "
        "adapter_config.json (the adapter shipped is the latter)"
        for field, was, value in disagreements(given, config)
        if field in given
    ]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def first_base(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest's (first) base model entry as its JSON holds it, either schema's ({} for
    none, or one not of its form)."""
    bases = manifest.get("base_models")
    base = bases[0] if isinstance(bases, list) and bases else manifest.get("base_model")
    return base if isinstance(base, dict) else {}


def base_note(manifest: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """`check --package`: adapter_config.json made for another base model than the manifest's
    (by the last part of each name: a local folder and a hub id of one model agree)."""
    name = first_base(manifest).get("name")
    theirs = config.get("base_model_name_or_path")
    if not isinstance(name, str) or not isinstance(theirs, str) or not name or not theirs:
        return []
    if _last_part(name) == _last_part(theirs):
        return []
    return [
        f"adapter_config.json: base_model_name_or_path {theirs} is not the manifest's base "
        f"model {name}: peft would load the adapter onto the former, HiveLLM onto the latter; "
        "an adapter trained on one base means nothing on another"
    ]


def _last_part(name: str) -> str:
    return name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()


# HiveLLM's runtime (its `chat`) adds (lora_alpha / r) x B A to each adapted weight, reading
# lora_alpha and r as whole numbers (a decimal reads as none: scale 1) and the A and B matrices
# by name; what else an adapter holds is not applied there
NOT_APPLIED = {
    "ADALORA": "AdaLoRA's singular values (lora_E)",
    "LOKR": "LoKr's Kronecker factors",
    "IA3": "IA3's scaling vectors",
}


def whole(value: float) -> float | int:
    """A whole number as an integer (16.0 as 16): peft writes an alpha to adapter_config.json
    as it is given, and HiveLLM's runtime reads 16.0 as no alpha (see NOT_APPLIED)."""
    return int(value) if float(value).is_integer() else value


def whole_alpha(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with a whole alpha written as an integer, as HiveLLM's runtime reads it."""
    key = ALPHA_KEYS.get(str(config.get("peft_type")))
    value = config.get(key) if key else None
    if isinstance(value, float):
        return {**config, str(key): whole(value)}
    return config


def runtime_notes(config: dict[str, Any]) -> list[str]:
    """What of the adapter HiveLLM's runtime would not apply as trained (see NOT_APPLIED);
    `generate` and `merge` here apply all of it."""
    return misapplied(config) + unapplied(config)


def misapplied(config: dict[str, Any]) -> list[str]:
    """What HiveLLM's runtime would apply at another scale or to another base than trained:
    expert-cli's package writes none of it (a whole alpha, rsLoRA folded, the standard form
    of PiSSA and OLoRA), so a package holding it was made otherwise."""
    kind = str(config.get("peft_type"))
    notes = []
    if (said := decimal_alpha(config)) and float(config[ALPHA_KEYS[kind]]).is_integer():
        notes.append(said)  # 16.0, which expert-cli's package writes as 16
    if kind == "LORA" and config.get("use_rslora") is True:  # a package expert-cli did not make
        notes.append(
            "adapter_config.json: use_rslora is true (scale alpha / sqrt(r)); HiveLLM's runtime "
            "reads r and lora_alpha and applies alpha / r, sqrt(r) times weaker than trained "
            "(expert-cli's package folds sqrt(r) into lora_B)"
        )
    init = config.get("init_lora_weights")
    if kind == "LORA" and decomposing(init if isinstance(init, str) else None):
        notes.append(
            f"adapter_config.json: init_lora_weights {init}: the adapter applies to the base "
            "less its decomposition, which HiveLLM's runtime does not make: it applies the "
            "adapter to the base itself, wrongly (expert-cli's package ships its standard form)"
        )
    return notes


def decimal_alpha(config: dict[str, Any]) -> str | None:
    """What HiveLLM's runtime makes of an alpha written as a decimal (16.0, or 12.5)."""
    key = ALPHA_KEYS.get(str(config.get("peft_type")))
    if not key or not isinstance(config.get(key), float):
        return None
    return (
        f"adapter_config.json: {key} {config[key]!r} is a decimal; HiveLLM's runtime reads "
        "a whole number only, and applies the adapter at scale 1 instead of alpha / r"
    )


def unapplied(config: dict[str, Any]) -> list[str]:
    """The adapter's parts HiveLLM's runtime does not apply at all (see NOT_APPLIED), and an
    alpha that is no whole number (a run's own choice, shipped as trained)."""
    kind = str(config.get("peft_type"))
    said = decimal_alpha(config)
    notes = [said] if said and not float(config[ALPHA_KEYS[kind]]).is_integer() else []
    held = NOT_APPLIED.get(kind)
    if kind == "LORA" and config.get("use_dora") is True:
        held = "DoRA's magnitude vectors"
    targets = config.get("target_modules")
    if isinstance(targets, list) and "embed_tokens" in targets:
        held = ", ".join(filter(None, [held, "the embedding's adapter (lora_embedding_A/B)"]))
    if held:
        notes.append(
            f"adapter_config.json: HiveLLM's runtime adds alpha / r x B A to each weight; "
            f"{held} are not applied there (generate and merge here apply them)"
        )
    return notes
