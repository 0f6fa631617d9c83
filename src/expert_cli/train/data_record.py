"""Whether a resumed run reads the data the run began with: each run records what identifies
its data files (`runtime.data.stats.inputs` in manifest.resolved.json: sizes and hashes, hub
ids and revisions), and how its examples were built from them (the tokenizer's files, the
formatting, the validation split); a checkpoint's place in other data, or in the same data
built otherwise, means nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from expert_cli.data.cache import fingerprint_inputs
from expert_cli.data.changes import changed_inputs
from expert_cli.errors import UserError
from expert_cli.train.outputs import read_json_file


def refuse_changed_data(output: Path, resolved: Any, tokenizer: Any) -> list[str]:
    """UserError when the data files of a run resumed into `output` changed since it began;
    called before the token cache is built, so edited data costs no build. A note where the
    run began on a cache of another format (an earlier expert-cli's)."""
    runtime = read_json_file(output / "manifest.resolved.json").get("runtime")
    before = runtime.get(BASE_CONFIG_KEY) if isinstance(runtime, dict) else None
    if before and (now := base_config_digest(resolved)) and now != before:
        raise UserError(
            f"--resume: the base model's config.json ({resolved.base_model}) changed since "
            f"{output} began (a model {'built' if resolved.init == 'random' else 'read'} from "
            "it would not be the one the checkpoint was trained on); put the file back, or "
            "start again with --overwrite"
        )
    inputs = fingerprint_inputs(resolved, tokenizer, 1)  # the shard size is not compared
    if changed := changed_data(output, {"stats": {"inputs": inputs}}):
        raise UserError(data_changed(output, changed))
    if changed := changed_building(_recorded_inputs(runtime), inputs):
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        shown = "; ".join(changed[:3]) + more
        raise UserError(
            f"--resume: {output} was trained on examples built otherwise (changed since it "
            f"began: {shown}); resume with the manifest and base model it began with, or start "
            "again with --overwrite"
        )
    began = (_recorded_inputs(runtime) or {}).get("format_version")
    if not isinstance(began, int) or began == inputs["format_version"]:
        return []
    return [
        f"--resume: {output} began on a token cache of format {began}, and this expert-cli "
        f"builds format {inputs['format_version']}, which may lay out or pack some examples "
        "otherwise: the checkpoint's place in its epoch then falls among other rows, and the "
        "rest of that epoch may see a few examples twice and miss others; to continue "
        "exactly, resume with the expert-cli version that began the run"
    ]


BASE_CONFIG_KEY = "base_config_sha256"  # runtime: the local base's config.json as the run began


def base_config_digest(resolved: Any) -> str | None:
    """sha256 of a local base model's config.json (what a random-init base is built from, and
    what a pretrained one is read as); None for a hub base or an unreadable file."""
    if resolved.base_model_kind != "local":
        return None
    try:
        return hashlib.sha256((Path(resolved.base_model) / "config.json").read_bytes()).hexdigest()
    except OSError:
        return None


# what of the recorded inputs builds the examples from the data files: the tokenizer's files,
# the formatting (prompt and response templates, field mapping, overlong examples), the split
BUILDING = ("tokenizer", "formatting", "eval_fraction", "eval_seed")


def changed_building(recorded: dict[str, Any] | None, inputs: dict[str, Any]) -> list[str]:
    """`key old -> new` for what builds the examples that changed since the run began, from
    the inputs it `recorded`; nothing for a run of a version that did not record them."""
    old = {key: recorded[key] for key in BUILDING if key in (recorded or {})}
    return changed_inputs(old, {key: inputs.get(key) for key in old}, recorded=True)


def changed_data(output: Path, data: dict[str, Any]) -> list[str]:
    """What a resumed run's data files changed in since the run began (a local file edited,
    added or removed: its name; a source's files renamed into another order: the source;
    another hub source: its place), source by source, from the inputs both recorded;
    nothing for a run of a version that did not record them. A file renamed, the same
    content in the same place of its source's order, is no change."""
    before = _inputs(read_json_file(output / "manifest.resolved.json").get("runtime"))
    now = _inputs(data and {"data": data})
    if before is None or now is None or before == now:
        return []
    pairs = _source_pairs(before, now)
    if pairs is None:  # another number of sources (a resume names that apart): all at once
        return _changed_files(_named_files(before), _named_files(now))
    named = []
    for old, recorded_now in pairs:
        new = _as_recorded(old, recorded_now)
        old_files, new_files = _files_of(old), _files_of(new)
        if changed := _changed_files(old_files, new_files):
            named += changed
        elif _in_order(old_files) != _in_order(new_files):  # read, and shuffled, otherwise
            place = new.get("location") if isinstance(new, dict) else None
            named.append(f"{place or 'a source'}: its files named into another order")
    return named


def _as_recorded(old: Any, new: Any) -> Any:
    """`new` as the run recorded its sources: a hub source without the files of its cached
    snapshot where the run began before they were recorded (2026-12-08)."""
    hub = isinstance(old, dict) and old.get("kind") == "hub" and "files" not in old
    if hub and isinstance(new, dict):
        return {k: v for k, v in new.items() if k not in ("files", "snapshot")}
    return new


def _source_pairs(before: dict[str, Any], now: dict[str, Any]) -> list[tuple[Any, Any]] | None:
    """Each source as the run began paired with the one now, role by role (train,
    validation), or None where a role holds another number of sources."""
    pairs: list[tuple[Any, Any]] = []
    for role in sorted(set(before) | set(now)):
        old, new = before.get(role), now.get(role)
        if not isinstance(old, list) or not isinstance(new, list) or len(old) != len(new):
            return None
        pairs += zip(old, new, strict=True)
    return pairs


def _changed_files(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The names of `new`'s files whose content `old` has not, and a count of the old ones
    left unpaired (by content: a file's name is relative to the manifest's folder, so moving
    the manifest renames every file, and a large file's mtime changes with a plain copy)."""
    kept = [_content(v) for v in old.values()]
    named = []
    for name, value in sorted(new.items()):
        if _content(value) in kept:
            kept.remove(_content(value))
        else:
            named.append(name)
    if (gone := len(kept) - len(named)) > 0:  # an edited file pairs a new one with an old
        named.append(f"{gone} file(s) no longer there")
    return named


def _in_order(files: dict[str, Any]) -> list[Any]:
    """The files' contents in the order a folder's files are read (sorted paths)."""
    return [_content(files[name]) for name in sorted(files, key=lambda n: Path(n).parts)]


def data_changed(output: Path, changed: list[str]) -> str:
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return (
        f"--resume: {output} was trained on other data (changed since it began: {shown}); "
        "resume with the data it began with, or start again with --overwrite"
    )


def _content(value: Any) -> Any:
    """What identifies a data file's content in the recorded inputs (its mtime left out)."""
    if isinstance(value, dict):
        return sorted((k, str(v)) for k, v in value.items() if k != "mtime_ns")
    return value


def _recorded_inputs(runtime: Any) -> dict[str, Any] | None:
    """The data inputs a run recorded (`runtime.data.stats.inputs`), or None."""
    try:
        inputs = runtime["data"]["stats"]["inputs"]
    except (KeyError, TypeError):
        return None
    return inputs if isinstance(inputs, dict) else None


def _inputs(runtime: Any) -> dict[str, Any] | None:
    sources = (_recorded_inputs(runtime) or {}).get("sources")
    return sources if isinstance(sources, dict) else None


def _named_files(sources: dict[str, Any]) -> dict[str, Any]:
    """Every source's files by name (a hub source by its place), with what identifies them."""
    named: dict[str, Any] = {}
    for entries in sources.values():
        for entry in entries if isinstance(entries, list) else []:
            named.update(_files_of(entry))
    return named


def _files_of(entry: Any) -> dict[str, Any]:
    """A recorded source's files by name (a hub source: its place), with what identifies them."""
    if not isinstance(entry, dict):
        return {}
    files = entry.get("files")
    if isinstance(files, dict):
        return {str(name): value for name, value in files.items()}
    return {str(entry.get("location")): entry}


def records_local_files(runtime: Any) -> bool:
    """Whether a run recorded its local data files' contents (the run's data is then
    compared by content, and a file's new name alone is no change)."""
    sources = _inputs(runtime) or {}
    entries = [e for v in sources.values() if isinstance(v, list) for e in v]
    return any(isinstance(e, dict) and isinstance(e.get("files"), dict) for e in entries)
