"""What HiveLLM's own loader requires of a package's `manifest.json`, and a run's manifest
completed from what the run trained so that it meets it.

hivellm/expert's CLI (Rust; read at commit 9cd24b1, `cli/src/manifest.rs` and
`commands/validate.rs`) parses `manifest.json` into typed records before `install`,
`validate`, `sign` or `chat` does anything else. Keys it does not know pass, and a field it
marks optional may be missing or null; every other field must be there with its type: a list
of module names where expert-cli accepts `"all-linear"`, whole numbers for ranks, alphas, batch
sizes and step counts (`32.0` is refused), an object for `repository`. Then a few rules: a
rank for every adapter type but ia3, epochs and a learning rate above 0, at least one target
module. Its `validate` and `chat` look for `adapter_model.safetensors` and
`adapter_config.json` at the package's root only (the adapter entry's `path` field is gone
from its records): elsewhere, chat answers with the base model alone.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

from expert_cli.config.base import encodes
from expert_cli.errors import UserError, escaped, value_kind
from expert_cli.train.adapter_entry import described
from expert_cli.train.hive_schema import (
    ANY,
    BIG,
    BIG_MAX,
    DEPTH_LIMIT,
    FLAG,
    MANIFEST,
    NUMBER,
    TEXT,
    TRAINING_CONFIG,
    WHOLE,
    WHOLE_MAX,
    Record,
)


def _expected(kind: Any) -> str:
    if isinstance(kind, Record):
        return "an object"
    if isinstance(kind, tuple):
        if kind[0] == "either":
            return " or ".join(_expected(k) for k in kind[1:])
        plural = {TEXT: "strings", WHOLE: "whole numbers", NUMBER: "numbers"}
        inner = plural.get(kind[1], "objects") if isinstance(kind[1], str) else "objects"
        return f"a list of {inner}" if kind[0] == "list" else f"an object of {inner}"
    return {
        TEXT: "a string",
        WHOLE: f"a whole number from 0 to {WHOLE_MAX:,}",
        BIG: "a whole number of 0 or more",
        NUMBER: "a number",
        FLAG: "true or false",
    }.get(kind, "a value")


def _fits(kind: Any, value: Any) -> bool:
    """Whether a value (not an object or list) has the type the loader reads: a string
    without a lone surrogate, a number a double holds, a whole number in range."""
    if kind == TEXT:
        return isinstance(value, str) and encodes(value)
    if kind == FLAG:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if kind == NUMBER:
        return _finite(value)
    return isinstance(value, int) and 0 <= value <= (WHOLE_MAX if kind == WHOLE else BIG_MAX)


def _finite(value: int | float) -> bool:
    """Whether a JSON number is one a double holds (1e400 is out of range to the loader)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:  # a whole number past a double's range
        return False


def _shape(kind: Any, value: Any, where: str, out: list[str], depth: int = 1) -> None:
    """Each place in `value` the loader refuses, as `where: ...` lines; `depth`: the objects
    and lists open at `value` (itself one, when it is either)."""
    if isinstance(kind, tuple) and kind[0] == "either":
        if not any(_fits_all(k, value, depth) for k in kind[1:]):
            out.append(f"{where}: {_kind(value)}; expected {_expected(kind)}")
        return
    if isinstance(value, dict | list) and depth > DEPTH_LIMIT:
        out.append(f"{where}: nested over {DEPTH_LIMIT} levels deep, past what the loader reads")
        return
    if isinstance(kind, Record):
        if not isinstance(value, dict):
            out.append(f"{where}: {_kind(value)}; expected an object")
            return
        for name, inner in (kind.needed | kind.optional).items():
            unset = value.get(name) is None and name not in {*kind.needed, *kind.defaulted}
            if name not in value or unset:
                if name in kind.needed:
                    out.append(f"{where}.{name}: missing; expected {_expected(inner)}")
                continue
            _shape(inner, value[name], f"{where}.{name}", out, depth + 1)
        return
    if isinstance(kind, tuple):
        if not isinstance(value, list if kind[0] == "list" else dict):
            out.append(f"{where}: {_kind(value)}; expected {_expected(kind)}")
            return
        items = enumerate(value) if isinstance(value, list) else value.items()
        for key, item in items:
            if isinstance(key, str) and not encodes(key):
                out.append(f"{where}: a key that is no Unicode text (a lone surrogate)")
                continue
            place = f"{where}[{key}]" if isinstance(value, list) else f"{where}.{_key(key)}"
            _shape(kind[1], item, place, out, depth + 1)
        return
    if kind == ANY:
        if problem := _free_value_problem(value, depth):
            out.append(f"{where}: {problem}")
    elif not _fits(kind, value):
        out.append(f"{where}: {_kind(value)}; expected {_expected(kind)}")


