"""Building a token cache in resumable shards, then assembling it atomically.

Each split is cut into shards of `shard_examples` consecutive source examples (and, with
`overlong: split`, of at most SPLIT_SHARD_BYTES of text). A shard is
formatted and tokenized (in N worker processes, see workers.py), packed, and saved to a
temporary folder that is renamed to `.build-<fp>/<split>/shard-NNNNN` when complete, so a crash
loses at most the shard in progress and the next build skips the finished ones. The shards are
then concatenated into `.tmp-<fp>-<pid>/`, `stats.json` and `_COMPLETE` are written, and the
folder is renamed to its final name. The caller holds the fingerprint's file lock.

Progress goes to a `BuildProgress` the caller passes (the CLI draws a bar from it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import datasets
import numpy as np
from transformers import PreTrainedTokenizerFast

from expert_cli.atomic import atomic_folder, write_json_atomic
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.config.split_names import field_role
from expert_cli.data.answer_notes import conversation_notes
from expert_cli.data.cache import COMPLETE, STATS, CachePlan, local_data_files
from expert_cli.data.formatting import (
    KEPT,
    SPLIT,
    TRUNCATED,
    Formatter,
    check_chat_template,
    instruction_checked,
)
from expert_cli.data.packing import pack_table
from expert_cli.data.pieces import split_rows
from expert_cli.data.shard_stats import drop_counts, first_value, shard_styles, summed, task_rows
from expert_cli.data.source_set import load_sources
from expert_cli.data.stats_words import drop_reasons
from expert_cli.data.workers import row_costs, tokenize_rows
from expert_cli.errors import RunError, UserError
from expert_cli.paths import shown_path

log = logging.getLogger(__name__)
MIN_EXAMPLES_PER_PROC = 512  # below this a worker process costs more than it saves
SPLIT_SHARD_BYTES = 256 << 20  # text a shard of an `overlong: split` build holds, at most


def default_num_proc() -> int:
    """Worker processes when --num-proc is not given: none (one process).

    The fast tokenizer's Rust thread pool already encodes each batch on every core, and worker
    processes must send their token arrays back through pipes: measured on 2 cores, one process
    reached 0.85-0.91 of the raw batched limit and two worker processes 0.76-0.83
    (docs/PERFORMANCE.md). `--num-proc N` still runs N worker processes where the Python-side
    formatting is the larger cost.
    """
    return 1


class BuildProgress(Protocol):
    """Where a build reports its progress: `start` once, then `advance` per examples done."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, examples: int) -> None: ...


class NoProgress:
    """A build that reports nothing."""

    def start(self, description: str, total: int) -> None:
        return None

    def advance(self, examples: int) -> None:
        return None


@dataclass(frozen=True)
class BuildJob:
    """One cache build: where it goes, what it reads, how it tokenizes and packs."""

    plan: CachePlan
    resolved: ResolvedConfig
    formatter: Formatter
    num_proc: int
    shard_examples: int
    progress: BuildProgress


def build_cache(
    plan: CachePlan,
    resolved: ResolvedConfig,
    tokenizer: PreTrainedTokenizerFast,
    num_proc: int,
    shard_examples: int,
    progress: BuildProgress | None = None,
) -> dict[str, Any]:
    """Build (or finish building) the cache of `plan`; return its stats."""
    with quiet_datasets():  # the caller's is the one progress bar of a build
        return _build(
            plan, resolved, tokenizer, (num_proc, shard_examples), progress or NoProgress()
        )


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """The datasets library's progress bars off (a caller's own output is all that shows),
    and as they were afterwards."""
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()


def _build(
    plan: CachePlan,
    resolved: ResolvedConfig,
    tokenizer: PreTrainedTokenizerFast,
    sizes: tuple[int, int],
    progress: BuildProgress,
) -> dict[str, Any]:
    started = time.perf_counter()
    _remove_stale(plan)
    sources = load_sources(resolved, plan.work_dir / "sources")
    _unchanged_since_planned(plan, resolved)
    notes = sources.notes
    if sources.fields.kind == "messages":
        notes = notes + check_chat_template(tokenizer, resolved.response_template)
        notes = notes + conversation_notes(sources.train, tokenizer)
    if sources.fields.kind == "instruction":
        notes = notes + instruction_checked(
            tokenizer, resolved.prompt_template, resolved.response_template
        )
    formatter = Formatter(
        tokenizer=tokenizer,
        kind=sources.fields.kind,
        max_seq_length=resolved.max_seq_length,
        overlong=resolved.overlong,
        prompt_template=resolved.prompt_template,
        response_template=resolved.response_template,
    )
    job = BuildJob(plan, resolved, formatter, sizes[0], sizes[1], progress)
    splits = {"train": sources.train, "eval": sources.eval}
    splits = {k: v for k, v in splits.items() if v is not None}
    shard_stats: dict[str, list[dict[str, Any]]] = {}
    resumed = [0, 0]  # shards an interrupted build finished, and their tokens
    progress.start(f"tokenizing {resolved.expert}", sum(len(ds) for ds in splits.values()))
    for split, ds in splits.items():
        tasks = sources.eval_tasks if split == "eval" else []
        stats, done = _build_split(job, split, ds, tasks)
        shard_stats[split] = stats
        resumed = [resumed[0] + len(done), resumed[1] + sum(s["tokens"] for s in done)]
    _unchanged_since_planned(plan, resolved)  # a saved dataset is read while tokenizing
    _require_rows(shard_stats, resolved)
    extra = {
        "num_proc": job.num_proc,
        "max_seq_length": resolved.max_seq_length,  # the drop reasons name it
        "notes": notes,
        # the data's kind (generate reads it) and each source's columns (data/sources.py)
        "fields": {"kind": sources.fields.kind, **_columns(sources.mappings)},
    }
    return _assemble(plan, shard_stats, sources.read, resumed, time.perf_counter() - started, extra)


