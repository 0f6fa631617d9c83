"""`expert-cli export-hub`: a run's adapter as a folder to upload to the Hugging Face Hub
(`hf upload OWNER/NAME FOLDER`): the files `package` ships (the adapter as peft loads it, a
PiSSA or OLoRA run's as its LoRA of the base; the tokenizer; the manifest; LICENSE and the
grammar where the expert has them) and a README.md model card in place of the expert's
README (kept inside the card). Nothing of the run's checkpoints, optimizer states or logs.

The folder is written under a temporary name and renamed into place whole: an interrupt or a
full disk leaves nothing, and only a new or empty folder is written to.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expert_cli.atomic import atomic_folder, parents_made, usual_mode
from expert_cli.errors import RunError, Terminated, UserError, left_by
from expert_cli.paths import resolved_path, shown_path
from expert_cli.train.adapter_entry import first_base
from expert_cli.train.choice import final_step
from expert_cli.train.gguf_export import DECOMPOSED_NOTE, RANDOM_BASE_NOTE, export_gguf
from expert_cli.train.merge import refuse_folder_output
from expert_cli.train.model_card import CardFacts, hub_id, model_card
from expert_cli.train.outputs import ADAPTER_FILES, data_folder_problem, read_json_file
from expert_cli.train.package import Members, plan_members
from expert_cli.train.package_check import adapters_of
from expert_cli.train.ship_choice import as_exported, inside_run_folders

README_BYTES = 1 << 20  # an expert's README read into the card at most; a larger one ships as is
KEPT_README = "EXPERT_README.md"  # where a README too large for the card goes


@dataclass
class HubReport:
    """What `export-hub` wrote (to_dict: its --json)."""

    path: Path
    files: dict[str, int] = field(default_factory=dict)  # name -> bytes
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "files": self.files, "notes": self.notes}


def export_hub(
    run_dir: Path,
    output: Path,
    checkpoint: str | None = None,
    repo_id: str | None = None,
    gguf: str | None = None,
) -> HubReport:
    """Write the folder (`gguf`: with the adapter as a GGUF file of that type too); UserError
    for a run, adapter or --output it cannot be made of."""
    output = resolved_path(output, "--output")
    if repo_id is not None and not hub_id(repo_id):
        raise UserError("--repo-id: expected OWNER/NAME, a Hugging Face repository id")
    refuse_folder_output(output)
    manifest, members, notes = plan_members(run_dir, checkpoint, hive=False)
    notes = [_worded(n) for n in notes]
    run = run_dir.absolute()
    if problem := data_folder_problem(output, run, "the folder's files") or inside_run_folders(
        output, run
    ):
        raise UserError(problem)
    readme = members.pop("README.md", None)
    text = None
    if readme is not None:
        data = readme if isinstance(readme, bytes) else None
        if data is None and readme.stat().st_size <= README_BYTES:
            data = readme.read_bytes()
        if data is None:
            members[KEPT_README] = readme
            notes.append(f"the expert's README.md is over 1 MiB: kept as {KEPT_README}")
        else:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is None or "\x00" in text:  # not text: shipped as it is, not in the card
                members[KEPT_README] = readme
                notes.append(f"the expert's README.md is not UTF-8 text: kept as {KEPT_README}")
                text = None
    with tempfile.TemporaryDirectory(prefix="expert-cli-hub-") as staging:
        if gguf:
            # the adapter the folder holds, named as chosen: `best` is not looked for twice
            chosen = (manifest.get("training") or {}).get("packaging_checkpoint") or checkpoint
            name, file, gguf_notes = _gguf_file(run, chosen, gguf, Path(staging))
            members[name] = file
            # the base's notes, decomposed or random, are the folder's own already
            notes += [n for n in gguf_notes if n not in (DECOMPOSED_NOTE, RANDOM_BASE_NOTE)]
        return _finish(run, output, (manifest, members, notes), text, repo_id)


def _gguf_file(
    run: Path, checkpoint: str | None, outtype: str, staging: Path
) -> tuple[str, Path, list[str]]:
    """The adapter as a GGUF file in `staging`, its name in the folder, and export's notes."""
    try:
        report = export_gguf(run, staging / "adapter.gguf", False, checkpoint, outtype)
    except UserError as exc:
        raise UserError([f"--gguf: {line}" for line in exc.lines]) from None
    return f"adapter-{outtype}.gguf", report.path, report.notes


def _finish(
    run: Path,
    output: Path,
    planned: tuple[dict[str, Any], Members, list[str]],
    text: Any,
    repo_id: Any,
) -> HubReport:
    """The card made, the folder written."""
    manifest, members, notes = planned
    resolved = read_json_file(run / "manifest.resolved.json")
    facts = CardFacts(
        manifest,
        json.loads(bytes(members[ADAPTER_FILES[1]])),  # written by plan_members: bytes
        resolved,
        read_json_file(run / "metrics.json"),
        _step(run, manifest),
        text,
        repo_id,
        set(members),
    )
    card, card_notes = model_card(facts)
    members["README.md"] = card.encode("utf-8")
    notes += card_notes
    base = first_base(manifest).get("name")
    if resolved.get("base_model_kind") != "hub" or not hub_id(base):
        notes.append(
            "the base model is a local folder, not a hub id: the card names no base_model and "
            "adapter_config.json's base_model_name_or_path names a local path; set both to the "
            "base's hub id before uploading, or whoever loads the adapter cannot find its base"
        )
    _write(output, members)
    return HubReport(output, {name: (output / name).stat().st_size for name in members}, notes)


def _step(run: Path, manifest: dict[str, Any]) -> int | None:
    """The step the exported adapter holds: a checkpoint's, as its entry says, else the
    final adapter's as the run recorded it."""
    entries = adapters_of(manifest)[0]
    step = entries[0].get("checkpoint_step") if entries and isinstance(entries[0], dict) else None
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    return final_step(run)


def _worded(note: str) -> str:
    """package's note as said of this folder."""
    if note.endswith("has no README.md: the package has none"):
        return note.replace("the package has none", "the card is written without it")
    return as_exported(note).replace("the package", "the folder")


def _write(output: Path, members: dict[str, bytes | Path]) -> None:
    try:
        with (
            parents_made(output),
            atomic_folder(output) as tmp,
        ):  # an existing `output` is empty, checked above
            for name, data in members.items():
                dest = tmp / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(data, bytes):
                    dest.write_bytes(data)
                else:
                    shutil.copyfile(data, dest)
            usual_mode(tmp)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR) and os.path.lexists(output):
            raise UserError(
                f"--output {shown_path(output)}: something was put there while export-hub ran; "
                "it is left as it is and the folder was not kept; give a new or empty folder"
            ) from None
        raise RunError(
            f"--output {shown_path(output)}: cannot be written ({exc.strerror})"
        ) from None
    except (KeyboardInterrupt, Terminated) as exc:
        whole = output.is_dir() and any(output.iterdir())
        raise left_by(
            exc, "the folder", shown_path(output), f"{shown_path(output)} was" if whole else None
        ) from None
