"""`expert-cli pretokenize`: build or confirm the token cache of one manifest or many."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from expert_cli.config import load_manifest
from expert_cli.config.batching import steps_before_training
from expert_cli.config.environment import cpu_environment
from expert_cli.config.loading import read_manifest_json
from expert_cli.config.resolve import resolve
from expert_cli.data import BuildProgress, PreparedData, prepare_data, prune_earlier_caches
from expert_cli.data.hub import hub_refs, require_hub
from expert_cli.data.tokenizer import load_tokenizer
from expert_cli.errors import RunError, UserError

SKIP_PARTS = {".cache", ".git", "node_modules", "checkpoints"}


def find_manifests(manifests: list[Path], all_dir: Path | None) -> list[Path]:
    """The explicit manifests, then every manifest.json under `all_dir` (sorted, unique)."""
    found = [Path(m) for m in manifests]
    if all_dir is not None:
        if not all_dir.is_dir():
            raise UserError(f"--all {all_dir}: not a folder")
        under = sorted(
            p
            for p in all_dir.rglob("manifest.json")
            if not SKIP_PARTS.intersection(p.relative_to(all_dir).parts)
        )
        if not under:
            raise UserError(f"--all {all_dir}: no manifest.json found")
        found += under
    if not found:
        raise UserError("pretokenize: give --manifest M (one or more) or --all DIR")
    unique = {p.resolve(): None for p in found}
    return list(unique)


@dataclass
class Outcome:
    """What became of one manifest's cache: the prepared data, or the problems that stopped it
    (`failure`: "bad input", exit 2, or "failed", a run-time condition such as no network)."""

    manifest: Path
    data: PreparedData | None
    problems: list[str]
    expert: str = ""
    failure: str | None = None
    steps: str = ""  # the optimizer steps a run of the cache takes, said before it starts


def pretokenize_one(
    manifest: Path,
    num_proc: int | None,
    force: bool,
    progress: BuildProgress | None = None,
    prune: bool = False,
) -> tuple[PreparedData, str]:
    """Build or confirm the cache of one manifest (hub references checked first); with the
    optimizer steps a run of it takes (config/batching.py's steps_before_training)."""
    loaded = load_manifest(manifest)
    resolved = resolve(loaded, cpu_environment())
    require_hub(hub_refs(resolved), resolved.train_sources + resolved.validation_sources)
    tokenizer = load_tokenizer(resolved)
    data = prepare_data(resolved, tokenizer, num_proc=num_proc, force=force, progress=progress)
    if prune:
        prune_earlier_caches(data)
    on_cpu = resolved.model_dump(include={"batch_size", "gradient_accumulation_steps"})
    cfg = loaded.manifest.training.config
    return data, steps_before_training(cfg, data.stats["train"]["rows"], on_cpu)


def pretokenize_all(
    manifests: list[Path],
    num_proc: int | None,
    force: bool,
    progress: BuildProgress | None = None,
    on_done: Callable[[Outcome], None] | None = None,
    prune: bool = False,
) -> list[Outcome]:
    """Pretokenize every manifest in turn; a bad or failing one is reported and the others go
    on. Each outcome is labelled with its expert (its name, else its folder)."""
    outcomes = []
    for manifest in manifests:
        expert = _expert_name(manifest)
        try:
            data, steps = pretokenize_one(manifest, num_proc, force, progress, prune)
            outcome = Outcome(manifest, data, [], expert, steps=steps)
        except UserError as exc:
            outcome = Outcome(manifest, None, exc.lines, expert, "bad input")
        except RunError as exc:
            outcome = Outcome(manifest, None, str(exc).splitlines(), expert, "failed")
        outcomes.append(outcome)
        if on_done is not None:
            on_done(outcome)
    return outcomes


def _expert_name(manifest: Path) -> str:
    try:
        name = read_manifest_json(manifest).get("name")
    except UserError:
        name = None
    return name if isinstance(name, str) and name else manifest.parent.name