def _columns(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """Each source's mapping, and the one they share (null where they differ)."""
    shared = all(s["mapping"] == sources[0]["mapping"] for s in sources)
    return {"mapping": sources[0]["mapping"] if shared else None, "sources": sources}


def _unchanged_since_planned(plan: CachePlan, resolved: ResolvedConfig) -> None:
    """RunError, with nothing of the build kept, when a data file was written, added or
    removed since it was hashed: the cache would carry the fingerprint of files it did not
    read."""
    listed = {str(f) for f in local_data_files(resolved)}
    changed = plan.changed_files() + sorted(listed ^ set(plan.marks))
    if changed:
        shutil.rmtree(plan.work_dir, ignore_errors=True)
        raise RunError(
            f"{shown_path(changed[0])}: written, added or removed while the token cache read "
            "the data (by another program?); nothing of this build is kept: run again once "
            "the data is written"
        )


def _require_rows(shard_stats: dict[str, list[dict[str, Any]]], resolved: ResolvedConfig) -> None:
    """A split whose every example was dropped is the user's to fix (an evaluation split of no
    rows would be written as a folder no loader reads): say which and why."""
    for split, stats in shard_stats.items():
        if sum(s["rows"] for s in stats):
            continue
        total = summed(stats, sum(s["examples_read"] for s in stats))
        why = drop_reasons(total, resolved.max_seq_length)
        raise UserError(nothing_left(resolved, split == "train", total["examples"], why))


def split_fields(resolved: ResolvedConfig, train: bool) -> str:
    """The manifest fields a split's examples come from (a test split's, where `evaluate`
    builds its test sources as the split trained on)."""
    if train and _of_tests(resolved):
        return ", ".join(dict.fromkeys(r.field for r in resolved.train_sources))
    if train:
        return "training.dataset"
    fields = dict.fromkeys(ref.field for ref in resolved.validation_sources)
    return ", ".join(fields) or "training.dataset.eval_fraction (the held-out examples)"


def _of_tests(resolved: ResolvedConfig) -> bool:
    """Whether the split built as training's holds test sources (evaluate's test caches)."""
    roles = {field_role(r.field) for r in resolved.train_sources}
    return roles == {"test"}


def nothing_left(resolved: ResolvedConfig, train: bool, read: int, why: str) -> str:
    """The line for a split whose every example is dropped (the build's, and `check`'s where
    it finds the same without tokenizing)."""
    what = ("test" if _of_tests(resolved) else "training") if train else "evaluation"
    return (
        f"{split_fields(resolved, train)}: no {what} example is left after formatting "
        f"({read} read, every one dropped: {why})"
    )


def _remove_stale(plan: CachePlan) -> None:
    """Delete leftovers of killed builds of this fingerprint (we hold its lock)."""
    for path in plan.root.glob(f".tmp-{plan.final_dir.name}-*"):
        shutil.rmtree(path, ignore_errors=True)
    for path in plan.work_dir.glob("*/.tmp-shard-*"):
        shutil.rmtree(path, ignore_errors=True)


def _build_split(
    job: BuildJob, split: str, ds: datasets.Dataset, tasks: list[tuple[str, int]]
) -> tuple[list[dict], list[dict]]:
    """Build every missing shard of one split; return per-shard stats, and those of the
    shards an interrupted build had finished. Each of `tasks` (name, examples, in the split's
    order) is sharded, so packed, apart, its shards' stats naming it."""
    bounds = shard_bounds(ds, job.shard_examples, job.resolved.overlong == "split")
    starts = np.cumsum([0] + [n for _, n in tasks]).tolist()
    bounds = sorted(set(bounds) | set(starts[1:-1]))  # a task's rows begin a shard
    n_shards = len(bounds) - 1
    stats: list[dict[str, Any]] = []
    resumed: list[dict[str, Any]] = []
    for k in range(n_shards):
        lo, hi = bounds[k], bounds[k + 1]
        final = job.plan.work_dir / split / f"shard-{k:05d}"
        # a finished shard whose data was already moved into an assembled cache is redone
        if (final / COMPLETE).is_file() and (final / "data").is_dir():
            stats.append(json.loads((final / STATS).read_text()))
            resumed.append(stats[-1])
            job.progress.advance(hi - lo)
            continue
        seed = job.resolved.seed + 7919 * k + (0 if split == "train" else 1)
        task = tasks[int(np.searchsorted(starts, lo, side="right")) - 1][0] if tasks else None
        stats.append(_build_shard(job, ds.select(range(lo, hi)), final, seed, task))
    if resumed:
        log.info("%s: resumed from %d finished shard(s) of %d", split, len(resumed), n_shards)
    return stats, resumed


def shard_bounds(ds: datasets.Dataset, examples: int, by_bytes: bool) -> list[int]:
    """Where a split's shards begin, then its length: every `examples` rows, and with
    `overlong: split` (whose examples keep all their tokens) also before the rows past
    SPLIT_SHARD_BYTES of text, so a shard's tokens fit in memory and in Arrow's 32-bit
    offsets (a corpus of books was billions of tokens a shard)."""
    n = len(ds)
    if not by_bytes:
        return [*range(0, n, examples), n] if n else [0, 0]
    ends = np.cumsum(row_costs(ds))
    bounds = [0]
    while bounds[-1] < n:
        lo = bounds[-1]
        before = int(ends[lo - 1]) if lo else 0
        fit = int(np.searchsorted(ends, before + SPLIT_SHARD_BYTES, side="right"))
        bounds.append(min(n, lo + examples, max(lo + 1, fit)))
    return bounds if n else [0, 0]


def _build_shard(
    job: BuildJob, ds: datasets.Dataset, final: Path, seed: int, task: str | None
) -> dict[str, Any]:
    """Tokenize, pack and save one shard (of one `task`'s examples, where named) atomically;
    return its stats."""
    procs = max(1, min(job.num_proc, len(ds) // MIN_EXAMPLES_PER_PROC))
    table = tokenize_rows(ds, job.formatter, procs, job.progress.advance)
    status = table.column("status").to_numpy()
    length = job.resolved.max_seq_length
    pieces = split_rows(table, length) if job.resolved.overlong == "split" else table
    packed, pack = pack_table(pieces, length, job.resolved.packing, seed)
    stats = {
        "examples_read": len(ds),
        "kept": int((status == KEPT).sum()),
        "truncated": int((status == TRUNCATED).sum()),
        "split": int((status == SPLIT).sum()),
        **drop_counts(status),
        "template_refusal": first_value(table.column("refused")),
        "no_marker": int(table.column("no_marker").to_numpy(zero_copy_only=False).sum()),
        "styles": shard_styles(table, status),
        "tokens": pack.tokens,
        "trained_tokens": int(np.asarray(pieces.column("trained")).sum()),
        "rows": pack.rows,
        "capacity": pack.capacity,
        **({"task": task} if task is not None else {}),
    }
    final.parent.mkdir(parents=True, exist_ok=True)
    with atomic_folder(final, replace=True) as tmp:
        datasets.Dataset(packed).save_to_disk(str(tmp / "data"))
        write_json_atomic(tmp / STATS, stats)
        (tmp / COMPLETE).write_text("")
    return stats


def _assemble(
    plan: CachePlan,
    shard_stats: dict[str, list[dict[str, Any]]],
    read: dict[str, int],
    resumed: list[int],
    seconds: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Concatenate the shards into a temporary cache folder and rename it into place. The
    tokens/s counts the tokens this build made (not the shards `resumed` reused)."""
    splits = {s: summed(st, read[s]) for s, st in shard_stats.items()}
    tokens = sum(s["tokens"] for s in splits.values()) - resumed[1]
    stats = {
        "fingerprint": plan.fingerprint,
        "format_version": plan.inputs["format_version"],
        "train": splits["train"],
        "eval": splits.get("eval") and {**splits["eval"], **task_rows(shard_stats["eval"])},
        "shards": sum(len(st) for st in shard_stats.values()),
        "resumed_shards": resumed[0],
        "build_seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1) if seconds > 0 and tokens else None,
        **extra,
        "inputs": plan.inputs,
    }
    # replaces an earlier copy (--force; we hold the lock)
    with atomic_folder(plan.final_dir, replace=True) as tmp:
        for split in shard_stats:
            shards = sorted((plan.work_dir / split).glob("shard-*"))
            # a shard of nothing kept (a task whose examples were all dropped) saves a dataset
            # datasets cannot load again (an IndexError): its rows, none, are left out
            shards = [s for s in shards if json.loads((s / STATS).read_text())["rows"]]
            if len(shards) == 1:  # already the split's Arrow folder: move it, not rewrite it
                os.replace(shards[0] / "data", tmp / split)
                continue
            parts = [datasets.load_from_disk(str(s / "data")) for s in shards]
            datasets.concatenate_datasets(parts).save_to_disk(str(tmp / split))
        write_json_atomic(tmp / STATS, stats)
        (tmp / COMPLETE).write_text("")
    shutil.rmtree(plan.work_dir, ignore_errors=True)
    return stats