def _kind(value: Any) -> str:
    """`value_kind`, and -0 said as the loader reads it (a decimal, where a whole is read)."""
    if isinstance(value, float) and value == 0 and math.copysign(1, value) < 0:
        return "-0, a decimal number to the loader"
    if isinstance(value, int | float) and not isinstance(value, bool) and not _finite(value):
        return "a number out of a double's range"
    if isinstance(value, str) and not encodes(value):
        return "a string that is no Unicode text (a lone surrogate)"
    return value_kind(value)


def _free_value_problem(value: Any, depth: int) -> str | None:
    """What the loader refuses in a value it reads as free JSON: nesting past its limit, a
    number out of a double's range, a string that is no Unicode text (None: nothing)."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            if level > DEPTH_LIMIT:
                return f"nested over {DEPTH_LIMIT} levels deep, past what the loader reads"
            inner = item.values() if isinstance(item, dict) else item
            stack.extend((v, level + 1) for v in inner)
            keys = item.keys() if isinstance(item, dict) else ()
            if not all(encodes(k) for k in keys):
                return "a key that is no Unicode text (a lone surrogate)"
        elif isinstance(item, str) and not encodes(item):
            return "a string that is no Unicode text (a lone surrogate)"
        elif isinstance(item, int | float) and not isinstance(item, bool) and not _finite(item):
            return "a number out of a double's range"
    return None


def _key(key: str) -> str:
    """A map's key as a place names it: a user's text, so escaped and cut short."""
    shown = escaped(str(key))
    return shown if len(shown) <= 40 else shown[:40] + "…"


def _fits_all(kind: Any, value: Any, depth: int = 1) -> bool:
    found: list[str] = []
    _shape(kind, value, "", found, depth)
    return not found


def loader_problems(manifest: dict[str, Any]) -> list[str]:
    """Why HiveLLM's loader would refuse `manifest` (a package's manifest.json), one line
    per field by its JSON path; empty when it reads it."""
    out: list[str] = []
    _shape(MANIFEST, manifest, "manifest", out)
    out = [line.removeprefix("manifest.") for line in out]
    if out:
        return out
    if not manifest["name"] or not manifest["version"]:
        out.append(f"{'name' if not manifest['name'] else 'version'}: empty")
    v2 = manifest.get("schema_version", "1.0") == "2.0"
    if v2 and not manifest.get("base_models"):
        out.append("base_models: missing or empty; schema 2.0 names its base models there")
    elif not v2 and (manifest.get("base_model") is None or not manifest.get("adapters")):
        out.append("base_model, adapters: schema 1.0 needs both")
    if manifest.get("base_model") is not None and manifest.get("base_models") is not None:
        out.append("base_model, base_models: give one of them")
    for i, base in enumerate(manifest.get("base_models") or [] if v2 else []):
        if not base["name"]:
            out.append(f"base_models[{i}].name: empty")
        if not base["adapters"]:
            out.append(f"base_models[{i}].adapters: empty; expected the adapter it ships")
    dataset = manifest["training"]["dataset"]
    if all(dataset.get(k) is None for k in ("path", "generation", "tasks")):  # its validate's
        out.append("training.dataset: expected a path, generation or tasks")
    config = manifest["training"]["config"]
    for key in ("epochs", "learning_rate"):  # read as f32: below ~7e-46 is 0 there
        if ctypes.c_float(config[key]).value <= 0:
            tiny = " (it is 0 as the 32-bit float the loader reads)" if config[key] > 0 else ""
            out.append(f"training.config.{key}: expected a number above 0{tiny}")
    if config.get("rank") == 0 or (config.get("rank") is None and config["adapter_type"] != "ia3"):
        out.append("training.config.rank: expected a whole number above 0 (all but ia3 have one)")
    if not config["target_modules"]:
        out.append("training.config.target_modules: empty; expected the modules adapted")
    return out


def _whole(kind: Any, value: Any) -> Any:
    """`value` with every whole number the loader reads written as one (32.0 as 32); objects
    and lists are changed in place."""
    if isinstance(kind, Record) and isinstance(value, dict):
        fields = kind.needed | kind.optional
        for key in [k for k in value if k in fields]:
            value[key] = _whole(fields[key], value[key])
    elif isinstance(kind, tuple) and kind[0] == "list" and isinstance(value, list):
        value[:] = [_whole(kind[1], v) for v in value]
    elif kind in (WHOLE, BIG) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


DESCRIBED = ("method", "adapter_type", "target_modules")  # training.config's, as the manifest
# names them; the other fields `_trained` gives are the run's choices


def _trained(resolved: dict[str, Any], targets: Any) -> dict[str, Any]:
    """The training.config fields the loader needs, as the run trained them."""
    kind = resolved.get("adapter_type") or "lora"
    values = {
        "method": "sft",
        "adapter_type": kind,
        "target_modules": targets,
        "epochs": _epochs(resolved),
        "learning_rate": resolved.get("learning_rate"),
        "batch_size": resolved.get("batch_size"),
        "gradient_accumulation_steps": resolved.get("gradient_accumulation_steps"),
        # a ratio ran: 0 steps beside it, as HiveLLM's own manifests write it
        "warmup_steps": 0 if resolved.get("warmup_ratio") else resolved.get("warmup_steps"),
        "warmup_ratio": resolved.get("warmup_ratio") or None,  # HiveLLM's trainer reads it
        "lr_scheduler": resolved.get("lr_scheduler"),
    }
    if kind != "ia3":
        values |= {"rank": resolved.get("rank"), "alpha": resolved.get("alpha")}
    return _whole(TRAINING_CONFIG, values)


def _epochs(resolved: dict[str, Any]) -> Any:
    """The epochs the run trained: the manifest's, or for a `--max-steps` run its steps times
    the rows of a step over the training rows (it wrote the manifest's 1.0 for 20 steps of an
    epoch's 27)."""
    try:
        runtime = resolved["runtime"]
        steps, rows = runtime["max_steps"], runtime["data"]["stats"]["train"]["rows"]
        sizes = (resolved["batch_size"], resolved["gradient_accumulation_steps"])
        world = runtime.get("world_size") or 1
    except (KeyError, TypeError, AttributeError):
        return resolved.get("epochs")
    if not all(isinstance(n, int) and n > 0 for n in (steps, rows, *sizes, world)):
        return resolved.get("epochs")
    return round(steps * sizes[0] * sizes[1] * world / rows, 2)


def for_hive_loader(
    manifest: dict[str, Any], entries: list[Any], resolved: dict[str, Any], adapter: dict
) -> list[str]:
    """Complete the package's manifest for HiveLLM's loader (in place) from what the run
    trained: the adapter entry's and training.config's target modules as the adapter's list,
    the training.config fields it needs and the manifest left out or wrote otherwise, whole
    numbers as such; the entry's `path` and an `integrity` section (of other files) dropped.
    Notes for each (what only the expert's author can give, `refuse_unloadable` names)."""
    notes = []
    targets = described(adapter).get("target_modules")
    entry = entries[0] if entries and isinstance(entries[0], dict) else {}
    if isinstance(entry.get("target_modules"), str) and isinstance(targets, list):
        entry["target_modules"] = targets
        notes.append(
            f"target_modules: all-linear written as the {len(targets)} module "
            "names the adapter holds (HiveLLM's loader reads a list)"
        )
    if entry.pop("path", None) is not None:
        notes.append(
            "adapter path: the adapter ships at the package's root, where HiveLLM's loader "
            "looks (the entry's path is left out)"
        )
    if not manifest.get("version"):  # the package's name says 0.0.0 already
        manifest["version"] = "0.0.0"
        notes.append("version: the manifest gives none; the package says 0.0.0")
    if manifest.pop("integrity", None) is not None:
        notes.append("integrity: the manifest's section describes other files; left out")
    training = manifest.get("training")
    config = training.setdefault("config", {}) if isinstance(training, dict) else None
    if isinstance(config, dict):
        filled = []
        for key, value in _trained(resolved, targets).items():
            given = config.get(key)
            # what the manifest names where the loader reads it (method, adapter_type,
            # target_modules); else the run's own choice (batch_size auto, a default warmup,
            # constant with a warmup)
            if key in DESCRIBED:
                kept = given is not None and _fits_all(TRAINING_CONFIG.needed[key], given)
            else:
                kept = given == value and not isinstance(given, bool)
            if value is not None and not kept:
                config[key] = value
                filled.append(key)
        if filled:
            them = "them" if len(filled) > 1 else "it"
            notes.append(
                f"training.config: {', '.join(filled)} written as the run trained {them} (the "
                f"manifest left {them} out, or the run chose otherwise)"
            )
    _whole(MANIFEST, manifest)
    return notes


def refuse_unloadable(manifest: dict[str, Any]) -> None:
    """UserError naming each field of a package's manifest HiveLLM's loader would refuse,
    and where to give it."""
    if problems := loader_problems(manifest):
        raise UserError(
            [
                "the package's manifest.json would not load in HiveLLM's loader:",
                *(f"  {line}" for line in problems[:12]),
                *([f"  and {len(problems) - 12:,} more"] if len(problems) > 12 else []),
                "give these in the manifest file (package takes what describes the expert, "
                "description, capabilities, constraints ..., from it as edited since the run; "
                "other fields, and a run of an earlier expert-cli's, from the run's "
                "manifest.source.json), then run package again",
            ]
        )
