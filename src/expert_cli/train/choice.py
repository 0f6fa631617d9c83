"""Which of a run's adapters to ship: each complete checkpoint and the final adapter, with the
evaluation loss measured at its step, and the one whose loss is lowest.

HiveLLM's way is to compare a run's checkpoints and name the best in the manifest
(`training.packaging_checkpoint`); `report` lists them with their losses, and
`package --checkpoint best` ships the lowest. An evaluation and a checkpoint of the same step
see the same weights: the Trainer evaluates at the end of a step, then saves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_cli.config.evaluated_tasks import metric_task
from expert_cli.config.loading import read_manifest_json
from expert_cli.config.models import CHECKPOINT_NAME, PACKAGING_CHOICE, PACKAGING_CHOICES
from expert_cli.config.training_config import MAX_STEPS
from expert_cli.errors import UserError
from expert_cli.jsontext import finite_number
from expert_cli.paths import shown_path
from expert_cli.train.checkpoints import checkpoint_step, complete_checkpoints
from expert_cli.train.outputs import (
    ADAPTER_WEIGHTS,
    SOURCE_MANIFEST,
    read_json_file,
)
from expert_cli.train.run_source import run_manifest, same_expert
from expert_cli.weights import DAMAGED, safetensors_problem

FINAL = "final"
BEST = "best"  # --checkpoint best: the kept adapter of lowest eval loss
BY_BEST = ("--checkpoint best", "training.packaging_checkpoint best")  # who asked for it
# the step a run's final adapter holds, recorded in manifest.resolved.json's runtime when it is
# saved (with load_best_model_at_end, the best checkpoint's step, not the last one)
FINAL_STEP = "final_step"
MAX_STEP = MAX_STEPS


@dataclass(frozen=True)
class KeptAdapter:
    """An adapter a run folder holds: `checkpoint-N`, or `final` (the run folder's own)."""

    name: str
    step: int | None
    eval_loss: float | None


def chosen_by(run_dir: Path) -> str | None:
    """The task whose loss a run chooses its best adapter by (`metric_for_best_model` of
    `eval_<task>_loss`); None: the split's eval_loss."""
    return metric_task(
        read_json_file(run_dir / "manifest.resolved.json").get("metric_for_best_model")
    )


def scored(record: Any, task: str | None) -> Any:
    """An evaluation's record with the loss and token accuracy the run chooses by: its task's
    (None where the record has none), else as it is."""
    if task is None or not isinstance(record, dict) or not isinstance(record.get("tasks"), dict):
        return record  # a split of that task alone gives no tasks: its eval_loss is the task's
    figures = record["tasks"].get(task)
    figures = figures if isinstance(figures, dict) else {}
    return {
        **record,
        "eval_loss": figures.get("eval_loss"),
        "token_accuracy": figures.get("token_accuracy"),
    }


def eval_losses(metrics: dict[str, Any], task: str | None = None) -> dict[int, float]:
    """Evaluation loss by step from a run's metrics.json (the last record of a step wins: a
    resumed run evaluates a step again), `task`'s where the run chooses by it; records that
    are not plausible numbers are left out."""
    found: dict[int, float] = {}
    records = metrics.get("evals")
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict):
            continue
        record = scored(record, task)
        step, loss = finite_number(record.get("step")), finite_number(record.get("eval_loss"))
        if step is not None and loss is not None and step == int(step) and 0 <= step <= MAX_STEP:
            found[int(step)] = loss
    return found


def kept_adapters(run_dir: Path) -> list[KeptAdapter]:
    """The adapters `run_dir` holds, oldest first, the final one last; each with the eval loss
    measured at its step (None where no evaluation ran then, or the step is not known)."""
    losses = eval_losses(read_json_file(run_dir / "metrics.json"), chosen_by(run_dir))
    kept = [
        KeptAdapter(path.name, step, losses.get(step) if step is not None else None)
        for path in complete_checkpoints(run_dir / "checkpoints")
        if (step := checkpoint_step(path)) is not None
    ]
    if final_adapter_whole(run_dir):  # a damaged one is not offered (package refuses it)
        step = final_step(run_dir)
        kept.append(KeptAdapter(FINAL, step, losses.get(step) if step is not None else None))
    return kept


