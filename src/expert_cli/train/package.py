"""`expert-cli package`: a trained run as a HiveLLM `.expert` package, and `check --package`.

The package is a gzip-compressed tar with no top-level folder (the layout hivellm/expert's
packager writes and its loader reads):

- `manifest.json`: the expert's manifest as its file holds it, with a schema 2.0 `base_models`
  reduced to the base model the adapter was trained on, the adapter's `size_bytes` and
  `sha256` filled in, and completed for HiveLLM's loader from what the run trained
  (train/hive_loader.py);
- `adapter_model.safetensors` and `adapter_config.json` (its `base_model_name_or_path` set to
  the manifest's base model), at the root, the only place HiveLLM's loader looks (an adapter
  entry's `path` is left out);
- the run's tokenizer files;
- from the expert's folder, when present: README.md, LICENSE, the grammar file
  (`training.decoding.grammar_file`, else grammar.gbnf) and soft prompts, at the paths the
  manifest names them by.

Members are written in a fixed order with fixed times and owners, so the same run gives the
same bytes. Beside the package, `<package>.sha256` holds `<hex>  <file name>` (`sha256sum -c`
reads it). The package is read back and verified before it is reported written.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from expert_cli.atomic import Staged, atomic_files, parents_made
from expert_cli.config import Manifest
from expert_cli.config.base import FILE_NAME_PART, FILE_NAME_PART_RULE
from expert_cli.config.loading import format_errors
from expert_cli.config.refs import WINDOWS_PATH
from expert_cli.errors import RunError, Terminated, UserError, left_by, value_kind
from expert_cli.paths import resolved_path, shown_path
from expert_cli.train import adapter_entry as entry
from expert_cli.train import package_members as pm
from expert_cli.train.checkpoints import checkpoint_step
from expert_cli.train.choice import chosen_checkpoint
from expert_cli.train.hive_loader import refuse_unloadable
from expert_cli.train.lora_init import INIT_WEIGHTS, standard_form, standard_notes
from expert_cli.train.outputs import (
    ADAPTER_FILES,
    SOURCE_MANIFEST,
    data_folder_problem,
    read_json_file,
    run_of,
)
from expert_cli.train.package_check import (
    MAX_FILE_BYTES,
    PackageReport,
    adapters_of,
    sha256_of,
    verify_package,
)
from expert_cli.train.package_manifest import completed_for_package
from expert_cli.train.package_output import refuse_output, stale
from expert_cli.train.package_sum import CHECKSUM_SUFFIX
from expert_cli.train.rslora_fold import folded, folded_note, is_rslora
from expert_cli.train.run_source import (
    as_trained,
    edited_since,
    later_edits,
    run_manifest,
    taken_note,
)
from expert_cli.train.ship_choice import final_problem, inside_run_folders, shipped
from expert_cli.train.tokenizer_files import tokenizer_folder, tokenizer_members
from expert_cli.weights import unchanged_adapter

Members = dict[str, bytes | Path]  # member name -> its bytes, or the file that holds them


# --------------------------------------------------------------------------- building


def package_name(manifest: dict[str, Any], base: str) -> str:
    """`{name}-{base}.v{version}.expert` as hivellm/expert names it (schema 2.0: the base
    model's last path part, lowercase, `.` and `_` as `-`; 1.0: `.` and `-` removed)."""
    name, version = str(manifest.get("name") or ""), str(manifest.get("version") or "0.0.0")
    for field_name, value in (("name", name), ("version", version)):
        if not FILE_NAME_PART.fullmatch(value):
            raise UserError(f"{field_name}: expected {FILE_NAME_PART_RULE}")
    last = base.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()
    if manifest.get("schema_version") == "2.0":
        slug = last.replace(".", "-").replace("_", "-")
    else:
        slug = last.replace(".", "").replace("-", "")
    return f"{name}-{slug}.v{version}.expert"


def _relative(value: Any, where: str) -> PurePosixPath:
    """A path the manifest gives for a file inside the package: relative, inside it."""
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: expected a relative path (got {value_kind(value)})")
    path = PurePosixPath(value.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or WINDOWS_PATH.match(value):
        raise UserError(
            f"{where}: expected a relative path inside the package (no leading /, drive or ..)"
        )
    return path


def _file(path: Path, where: str) -> Path:
    if not path.is_file():
        raise UserError(f"{where}: {path} is not a file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise UserError(f"{where}: {path} is over {MAX_FILE_BYTES >> 30} GB")
    return path


def _inside(expert_dir: Path, path: Path, where: str) -> Path:
    """`_file`, and refused where it is a link to a file outside the expert's folder: what it
    points at (a secret, a system file) would be shipped, and published, as the expert's."""
    try:
        outside = not path.resolve().is_relative_to(expert_dir.resolve())
    except (OSError, RuntimeError):
        outside = True
    if outside:
        raise UserError(
            f"{where}: {shown_path(path)} is a link to a file outside the expert's folder, which "
            "would be shipped as the expert's; copy the file in, or remove the link"
        )
    return _file(path, where)


def _adapter_members(
    manifest: dict[str, Any], resolved: dict[str, Any], weights_dir: Path, base_name: str, step: Any
) -> tuple[Members, list[str]]:
    """manifest.json and the adapter's files, the manifest's adapter entry filled in (size,
    sha256, the checkpoint's step) and reconciled with the configuration shipped."""
    weights = _file(weights_dir / ADAPTER_FILES[0], "--adapter")
    if zero := unchanged_adapter(weights):
        raise UserError(
            f"--adapter {shown_path(weights_dir)}: {ADAPTER_FILES[0]}: every {zero} weight is "
            "still zero, so the adapter adds nothing to the base model (every step of its run "
            "had a learning rate of 0: a warm-up as long as the run starts at 0); train with "
            "more steps or warmup_steps 0"
        )
    config = json.loads(_file(weights_dir / ADAPTER_FILES[1], "--adapter").read_text("utf-8"))
    shipped: bytes | Path = weights
    if standard := standard_form(weights_dir, run_of(weights_dir) / INIT_WEIGHTS):
        shipped, config = standard  # a PiSSA run's checkpoint, as a LoRA of the base itself
    config = entry.whole_alpha({**config, "base_model_name_or_path": base_name})  # 16, not 16.0
    folds = is_rslora(config)
    if folds:  # HiveLLM's runtime scales by alpha / r: the weights carry rsLoRA's sqrt(r)
        shipped, config = folded(weights, config)
    notes = completed_for_package(manifest, resolved, config) + entry.runtime_notes(config)
    notes += [folded_note(config)] if folds else []
    notes = standard_notes(notes, config, resolved)
    adapter = adapters_of(manifest)[0][0]
    if isinstance(shipped, bytes):
        adapter["size_bytes"], adapter["sha256"] = len(shipped), hashlib.sha256(shipped).hexdigest()
    else:
        adapter["size_bytes"], adapter["sha256"] = weights.stat().st_size, sha256_of(weights)
    if step is not None:  # a checkpoint's: the entry says which step it holds
        adapter["checkpoint_step"] = step
    else:
        adapter.pop("checkpoint_step", None)  # a step the run's copy named, not this adapter's
    members: Members = {  # at the root: the only place HiveLLM's loader looks
        "manifest.json": (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode(),
        ADAPTER_FILES[0]: shipped,
        ADAPTER_FILES[1]: (json.dumps(config, indent=2) + "\n").encode(),
    }
    return members, notes


def plan_members(
    run_dir: Path, checkpoint: str | None = None, hive: bool = True
) -> tuple[dict[str, Any], Members, list[str]]:
    """(packaged manifest, member name -> bytes or file, notes) of a run folder; the adapter
    of `checkpoint` (checkpoint-N or final) when given, else as `chosen_checkpoint` says.
    `hive`: refuse a manifest HiveLLM's loader would (export-hub's folder is not installed by
    it)."""
    run_dir = run_dir.absolute()
    problem = final_problem(run_dir)
    resolved = read_json_file(run_dir / "manifest.resolved.json")
    if problem and not resolved and not (run_dir / "manifest.resolved.json").exists():
        raise problem  # a folder train did not write (a damaged record is named below)
    source, manifest_path = run_manifest(run_dir, resolved)
    edited = edited_since(run_dir, source, manifest_path)
    trained, notes = as_trained(source, resolved)
    source, taken = later_edits(run_dir, trained, source, manifest_path)
    notes += edited + ([taken_note(taken, manifest_path)] if taken else [])
    manifest = copy.deepcopy(source)
    try:  # comments included: they are written into the package
        parsed = Manifest.model_validate(copy.deepcopy(source))
    except ValidationError as exc:
        where = f"{shown_path(manifest_path)} (its later edits)" if taken else SOURCE_MANIFEST
        raise UserError([f"{where}: {line}" for line in format_errors(exc)]) from None
    chosen = chosen_checkpoint(run_dir, checkpoint, manifest_path, source)
    weights_dir, shipped_notes = shipped(run_dir, chosen, problem)
    notes += shipped_notes
    if isinstance(manifest.get("training"), dict):  # the package says which adapter it holds
        manifest["training"]["packaging_checkpoint"] = chosen[0]
    if manifest.get("schema_version") == "2.0":
        manifest["base_models"] = manifest["base_models"][:1]
    base_name = parsed.primary_base_model.name
    step = checkpoint_step(weights_dir) if chosen[0] != "final" else None
    tokenizer, missing = tokenizer_members(tokenizer_folder(weights_dir, run_dir))
    notes += missing + pm.shipped_template(manifest, tokenizer) + pm.dropped_start(manifest)
    members, entry_notes = _adapter_members(manifest, resolved, weights_dir, base_name, step)
    members.update(tokenizer)
    notes += entry_notes
    grammar = parsed.training.decoding.grammar_file if parsed.training.decoding else None
    notes += _expert_files(manifest, grammar, manifest_path.parent, members)
    if resolved.get("init") == "random":  # the demo's kind of run
        notes.append(
            "the base was built with random weights (init: random), kept in the run's "
            "base_model/ and not in the package: whoever loads it gets other random weights, "
            "on which the adapter means nothing; train on a pretrained base to ship"
        )
    if hive:
        refuse_unloadable(manifest)  # last: the files the manifest names are refused first
    return manifest, members, notes


def _expert_files(
    manifest: dict[str, Any], grammar: str | None, expert_dir: Path, members: Members
) -> list[str]:
    """README, LICENSE, grammar and soft prompts from the expert's folder, where present."""
    if not expert_dir.is_dir():
        return [f"the expert's folder {expert_dir} is gone: no README, LICENSE or grammar"]
    notes = []
    for name in pm.EXPERT_FILES:
        if (expert_dir / name).is_file():
            members[name] = _inside(expert_dir, expert_dir / name, name)
    wanted = [("training.decoding.grammar_file", grammar)] if grammar else []
    for i, prompt in enumerate(manifest.get("soft_prompts") or []):
        if isinstance(prompt, dict) and prompt.get("path"):
            wanted.append((f"soft_prompts[{i}].path", prompt["path"]))
    for where, value in wanted:
        relative = _relative(value, where)
        path = expert_dir / relative
        if not path.is_file():
            raise UserError(f"{where}: {path} is not a file")
        members[relative.as_posix()] = _inside(expert_dir, path, where)
    if not grammar and (expert_dir / "grammar.gbnf").is_file():
        members["grammar.gbnf"] = _inside(expert_dir, expert_dir / "grammar.gbnf", "grammar.gbnf")
    if "README.md" not in members:
        notes.append(f"{expert_dir} has no README.md: the package has none")
    return notes


def build_package(
    run_dir: Path, output: Path | None = None, force: bool = False, checkpoint: str | None = None
) -> PackageReport:
    """Write the package and its `.sha256`, read it back and verify it."""
    manifest, members, notes = plan_members(run_dir, checkpoint)
    base = (
        manifest["base_models"][0]["name"]
        if manifest.get("base_models")
        else ((manifest.get("base_model") or {}).get("name", ""))
    )
    default = package_name(manifest, str(base))
    path = resolved_path(output, "--output") if output else run_dir.parent / default
    checksum = path.with_name(path.name + CHECKSUM_SUFFIX)
    refuse_output(path, checksum, default, force, given=output is not None)
    notes += [f"removed {name}, left by a package that was stopped" for name in stale(path)]
    if problem := data_folder_problem(path, run_dir, "the package and its .sha256") or (
        inside_run_folders(path, run_dir)
    ):
        raise UserError(problem)
    staged = Staged()
    try:
        # both written in full, then renamed into place with signals held: a full disk or
        # an interrupt leaves neither, and never a package beside a checksum of another
        with parents_made(path), atomic_files([path, checksum], first_new=not force) as staged:
            tmp, tmp_sum = staged.paths
            pm.write_tar(tmp, members)
            report = verify_package(tmp, expected=members, sidecar=False)
            if report.problems:  # never leave a package that does not read back
                # a line said of the whole archive names the temporary file: said of `path`
                shown = f"{shown_path(tmp)}: "
                raise UserError([f"{path}: {p.removeprefix(shown)}" for p in report.problems])
            tmp_sum.write_text(f"{report.sha256}  {path.name}\n", encoding="utf-8")
    except FileExistsError:  # another package of that name finished while this one was built
        raise UserError(
            f"--output {shown_path(path)}: was written by another process while this package "
            "was built; it is left as it is; package again with another name, or --force to "
            "replace it"
        ) from None
    except OSError as exc:  # a full disk, a folder gone since the check: not the user's input
        raise RunError(_write_failed(exc, path, run_dir)) from None
    except (KeyboardInterrupt, Terminated) as exc:  # what the interrupt left, said
        whole = f"{shown_path(path)} and its {CHECKSUM_SUFFIX} were" if staged.in_place else None
        raise left_by(exc, "the package", shown_path(path), whole) from None
    notes += [n for n in report.notes if n not in notes]  # the check's, said once
    report.path, report.checksum_file, report.notes = path, checksum, notes
    return report


def _write_failed(exc: OSError, path: Path, run_dir: Path) -> str:
    """What stopped the package: a file of the run that went while it was read (a `train
    --overwrite` sets the run aside), or its own file that could not be written."""
    name = Path(str(exc.filename)) if exc.filename else None
    gone = exc.errno == errno.ENOENT and name is not None and not name.name.startswith(".tmp-")
    if gone and name.absolute().is_relative_to(run_dir.absolute()):  # not its own file
        return (
            f"--adapter {shown_path(run_dir)}: {name.name} could not be read ({exc.strerror}): "
            "was the run moved or removed while it was packaged? Package it again"
        )
    return f"--output {shown_path(path)}: cannot be written ({exc.strerror})"
