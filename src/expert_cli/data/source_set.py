"""Every source of a run read (data/sources.py) and joined into its training and evaluation
splits: the held-out examples, the tasks' weights, instruction data beside conversations as
conversations (data/layouts.py), and each task's share of the evaluation split."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from expert_cli.config.resolve import ResolvedConfig, SourceRef
from expert_cli.data.fields import ROLES, FieldSpec, unread_words
from expert_cli.data.hub_snapshot import snapshot_lines
from expert_cli.data.layouts import as_conversations, run_kind
from expert_cli.data.overlap import shared_note
from expert_cli.data.sources import load_source
from expert_cli.data.splits import apply_weight, hold_out, unheld_note
from expert_cli.errors import UserError


@dataclass
class LoadedSources:
    """Training and evaluation examples (columns renamed to roles), with counts read."""

    train: datasets.Dataset
    eval: datasets.Dataset | None
    fields: FieldSpec
    read: dict[str, int]
    notes: list[str]
    mappings: list[dict[str, Any]]  # each source's columns as read (the manifest field naming it)
    # each task's examples of the evaluation split, in its order (a multi_task expert's; empty
    # where its sources are no tasks): the build packs them apart, evaluation counts each
    eval_tasks: list[tuple[str, int]] = field(default_factory=list)


def load_sources(resolved: ResolvedConfig, cache_dir: Path) -> LoadedSources:
    """Read every training and validation source of the resolved config."""
    specs: list[FieldSpec] = []  # each source's fields, in the order read
    train_parts: list[tuple[datasets.Dataset, str]] = []  # with the layout each was read in
    eval_parts: list[tuple[datasets.Dataset, str]] = []
    eval_tasks: list[tuple[str | None, int]] = []
    unheld: list[str] = []  # tasks of too few examples to hold one out
    notes: list[str] = []
    mappings: list[dict[str, Any]] = []
    read = {"train": 0, "eval": 0}
    for ref in resolved.train_sources + resolved.validation_sources:  # a hub one read offline
        problems, said = snapshot_lines(ref)
        if problems:
            raise UserError(problems)
        notes += said

    def loaded(ref: SourceRef, split: str) -> datasets.Dataset:
        ds, fields = load_source(
            ref, specs[-1] if specs else None, resolved.field_mapping, cache_dir
        )
        specs.append(fields)
        run_kind(specs, resolved.prompt_template)  # two layouts no run joins: said at once
        mappings.append({"source": ref.field, "mapping": fields.mapping})
        read[split] += len(ds)
        return ds

    for i, ref in enumerate(resolved.train_sources):
        ds = loaded(ref, "train")
        if not resolved.validation_sources:
            ds, held = hold_out(ds, resolved.eval_fraction, resolved.eval_seed + i)
            if held is not None:
                eval_parts.append((held, specs[-1].kind))
                eval_tasks.append((ref.task, len(held)))
            elif ref.task and resolved.eval_fraction:  # under 2 examples: none held out
                unheld.append(ref.task)
        weighted = apply_weight(ds, ref.weight, resolved.seed + i)
        if ref.weight != 1.0:
            notes.append(
                f"task {ref.task}: weight {ref.weight}: {len(weighted)} "
                f"example{'s' * (len(weighted) != 1)} from {len(ds)}"
            )
        train_parts.append((weighted, specs[-1].kind))
    for ref in resolved.validation_sources:
        eval_parts.append((loaded(ref, "eval"), specs[-1].kind))
        eval_tasks.append((ref.task, len(eval_parts[-1][0])))
    kind = run_kind(specs, resolved.prompt_template)
    notes += [note for note in dict.fromkeys(unread_words(f) for f in specs) if note]
    train = _joined(train_parts, kind, cache_dir)
    held = _joined(eval_parts, kind, cache_dir) if eval_parts else None
    notes += [note] if (note := shared_note(train, held)) else []
    fields = next(f for f in specs if f.kind == kind)  # the run's: a conversation source's
    notes += [note] if eval_parts and (note := unheld_note(unheld)) else []
    tasks = [(t, n) for t, n in eval_tasks if t is not None]
    tasks = tasks if len(tasks) == len(eval_tasks) else []
    return LoadedSources(train, held, fields, read, notes, mappings, tasks)


def _joined(
    parts: list[tuple[datasets.Dataset, str]], kind: str, work_dir: Path
) -> datasets.Dataset:
    """The parts as one dataset, instruction data beside conversations as conversations."""
    return _concat([as_conversations(ds, work_dir) if k != kind else ds for ds, k in parts])


def _concat(parts: list[datasets.Dataset]) -> datasets.Dataset:
    if len(parts) == 1:
        return parts[0]
    roles = [r for r in ROLES if any(r in ds.column_names for ds in parts)]
    parts = [_with_roles(ds, roles) for ds in parts]
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError as exc:
        raise UserError(f"training.dataset: sources have different column types ({exc})") from None


def _with_roles(ds: datasets.Dataset, roles: list[str]) -> datasets.Dataset:
    """`ds` with each of `roles` it lacks as a column of nulls (conversations without tools
    beside conversations with them), as a file's row without the key is read."""
    for role in roles:
        if role not in ds.column_names:
            ds = ds.add_column(role, pa.nulls(len(ds), pa.string()))
    return ds