def final_adapter_whole(run_dir: Path) -> bool:
    """Whether the run's final adapter is there and not damaged (final_adapter_problem)."""
    return final_adapter_problem(run_dir) is None


def final_adapter_problem(run_dir: Path) -> str | None:
    """What is wrong with the run's final adapter, in words (its weights not there or damaged:
    their header does not match their size; its adapter_config.json missing or not peft's);
    None where it is whole. Files this process may not read (another user's run) are not
    judged damaged."""
    path = run_dir / ADAPTER_WEIGHTS[0]
    if not path.is_file():
        return f"{path.name} is not there"
    problem = safetensors_problem(path)
    if problem is not None and DAMAGED in problem:
        return f"{path.name} {DAMAGED}"
    config_path = run_dir / "adapter_config.json"
    if config_path.is_file() and not os.access(config_path, os.R_OK):
        return None
    config = read_json_file(config_path)  # not a FIFO's, nor nested past recursion
    if not isinstance(config.get("peft_type"), str):
        return "adapter_config.json is missing or not an adapter's configuration"
    return None


def final_adapter_step(load_best_model_at_end: bool, state: Any) -> int:
    """The step of the weights a finished Trainer holds: with load_best_model_at_end, that of
    the checkpoint it loaded (`best_model_checkpoint`: the best evaluation that was saved;
    `best_global_step` may be an evaluation between checkpoints), else the last step."""
    best = getattr(state, "best_model_checkpoint", None) if load_best_model_at_end else None
    step = checkpoint_step(Path(best)) if best else None
    return step if step is not None else int(state.global_step)


def final_step(run_dir: Path) -> int | None:
    """The step the final adapter holds: as the run recorded it, else (a run of an earlier
    version) the last step of a completed run that did not load its best checkpoint at the
    end; None when that cannot be told."""
    resolved = read_json_file(run_dir / "manifest.resolved.json")
    runtime = resolved.get("runtime") if isinstance(resolved.get("runtime"), dict) else {}
    step = finite_number(runtime.get(FINAL_STEP))
    if step is None:
        metrics = read_json_file(run_dir / "metrics.json")
        summary = metrics.get("summary") if isinstance(metrics.get("summary"), dict) else {}
        if summary.get("status") != "completed" or resolved.get("load_best_model_at_end"):
            return None
        step = finite_number(summary.get("steps"))
    return int(step) if step is not None and step == int(step) and 0 <= step <= MAX_STEP else None


def lowest(adapters: list[KeptAdapter]) -> KeptAdapter | None:
    """The adapter of lowest eval loss; on a tie the final one, then the later step."""
    scored = [a for a in adapters if a.eval_loss is not None]
    if not scored:
        return None
    return min(scored, key=lambda a: (a.eval_loss, a.name != FINAL, -(a.step or 0)))


def chosen_checkpoint(
    run_dir: Path, checkpoint: str | None, manifest_path: Path, source: dict[str, Any]
) -> tuple[str, str]:
    """Which adapter to ship, and who chose it: `--checkpoint` (`best`: the kept adapter of
    lowest eval loss), else the manifest file as it is now (HiveLLM's way: compare the
    checkpoints, then name the best in the manifest; no `training.packaging_checkpoint` there
    is final), else, the file gone, the run's copy."""
    if checkpoint == BEST:
        return _best(run_dir)
    if checkpoint is not None:
        if not CHECKPOINT_NAME.fullmatch(checkpoint):
            raise UserError(
                "--checkpoint: expected checkpoint-N (e.g. checkpoint-500), final, or best "
                "(the lowest eval loss)"
            )
        return checkpoint, "--checkpoint"
    named, now = _packaging_checkpoint(manifest_path) if manifest_path.is_file() else (None, None)
    where = shown_path(manifest_path)
    if now is None or not same_expert(source, now):  # gone, or another expert's now
        then = (source.get("training") or {}).get("packaging_checkpoint")
        named = then if isinstance(then, str) and PACKAGING_CHOICE.fullmatch(then) else None
        where = f"the run's {SOURCE_MANIFEST}"
    if named == BEST:
        return _best(run_dir, f"{BY_BEST[1]} in {where}")
    return (named, f"training.packaging_checkpoint in {where}") if named else ("final", "")


