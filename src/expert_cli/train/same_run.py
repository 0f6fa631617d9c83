"""What a resumed run must share with the run it continues: the resolved fields compared,
and the changes named (`train --resume` refuses a run trained with another configuration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from expert_cli.config.loading import parse_override
from expert_cli.config.optimizer import ADAM_DEFAULTS
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.errors import UserError
from expert_cli.train.data_record import records_local_files

# resolved fields a resumed run must share with the run it continues
SAME_RUN_FIELDS = (
    "base_model",
    "init",
    "quantization",
    "adapter_type",
    "rank",
    "alpha",
    "dropout",
    "target_modules",
    "use_dora",
    "use_rslora",
    "init_lora_weights",  # the residual base a checkpoint's adapter applies to
    "feedforward_modules",
    "train_sources",
    "validation_sources",
    "field_mapping",
    "max_seq_length",
    "packing",
    "learning_rate",
    "lr_scheduler",
    "lr_scheduler_kwargs",
    "rows_per_step",
    "seed",
    "epochs",
    # the schedule and the optimizer: a resume that changed them went on at another rate
    # (warmup) or failed in the optimizer's state (sgd after adamw: KeyError 'momentum')
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "optim",
    "adam_beta1",  # restored with the optimizer's state: another value would not apply
    "adam_beta2",
    "adam_epsilon",
    "neftune_noise_alpha",  # the embeddings' noise: another training from the resumed step
    "label_smoothing_factor",  # the targets: another loss from the resumed step
    "loraplus_lr_ratio",  # B's learning rate (and the optimizer's parameter groups)
    "init_adapter",  # the weights the run started from
    # the best so far, restored from the checkpoint, is of this metric: another's is no match
    "metric_for_best_model",
)
# fields a run records since a later version, and what a run recorded before them had
ABSENT_MEANS: dict[str, Any] = {
    "use_rslora": False,
    "init_lora_weights": "default",
    "neftune_noise_alpha": None,
    "label_smoothing_factor": 0.0,
    "loraplus_lr_ratio": None,
    "init_adapter": None,
    **ADAM_DEFAULTS,  # the Trainer's, which every run before them trained with
}


def changed_fields(
    previous: dict[str, Any], resolved: ResolvedConfig, by_steps: bool = False
) -> list[str]:
    """`field old -> new` for each field a resumed run must keep but does not (numbers and
    true/false; a text or list field is named alone, its values are not quoted). The epochs
    of a run whose length is a number of steps (`by_steps`) are not its length: not compared."""
    now = resolved.model_dump(mode="json")
    then = {**ABSENT_MEANS, **previous}
    # a local data file's place where the run recorded its content: a rename alone is none
    by_content = records_local_files(previous.get("runtime"))
    return [
        _change(key, then.get(key), now.get(key))
        for key in SAME_RUN_FIELDS
        if key in then
        and not (by_steps and key == "epochs")
        and _compared(key, then.get(key), _folder(then), by_content)
        != _compared(key, now.get(key), _folder(now), by_content)
    ]


def _folder(resolved: dict[str, Any]) -> Path | None:
    """The folder of the manifest a run was resolved from (None where it is not recorded)."""
    path = resolved.get("manifest_path")
    return Path(path).parent if isinstance(path, str) and Path(path).is_absolute() else None


def _compared(key: str, value: Any, folder: Path | None, by_content: bool) -> Any:
    """A resolved value as a resume compares it: a data source without the manifest field
    that names it (runs before it was recorded have none; where it is named is no change);
    an optimizer without its `_fused` (the same state, chosen for a GPU or a CPU); a local
    path in the manifest's `folder` relative to it (an expert folder moved, or mounted
    elsewhere, with its data and base inside). A local data source's place is left out
    where the run recorded its files' contents (`by_content`): data_record compares them,
    source by source, and a file renamed with the same content is the same data."""
    if key == "optim" and isinstance(value, str):
        return value.removesuffix("_fused")
    if key == "metric_for_best_model" and value in ("loss", None):  # the Trainer's eval_loss
        return "eval_loss"
    if key == "base_model" and isinstance(value, str):
        return _inside(value, folder)
    if isinstance(value, list):
        return [_source(s, folder, by_content) if isinstance(s, dict) else s for s in value]
    return value


def _source(source: dict[str, Any], folder: Path | None, by_content: bool) -> dict[str, Any]:
    """A recorded data source as `_compared` says (no `field`; a local one's place relative
    to the manifest's folder, or left out where its content is compared apart)."""
    compared = {k: v for k, v in source.items() if k != "field"}
    if source.get("kind") == "local" and "location" in compared:
        if by_content:
            del compared["location"]
        else:
            compared["location"] = _inside(compared["location"], folder)
    return compared


def _inside(path: Any, folder: Path | None) -> Any:
    """`path` relative to `folder` where it lies in it (as a string), else as it is."""
    if folder is None or not isinstance(path, str) or not Path(path).is_absolute():
        return path
    place = Path(path)
    return f"./{place.relative_to(folder)}" if place.is_relative_to(folder) else path


def _change(key: str, old: Any, new: Any) -> str:
    if all(isinstance(v, (int, float, bool)) or v is None for v in (old, new)):
        return f"{key} {json.dumps(old)} -> {json.dumps(new)}"
    return key


def recorded_set_keys(previous: dict[str, Any]) -> list[str]:
    """The keys of the `--set` values a run began with (runtime.overrides of its
    manifest.resolved.json), as a resume's refusal names them (the values are the file's
    contents, not quoted); none where the record is missing or not of its form."""
    runtime = previous.get("runtime")
    recorded = runtime.get("overrides") if isinstance(runtime, dict) else None
    if not isinstance(recorded, list):
        return []
    keys = []
    for item in recorded:
        try:
            keys.append(".".join(parse_override(item)[0]) if isinstance(item, str) else "")
        except UserError:
            continue
    return [key for key in dict.fromkeys(keys) if key.isprintable() and 0 < len(key) <= 80]
