"""Which of a run's adapters to ship: each complete checkpoint and the final adapter, with the
evaluation loss measured at its step, and the one whose loss is lowest.

HiveLLM's way is to compare a run's checkpoints and name the best in the manifest
(`training.packaging_checkpoint`); `report` lists them with their losses, and
`package --checkpoint best` ships the lowest. An evaluation and a checkpoint of the same step
see the same weights: the Trainer evaluates at the end of a step, then saves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_cli.config.training_config import MAX_STEPS
from expert_cli.train.checkpoints import checkpoint_step, complete_checkpoints
from expert_cli.train.outputs import ADAPTER_WEIGHTS, finite_number, read_json_file

FINAL = "final"
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


def eval_losses(metrics: dict[str, Any]) -> dict[int, float]:
    """Evaluation loss by step from a run's metrics.json (the last record of a step wins: a
    resumed run evaluates a step again); records that are not plausible numbers are left out."""
    found: dict[int, float] = {}
    records = metrics.get("evals")
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict):
            continue
        step, loss = finite_number(record.get("step")), finite_number(record.get("eval_loss"))
        if step is not None and loss is not None and step == int(step) and 0 <= step <= MAX_STEP:
            found[int(step)] = loss
    return found


def kept_adapters(run_dir: Path) -> list[KeptAdapter]:
    """The adapters `run_dir` holds, oldest first, the final one last; each with the eval loss
    measured at its step (None where no evaluation ran then, or the step is not known)."""
    losses = eval_losses(read_json_file(run_dir / "metrics.json"))
    kept = [
        KeptAdapter(path.name, step, losses.get(step) if step is not None else None)
        for path in complete_checkpoints(run_dir / "checkpoints")
        if (step := checkpoint_step(path)) is not None
    ]
    if (run_dir / ADAPTER_WEIGHTS[0]).is_file():
        step = final_step(run_dir)
        kept.append(KeptAdapter(FINAL, step, losses.get(step) if step is not None else None))
    return kept


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
