"""The manifest a run was trained from, as the commands after training read it: the run's copy
of the file as written (manifest.source.json), where the file itself is (manifest.resolved.json
records it: its folder holds README, LICENSE and grammar), and the `--set` values train was
given (recorded as runtime.overrides), which `package` and `generate` apply as train did, but
those naming places on the training machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expert_cli.config.loading import apply_overrides, parse_override, read_manifest_json
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.outputs import SOURCE_MANIFEST


def source_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest as the run found it (its manifest.source.json), or {} for a run of an
    earlier version that kept no copy; a copy that cannot be read is exit 2 naming the file
    and what is wrong (it is not taken for a missing one)."""
    path = run_dir / SOURCE_MANIFEST
    if not path.exists() and not path.is_symlink():
        return {}
    return read_manifest_json(path)


def manifest_path_of(run_dir: Path, resolved: dict[str, Any]) -> Path:
    """The manifest file the run was trained from, as manifest.resolved.json records it; a
    folder without that record is not a run `train` wrote (its expert folder, where README,
    LICENSE and grammar are, would be a guess)."""
    recorded = resolved.get("manifest_path")
    if not isinstance(recorded, str) or not recorded.strip():
        raise UserError(
            f"--adapter {shown_path(run_dir)}: its manifest.resolved.json is missing, unreadable "
            "or names no manifest_path; give a folder `expert-cli train` wrote"
        )
    return Path(recorded)


def run_manifest(run_dir: Path, resolved: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """The manifest as the run found it, and the manifest file it was trained from (its
    folder holds README, LICENSE, ...)."""
    manifest_path = manifest_path_of(run_dir, resolved)
    source = source_manifest(run_dir)
    if not source and manifest_path.is_file():
        source = read_manifest_json(manifest_path)
    if not source:
        raise UserError(
            f"--adapter {run_dir}: no {SOURCE_MANIFEST} and the manifest it was trained from "
            f"({manifest_path}) is gone; train again with this version of expert-cli"
        )
    return source, manifest_path


def _machine_bound(parts: list[str]) -> bool:
    """A `--set` key naming where something was on the training machine: the base model's
    path or hub id, the data, the token cache (the package keeps the manifest's own)."""
    if parts[:2] == ["training", "dataset"] or parts[-1] == "pretokenized_cache":
        return True
    return parts[0] in ("base_models", "base_model") and parts[-1] == "name"


def as_trained(
    source: dict[str, Any], resolved: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The manifest as written with the `--set` values train was given (recorded as
    runtime.overrides) applied, but those naming places on the training machine; and a note
    naming what was applied. A `--set base_models.0.prompt_template=...` changes how the
    adapter must be prompted: the package says so."""
    runtime = resolved.get("runtime")
    recorded = runtime.get("overrides") if isinstance(runtime, dict) else None
    if not isinstance(recorded, list) or not all(isinstance(i, str) for i in recorded):
        return source, []
    try:
        keyed = [(".".join(parse_override(item)[0]), item) for item in recorded]
        applied = [(key, item) for key, item in keyed if not _machine_bound(key.split("."))]
        changed = apply_overrides(source, [item for _, item in applied])
    except UserError as exc:  # the file was edited since train wrote it
        where = "manifest.resolved.json: runtime.overrides"
        raise UserError([f"{where}: {line}" for line in exc.lines]) from None
    if not applied:
        return source, []
    keys = ", ".join(key for key, _ in applied[:6])
    more = f" and {len(applied) - 6} more" if len(applied) > 6 else ""
    return changed, [f"the packaged manifest holds the --set values train was given: {keys}{more}"]
