"""The manifest a run was trained from, as the commands after training read it: the run's copy
of the file as written (manifest.source.json), where the file itself is (manifest.resolved.json
records it: its folder holds README, LICENSE and grammar), and the `--set` values train was
given (recorded as runtime.overrides), which `package` and `generate` apply as train did, but
those naming places on the training machine.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from expert_cli.config.loading import apply_overrides, parse_override, read_manifest_json
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.adapter_entry import first_base
from expert_cli.train.outputs import (
    SOURCE_DIGEST,
    SOURCE_MANIFEST,
    read_json_file,
    source_digest,
)


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
    if not isinstance(recorded, str) or not Path(recorded).is_absolute():  # train writes it so
        records = ("manifest.resolved.json", SOURCE_MANIFEST, "metrics.json", "checkpoints")
        bare = (run_dir / "adapter_config.json").is_file() and not any(
            (run_dir / name).exists() for name in records
        )
        raise UserError(
            f"--adapter {shown_path(run_dir)}: "
            + (
                "holds a peft adapter but no record of an expert-cli run (its "
                "manifest.resolved.json, the base and settings it was trained with); give a "
                "folder `expert-cli train` wrote"
                if bare
                else "its manifest.resolved.json is missing, unreadable or names no absolute "
                "manifest_path; give a folder `expert-cli train` wrote"
            )
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
            f"--adapter {shown_path(run_dir)}: no {SOURCE_MANIFEST} and the manifest it was "
            f"trained from ({shown_path(manifest_path)}) is gone; train again with this version "
            "of expert-cli"
        )
    return source, manifest_path


SHOWN_EDITS = 4  # edited fields a note names
# fields a manifest is given after training, for package to read (packaging.md)
AFTER_TRAINING = {"training.packaging_checkpoint"}
# fields that describe, route, evaluate and decode the expert, not what was trained: improved
# in the manifest file after training, package ships them and generate decodes with them as
# the file holds them then
LATER: tuple[tuple[str, ...], ...] = (
    *((name,) for name in (
        "version", "description", "author", "homepage", "repository", "license", "tags",
        "capabilities", "routing", "constraints", "perf", "runtime", "limitations",
        "quality_metrics", "evaluation", "integrity",
    )),
    ("training", "decoding"),
)  # fmt: skip


def edited_since(run_dir: Path, source: dict[str, Any], manifest_path: Path) -> list[str]:
    """A note when the manifest file was edited since the run copied it (a description
    improved after training): the commands after training read the run's copy, but for what
    describes the expert where `later_edits` takes it."""
    if not (run_dir / SOURCE_MANIFEST).is_file() or not manifest_path.is_file():
        return []
    try:
        now = read_manifest_json(manifest_path)
    except UserError as exc:  # not readable now: the run's copy is what counts, said
        return [unread_note(exc)]
    as_written = _copy_as_written(run_dir, source)
    takes = as_written is True and same_expert(source, now)
    later = [".".join(where) for where in LATER] if takes else []
    changed = [
        n
        for n in _changed(source, now, "")
        if n not in AFTER_TRAINING and not any(n == w or n.startswith(f"{w}.") for w in later)
    ]
    if not changed:
        return []
    names = ", ".join(changed[:SHOWN_EDITS])
    more = len(changed) - SHOWN_EDITS
    names += f" and {more} more" if more > 0 else ""
    but = (
        " but for how the expert is described and decoded (description, version, "
        "capabilities, training.decoding ..., taken as the file holds them)"
        if takes
        else ""
    )
    if as_written is False:  # the file may be as trained: the copy differs
        return [
            f"the run's {SOURCE_MANIFEST} was edited since the run wrote it, and now differs "
            f"from {shown_path(manifest_path)} ({names}): the package holds the run's copy "
            "as it is"
        ]
    return [
        f"{shown_path(manifest_path)}: edited since the run ({names}); the package holds the "
        f"manifest the adapter was trained from (the run's {SOURCE_MANIFEST}){but}: train "
        "again to ship the edits"
    ]


def unread_note(exc: UserError) -> str:
    """The note on a manifest file that cannot be read now (its problem, never its contents):
    its edits since the run are not taken."""
    return (
        f"{exc.lines[0]}: so its edits since the run (description, version, capabilities, "
        f"training.decoding ...) are not taken; the run's {SOURCE_MANIFEST} is used as written"
    )


def takes_later_edits(run_dir: Path, source: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether the manifest file's edits since the run are taken: the run's copy is as the
    run wrote it (its recorded digest; a copy edited by hand wins, as does a run of an
    earlier version, which recorded none), and the file still names the same expert on the
    same base (a folder reused for another expert would lend it its routing and version)."""
    return same_expert(source, now) and _copy_as_written(run_dir, source) is True


