"""What a training run leaves in its output folder, written so readers never see half a file.

OUTPUT/adapter_model.safetensors, adapter_config.json, tokenizer files, manifest.resolved.json,
metrics.json, checkpoints/checkpoint-N, runs/ (TensorBoard) and, for a random-init base model,
base_model/ (the weights the adapter was trained on, so it can be loaded and merged).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout
from peft import PeftConfig
from pydantic import ValidationError

from expert_cli.atomic import atomic_folder, usual_mode, write_json_atomic
from expert_cli.config.sources import SourceRef, data_folder_holding
from expert_cli.errors import RunError, UserError, value_kind
from expert_cli.paths import not_a_folder, path_is_dir, resolved_path, shown_path
from expert_cli.train.adapter_fit import Shapes, fit_problem, pairs_problem
from expert_cli.weights import (
    file_head,
    header_shapes,
    non_finite_line,
    non_finite_tensors,
    not_float_line,
    safetensors_problem,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from expert_cli.config.resolve import ResolvedConfig

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
SOURCE_MANIFEST = "manifest.source.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # what peft loads

COMPLETE = "_COMPLETE"  # the marker a checkpoint folder gets once written whole
RANDOM_BASE = "base_model"  # where a random-init base is saved, inside the run folder
ASIDE_PREFIX = ".overwritten-"  # + pid: a run `train --overwrite` set aside until it trains
PID = re.compile(r"[0-9]{1,10}")  # the pid ending a leftover's name (ASCII digits only)


def output_dir(manifest_path: Path, output: Path | None) -> Path:
    """`--output`, else `<manifest folder>/output`."""
    return resolved_path(output or manifest_path.parent / "output", "--output")


SOURCE_DIGEST = "source_digest"  # runtime: manifest.source.json's digest as the run wrote it


def source_digest(source: dict[str, Any]) -> str:
    """sha256 of a manifest's parsed JSON, keys sorted: the same for the same content."""
    text = json.dumps(source, sort_keys=True, ensure_ascii=False, allow_nan=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def write_resolved(
    output: Path,
    resolved: ResolvedConfig,
    runtime: dict[str, Any],
    source: dict[str, Any] | None = None,
) -> Path:
    """manifest.resolved.json: every resolved field, plus what the run decided at load time;
    with `source`, also manifest.source.json: the manifest as its file holds it (so the run
    folder alone can be tried and packaged after the expert's folder has moved)."""
    data = resolved.model_dump(mode="json")
    if source is not None:  # the copy as written: one edited by hand since is told apart
        runtime.setdefault(SOURCE_DIGEST, source_digest(source))
    data["runtime"] = runtime
    path = output / "manifest.resolved.json"
    write_json_atomic(path, data)
    if source is not None:
        write_json_atomic(output / SOURCE_MANIFEST, source)
    return path


def materialize_random_base(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dest: Path
) -> Path:
    """Save a random-init base model (safetensors + tokenizer), all or nothing."""
    with atomic_folder(dest, replace=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        usual_mode(tmp)
    return dest


def move_final_files(staging: Path, output: Path) -> list[Path]:
    """Move the files of `trainer.save_model(staging)` into `output`, one rename each."""
    moved = []
    for item in sorted(staging.iterdir()):
        if item.is_file():
            target = output / item.name
            os.replace(item, target)
            moved.append(target)
    shutil.rmtree(staging, ignore_errors=True)
    missing = [name for name in ADAPTER_FILES if not (output / name).is_file()]
    if missing:
        raise RunError(f"{output}: the adapter was not saved ({', '.join(missing)} missing)")
    _portable_base(output)
    return moved


def _portable_base(output: Path) -> None:
    """A base model saved inside the run folder (a random init) is recorded relative to it,
    so the folder can be moved and still loaded and merged."""
    path = output / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    if isinstance(base, str) and Path(base) == output / RANDOM_BASE:
        config["base_model_name_or_path"] = RANDOM_BASE
        write_json_atomic(path, config)


def read_json_file(path: Path) -> dict[str, Any]:
    """A JSON object file the run wrote, or {} when it is missing, not a file or not one."""
    try:
        if not path.is_file():
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def process_running(pid: int) -> bool:
    """Whether process `pid` runs (one of another user counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def aside_pid(path: Path) -> int | None:
    """The pid in the name of a folder `train --overwrite` set a run aside in, else None."""
    digits = path.name[len(ASIDE_PREFIX) :] if path.name.startswith(ASIDE_PREFIX) else ""
    return int(digits) if PID.fullmatch(digits) else None


def set_aside_line(folder: Path) -> str | None:
    """Where the run `folder` held went, when a `train --overwrite` set it aside and has not
    begun training (it puts the run back if it fails; one that was killed could not)."""
    asides = [
        p
        for p in (sorted(folder.glob(f"{ASIDE_PREFIX}*")) if folder.is_dir() else [])
        if aside_pid(p) is not None and p.is_dir() and not p.is_symlink()
    ]
    if not asides:
        return None
    aside = asides[-1]
    if process_running(aside_pid(aside) or 0):
        return (
            f"{shown_path(folder)}: a `train --overwrite` into it is preparing; the run it "
            f"held is in {aside.name} until training begins (then it is removed)"
        )
    return (
        f"{shown_path(folder)}: its run was set aside in {aside.name} by a `train "
        "--overwrite` that was stopped before training began; the next `expert-cli train` "
        "into this folder puts the run back (and, with neither --resume nor --overwrite, "
        "stops there: nothing is trained)"
    )


def unfinished(adapter: Path) -> str:
    """What a run folder without adapter_config.json lacks, in words: its final adapter (the
    run stopped before saving it), or that file alone (removed since: --resume saves the
    final adapter again from the last step's checkpoint)."""
    if (adapter / ADAPTER_WEIGHTS[0]).is_file():
        return "its final adapter's adapter_config.json is not there (removed since the run?)"
    return "the run stopped before writing its final adapter"


def _stopped_before_saving(adapter: Path) -> str | None:
    """Where `adapter` is a run that stopped before any adapter or checkpoint was saved (by
    its metrics.json), the line saying so: it read as a folder train never wrote."""
    summary = read_json_file(adapter / "metrics.json").get("summary")
    status = summary.get("status") if isinstance(summary, dict) else None
    if status not in ("failed", "interrupted", "diverged", "running"):  # else: not this case
        return None
    if status == "running" and any((adapter / "checkpoints").glob(f"checkpoint-*/{COMPLETE}")):
        return None  # killed after a checkpoint: the choice of adapter says so (ship_choice)
    ended = "ended without a word (killed?)" if status == "running" else f"ended {status}"
    return (
        f"--adapter {shown_path(adapter)}: its run {ended} before it saved an adapter "
        "or a checkpoint; there is nothing to load: train again (report shows how it went)"
    )


def adapter_base(adapter: Path, base_needed: bool = True) -> str:
    """The base model path or hub id recorded in the adapter's configuration; UserError for
    a local base that is gone when `base_needed` (generate and merge load it; package does
    not)."""
    config_path = adapter / "adapter_config.json"
    if not adapter.is_dir():
        raise UserError(
            f"--adapter {shown_path(adapter)}: {not_a_folder(adapter)}; expected the output "
            "folder of `expert-cli train`"
        )
    if not config_path.is_file():
        raise UserError(
            set_aside_line(adapter)
            or (writing_now(adapter) if held_by_another(adapter) else None)
            or _stopped_before_saving(adapter)
            or f"--adapter {adapter}: no adapter_config.json (expected the output folder of "
            "`expert-cli train`)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise UserError(f"{config_path}: not a readable JSON adapter configuration") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise UserError(f"{config_path}: base_model_name_or_path is not set")
    if not any((adapter / name).is_file() for name in ADAPTER_WEIGHTS):
        raise UserError(
            f"--adapter {adapter}: no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})"
            " beside adapter_config.json"
        )
    safetensors = adapter / ADAPTER_WEIGHTS[0]
    if safetensors.is_file() and (problem := safetensors_problem(safetensors)):
        raise UserError(f"--adapter {adapter}: {problem}; restore it from a copy, or train again")
    if safetensors.is_file() and (bad := non_finite_tensors(safetensors)):
        raise UserError(
            f"--adapter {adapter}: {ADAPTER_WEIGHTS[0]}: {non_finite_line(bad)}: the run that "
            "wrote it diverged; train again (docs/training.md, a loss that is not a number)"
        )
    head = file_head(safetensors) if safetensors.is_file() else b""
    shapes = header_shapes(head)
    if shapes and (gap := pairs_problem(config, shapes) or not_float_line(head)):
        raise UserError(f"--adapter {adapter}: {ADAPTER_WEIGHTS[0]} {gap}; restore it from a copy")
    if problem := adapter_config_problem(config, shapes):
        raise UserError(f"{config_path}: {problem}; restore the file the run wrote")
    local = adapter / base  # a random-init base saved inside the run folder: a relative path
    if not Path(base).is_absolute() and local.is_dir():
        return str(local)
    if base_needed and _names_a_folder(base) and not path_is_dir(base):
        raise UserError(
            f"{config_path}: the base model it was trained on, {shown_path(base)}, is not "
            "there any more; put it back, or set base_model_name_or_path to where it is now "
            "(a local folder or a hub id)"
        )
    return base


# what a tensor name of each peft type's weights holds (peft's own parameter names)
WEIGHT_MARKERS = {"LORA": "lora_A", "ADALORA": "lora_E", "IA3": "ia3_l", "LOKR": "lokr_"}
MAX_RANK, MAX_ALPHA = 1024, 1e6  # the manifest's bounds


def adapter_config_problem(config: dict[str, Any], shapes: Shapes | None) -> str | None:
    """What in an adapter_config.json cannot be the configuration of the adapter weights
    beside it (`shapes`: their tensors' shapes by name; not compared when none were read): an
    adapter type expert-cli does not train, a rank or alpha that is no number in the
    manifest's bounds, no target modules, or a type, DoRA setting, rank or target modules
    the weights were not trained with.
    A hand edit or a file from elsewhere: peft would apply it silently (NaN merged into the
    base), fail in a traceback (a rank given as text), or take memory without bound (a rank
    of 10^6)."""
    kind = config.get("peft_type")
    if kind not in WEIGHT_MARKERS:
        return f"peft_type: expected one of {', '.join(WEIGHT_MARKERS)} (got {value_kind(kind)})"
    if config.get("task_type") not in (None, "CAUSAL_LM"):
        return f"task_type: expected CAUSAL_LM (got {value_kind(config.get('task_type'))})"
    for key, top in (("r", MAX_RANK), ("lora_alpha", MAX_ALPHA), ("alpha", MAX_ALPHA)):
        if key not in config or (key == "r" and kind == "IA3"):
            continue
        value, whole = config[key], key == "r"
        kinds = int if whole else int | float
        if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value <= top:
            what = "a whole number" if whole else "a number"
            got = value_kind(value)
            return f"{key}: expected {what} above 0 and at most {top:,.0f} (got {got})"
    init, flag = config.get("init_lora_weights", True), _not_a_flag(config)
    if kind == "LORA" and not (isinstance(init, bool) or PEFT_START.fullmatch(str(init))):
        return f"init_lora_weights: not a start peft knows (got {value_kind(init)})"
    if kind == "LORA" and flag:  # peft reads "yes" as true: HiveLLM's runtime would not
        return f"{flag}: expected true or false (got {value_kind(config[flag])})"
    targets = config.get("target_modules")
    if not targets or not isinstance(targets, str | list):
        return (
            f"target_modules: expected the names of the adapted layers (got {value_kind(targets)})"
        )
    if shapes and not any(WEIGHT_MARKERS[kind] in n for n in shapes):
        return f"peft_type: {kind}, but the adapter weights beside it are of another kind"
    dora = any("lora_magnitude_vector" in n for n in shapes or {})
    if shapes and kind == "LORA" and bool(config.get("use_dora")) != dora:
        said = "on" if config.get("use_dora") else "off"
        held = "hold" if dora else "do not hold"
        return f"use_dora is {said}, but the weights beside it {held} DoRA's magnitudes"
    return fit_problem(config, shapes) or _refused_by_peft(config)


def _not_a_flag(config: dict[str, Any]) -> str | None:
    """The first of LoRA's flags that is not true, false or unset (1 == True: by identity)."""
    flags = ("use_rslora", "use_dora")
    return next((k for k in flags if all(config.get(k) is not v for v in FLAGS)), None)


FLAGS = (None, True, False)
# peft's named LoRA starts (0.21), besides true and false
PEFT_START = re.compile(r"gaussian|eva|olora|pissa|pissa_niter_[0-9]{1,4}|corda|loftq|orthogonal")


def _refused_by_peft(config: dict[str, Any]) -> str | None:
    """Whether peft's own configuration class refuses the file as loading it would (IA3's
    feed-forward modules not among its targets, ...): named by the error's kind, not its
    message, which may quote the file's values."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # keys of another peft version are left out
            PeftConfig.from_peft_type(**{k: v for k, v in config.items() if isinstance(k, str)})
    except Exception as exc:  # noqa: BLE001 - peft's verdict on the file
        kind = config.get("peft_type")
        return f"peft refuses it as a configuration of type {kind} ({type(exc).__name__})"
    return None


def _names_a_folder(base: str) -> bool:
    """A recorded base that can only be a local folder (a hub id is `name` or `owner/name`):
    an absolute path, one starting with . or ~, one of three parts or more, or the run
    folder's own random-init base."""
    return (
        Path(base).is_absolute()
        or base.startswith((".", "~"))
        or base.count("/") > 1
        or base == RANDOM_BASE
    )


def data_folder_problem(output: Path, run_dir: Path, what: str) -> str | None:
    """Why `--output` cannot be `output`: it lies in a local data folder of the run (its
    manifest.resolved.json says which), where `what` would be read back as data by the next
    build, or at least be written among the user's training data."""
    data = read_json_file(run_dir / "manifest.resolved.json")
    sources = []
    given = [data.get("train_sources"), data.get("validation_sources")]  # hand-edited: lists?
    for item in [x for part in given if isinstance(part, list) for x in part]:
        try:
            sources.append(SourceRef.model_validate(item))
        except ValidationError:
            continue
    if held := data_folder_holding(output, sources):
        return (
            f"--output {shown_path(output)}: is inside the run's data folder {shown_path(held)}; "
            f"{what} would be written among the training data: choose a place outside it"
        )
    return None


def run_of(adapter: Path) -> Path:
    """The run folder `adapter` belongs to: itself, or for one of its checkpoints
    (RUN/checkpoints/checkpoint-N, to compare them before choosing one to ship) the run's."""
    adapter = adapter.absolute()  # `.` inside a checkpoint has a parent too
    if (adapter / "manifest.resolved.json").is_file() or adapter.parent.name != "checkpoints":
        return adapter
    run = adapter.parent.parent
    return run if (run / "manifest.resolved.json").is_file() else adapter


LOCK_NAME = ".train.lock"  # held by the process training in the folder


def writing_now(adapter: Path) -> str:
    """What generate, merge and package say of a run folder a live `train` holds."""
    return (
        f"--adapter {shown_path(adapter)}: an `expert-cli train` is writing this run now; its "
        "final adapter comes at its end"
    )


def held_by_another(output: Path) -> bool:
    """Whether a live `train` holds `output` (its lock file exists and cannot be taken). Asked
    by the main process before any rank decides: its own hold, taken after deciding, would
    look like another's."""
    path = output / LOCK_NAME
    if not path.is_file():
        return False
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    except OSError:  # not ours to judge here: `claim` names what is wrong with the folder
        return False
    lock.release()
    return False