def chosen_by_best(chosen_by: str) -> bool:
    """Whether an adapter was chosen as the lowest eval loss (`--checkpoint best`, or the
    manifest's `packaging_checkpoint: best`), by `chosen_checkpoint`'s words."""
    return chosen_by.startswith(BY_BEST)


def default_choice(run_dir: Path) -> tuple[str, str]:
    """What `package` ships without `--checkpoint`, and who chose it ("" for final by default);
    UserError when that cannot be told (the manifest file unreadable, no copy of it)."""
    resolved = read_json_file(run_dir / "manifest.resolved.json")
    source, manifest_path = run_manifest(run_dir, resolved)
    return chosen_checkpoint(run_dir, None, manifest_path, source)


def _best(run_dir: Path, by: str = BY_BEST[0]) -> tuple[str, str]:
    """The kept adapter of lowest eval loss, and `by` (who asked for it) with its loss."""
    adapters = kept_adapters(run_dir)
    best = lowest(adapters)
    if best is None:
        held = ", ".join(a.name for a in adapters[-8:]) or "none"
        raise UserError(
            f"{by}: the run evaluated at no step it kept an adapter of (it keeps: "
            f"{held}); name one: --checkpoint NAME"
        )
    task = f" of task {task}" if (task := chosen_by(run_dir)) else ""  # metric_for_best_model
    return best.name, f"{by}: eval loss{task} {best.eval_loss:.4g} at step {best.step}"


def lower_loss_note(run_dir: Path, name: str, ship_with: str = "--checkpoint best") -> str | None:
    """A note when the run keeps an adapter of lower eval loss than `name`, the one shipped,
    saying that `ship_with` ships it."""
    adapters = kept_adapters(run_dir)
    best = lowest(adapters)
    shipped = next((a for a in adapters if a.name == name), None)
    if best is None or best.name == name or shipped is None:
        return None
    if shipped.eval_loss is None:
        return (
            f"{name} was not evaluated at its step; {best.name} has eval loss "
            f"{best.eval_loss:.4g} (step {best.step}): {ship_with} ships it"
        )
    if best.eval_loss is not None and best.eval_loss < shipped.eval_loss:
        low, high = apart(best.eval_loss, shipped.eval_loss)
        if low == high:  # equal to 8 significant digits: no lower loss worth a note
            return None
        return (
            f"{best.name} has a lower eval loss ({low} at step {best.step}) "
            f"than {name} ({high}): {ship_with} ships it"
        )
    return None


def apart(low: float, high: float) -> tuple[str, str]:
    """Two different losses with as many significant digits as it takes to show them apart
    (4, up to 8): "8.074 ... than 8.074" read as equal."""
    digits = 4
    while digits < 8 and f"{low:.{digits}g}" == f"{high:.{digits}g}":
        digits += 1
    return f"{low:.{digits}g}", f"{high:.{digits}g}"


def _packaging_checkpoint(manifest_path: Path) -> tuple[str | None, dict[str, Any]]:
    """`training.packaging_checkpoint` of the manifest file (None when it names none), and
    the file; a file that cannot say is exit 2 (the choice it holds is not guessed)."""
    retry = "; fix it, or pass --checkpoint NAME"
    try:
        raw = read_manifest_json(manifest_path)
    except UserError as exc:
        raise UserError([*exc.lines[:-1], exc.lines[-1] + retry]) from None
    training = raw.get("training")
    if not isinstance(training, dict):
        raise UserError(
            f"{shown_path(manifest_path)}: training is not an object, so which checkpoint "
            f"to ship cannot be read{retry}"
        )
    value = training.get("packaging_checkpoint")
    if value is not None and not (isinstance(value, str) and PACKAGING_CHOICE.fullmatch(value)):
        raise UserError(
            f"{shown_path(manifest_path)}: training.packaging_checkpoint: expected "
            f"{PACKAGING_CHOICES}"
        )
    return value, raw