def same_expert(source: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether the manifest file still names the run's expert on the run's base."""
    same_base = first_base(now).get("name") == first_base(source).get("name")
    return now.get("name") == source.get("name") and same_base


def _copy_as_written(run_dir: Path, source: dict[str, Any]) -> bool | None:
    """Whether the run's copy of the manifest (`source`) is as the run wrote it, by the
    digest it recorded; None for a run of an earlier version, which recorded none."""
    runtime = read_json_file(run_dir / "manifest.resolved.json").get("runtime")
    recorded = runtime.get(SOURCE_DIGEST) if isinstance(runtime, dict) else None
    return None if recorded is None else recorded == source_digest(source)


def taken_note(taken: list[str], manifest_path: Path) -> str:
    """What a command took from the manifest file as edited since the run."""
    names = ", ".join(taken[:SHOWN_EDITS])
    names += f" and {len(taken) - SHOWN_EDITS} more" if len(taken) > SHOWN_EDITS else ""
    return (
        f"{names}: as {shown_path(manifest_path)} holds {'them' if len(taken) > 1 else 'it'} "
        "now (edited since the run; describing the expert, not what it trained)"
    )


def later_edits(
    run_dir: Path, manifest: dict[str, Any], source: dict[str, Any], manifest_path: Path
) -> tuple[dict[str, Any], list[str]]:
    """A copy of `manifest` with each field of LATER that the manifest file now holds
    otherwise than the run's copy (`source`) as the file holds it, and their dotted names;
    `manifest` as it is where the file is gone or cannot be read, or where its edits are not
    taken (`takes_later_edits`)."""
    try:
        now = read_manifest_json(manifest_path) if manifest_path.is_file() else None
    except UserError:  # not readable now: the run's copy is what counts
        now = None
    if now is None or not takes_later_edits(run_dir, source, now):
        return manifest, []
    manifest, taken = copy.deepcopy(manifest), []
    for where in LATER:
        given = _at(now, where)
        holder = _at(manifest, where[:-1])
        if given == _at(source, where) or not isinstance(holder, dict):
            continue
        if given is MISSING:
            holder.pop(where[-1], None)
        else:
            holder[where[-1]] = copy.deepcopy(given)
        taken.append(".".join(where))
    return manifest, taken


def _changed(then: Any, now: Any, at: str, depth: int = 2) -> list[str]:
    """The dotted names of the fields that differ, `depth` levels down at most."""
    if not (isinstance(then, dict) and isinstance(now, dict)) or depth == 0:
        return [at or "the whole file"] if then != now else []
    found = []
    for key in [*then, *(k for k in now if k not in then)]:
        name = f"{at}.{key}" if at else str(key)
        found += _changed(then.get(key, MISSING), now.get(key, MISSING), name, depth - 1)
    return found


Where = tuple[str | int, ...]
MISSING = object()
DATA_FILES = ("path", "validation_path", "test_path")
TASK_FILES = ("train", "valid", "test")


def _at(data: Any, where: Where) -> Any:
    for step in where:
        listed = isinstance(step, int) and isinstance(data, list) and step < len(data)
        if not listed and not (isinstance(step, str) and isinstance(data, dict) and step in data):
            return MISSING
        data = data[step]
    return data


def _machine_bound(manifest: dict[str, Any]) -> list[Where]:
    """Where a manifest names places on the training machine: each base model's name (a hub id
    or a local folder), the data files, the token cache, a DeepSpeed configuration file."""
    bases = _at(manifest, ("base_models",))
    found: list[Where] = [("base_model", "name")]
    found += [
        ("base_models", i, "name") for i in range(len(bases) if isinstance(bases, list) else 0)
    ]
    found += [("training", "dataset", key) for key in DATA_FILES]
    tasks = _at(manifest, ("training", "dataset", "tasks"))
    for task in tasks if isinstance(tasks, dict) else {}:
        found += [("training", "dataset", "tasks", task, key) for key in TASK_FILES]
    found += [
        ("training", "config", "pretokenized_cache"),
        ("training", "config", "init_adapter"),
        ("training", "distributed", "deepspeed"),
    ]
    return found


def _keep_as_written(changed: dict[str, Any], source: dict[str, Any]) -> list[str]:
    """Put back in `changed` each place on the training machine as `source` gives it (a
    `--set` of a whole block holding one included); the keys put back."""
    return [
        ".".join(str(step) for step in where)
        for where in _machine_bound(changed)
        if _put_back(changed, source, where)
    ]


def _put_back(changed: dict[str, Any], source: dict[str, Any], where: Where) -> bool:
    """Put the value at `where` in `changed` back as `source` gives it; whether it differed."""
    now, then = _at(changed, where), _at(source, where)
    holder, key = _at(changed, where[:-1]), str(where[-1])
    if now is MISSING or now == then or not isinstance(holder, dict):
        return False
    if then is MISSING:
        del holder[key]
    else:
        holder[key] = then
    return True


def as_trained(
    source: dict[str, Any], resolved: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The manifest as written with the `--set` values train was given (recorded as
    runtime.overrides) applied, but for the places on the training machine they name (kept
    as the manifest wrote them); and a note naming what was applied. A `--set
    base_models.0.prompt_template=...` changes how the adapter must be prompted."""
    runtime = resolved.get("runtime")
    recorded = runtime.get("overrides") if isinstance(runtime, dict) else None
    if not recorded:
        return source, []
    try:
        if not isinstance(recorded, list) or not all(isinstance(i, str) for i in recorded):
            raise UserError("runtime.overrides: expected a list of the --set values")
        keys = [".".join(parse_override(item)[0]) for item in recorded]
        changed = apply_overrides(source, recorded)
    except UserError:  # never the values: they are the file's contents
        raise UserError(
            f"manifest.resolved.json: runtime.overrides: the --set values train recorded no "
            f"longer apply to {SOURCE_MANIFEST} (a file edited since); train again"
        ) from None
    kept = set(_keep_as_written(changed, source))
    notes = [  # package reads it from the manifest file as it is then, or --checkpoint
        f"{key}: given to train with --set, which package does not read: it ships what the "
        "manifest file names, else final; --checkpoint NAME chooses"
        for key in dict.fromkeys(keys)
        if key in AFTER_TRAINING and _put_back(changed, source, tuple(key.split(".")))
    ]
    applied = [key for key in keys if key not in kept and key not in AFTER_TRAINING]
    if not applied:
        return changed, notes
    more = f" and {len(applied) - 6} more" if len(applied) > 6 else ""
    note = f"the packaged manifest holds the --set values train was given: {', '.join(applied[:6])}"
    return changed, [note + more, *notes]


def run_decoding(
    run_dir: Path, runtime: Any, manifest_path: Path
) -> tuple[dict[str, Any], str, list[str]]:
    """The training.decoding block `generate` decodes with: the run's copy with the --set
    values train was given, or the manifest file's where it was edited since the run (a note
    says so); and where it came from, for an error to name. A damaged copy is exit 2."""
    copied = source_manifest(run_dir)
    source, _ = as_trained(copied, {"runtime": runtime})
    edited, taken = later_edits(run_dir, source, copied, manifest_path) if copied else (source, [])
    where, notes = SOURCE_MANIFEST, []
    try:
        if copied and manifest_path.is_file():
            read_manifest_json(manifest_path)
    except UserError as exc:
        notes.append(unread_note(exc))
    if "training.decoding" in taken:
        source, where = edited, shown_path(manifest_path)
        notes = [taken_note(["training.decoding"], manifest_path)]
    training = source.get("training")
    decoding = training.get("decoding") if isinstance(training, dict) else None
    if decoding is not None and not isinstance(decoding, dict):  # decoded with none, said taken
        raise UserError(f"{where}: training.decoding: expected an object of decoding settings")
    return decoding or {}, where, notes
