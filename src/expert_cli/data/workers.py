"""Formatting and tokenizing one shard's examples, in this process or in worker processes.

With one process the examples go through the formatter in batches of BATCH_SIZE and the fast
tokenizer's Rust threads use the cores. With several, each worker tokenizes with one thread, and
the examples are dealt out longest first in tasks that shrink with the work left (guided
scheduling), so the workers finish at about the same time: one contiguous part per worker (what
`datasets.map(num_proc=N)` does) left a core idle while the slower part finished. Forked
workers inherit the formatter and the rows; under another start method both are pickled once
per worker. Each task's table comes back with its example indices and the tables are put back
in source order, so the output is the same for any number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from expert_cli.data.formatting import CUT_CHARS_PER_TOKEN
from expert_cli.deadline import TEMPLATE_LOOPS, TEMPLATE_SECONDS, TimedOut, deadline
from expert_cli.errors import UserError

if TYPE_CHECKING:
    import datasets

    from expert_cli.data.formatting import Formatter

BATCH_SIZE = 1000  # examples per tokenizer call (and the most in one worker task)
TASK_SHARE = 2  # each task takes 1 / (TASK_SHARE * procs) of the work left ...
MIN_TASK_SHARE = 1 / 256  # ... but no less than this share of the whole shard
# The formatter and rows of the shard being tokenized, inherited by forked workers.
_WORK: dict[str, Any] = {}


def tokenize_rows(
    ds: datasets.Dataset, formatter: Formatter, procs: int, advance: Callable[[int], None]
) -> pa.Table:
    """The formatter's table for every row of `ds`, in order; `advance(n)` as rows finish."""

    if procs <= 1:
        parts = []
        for lo in range(0, len(ds), BATCH_SIZE):
            parts.append(bounded_format(formatter, ds[lo : lo + BATCH_SIZE]))
            advance(min(BATCH_SIZE, len(ds) - lo))
        return pa.concat_tables(parts)
    return _in_workers(ds, formatter, procs, advance)


def _in_workers(
    ds: datasets.Dataset, formatter: Formatter, procs: int, advance: Callable[[int], None]
) -> pa.Table:

    ctx = multiprocessing.get_context()
    inherit = ctx.get_start_method() == "fork"
    _WORK.update(formatter=formatter, ds=ds)
    results = []
    try:
        with ctx.Pool(
            procs, initializer=_start_worker, initargs=() if inherit else (formatter, ds)
        ) as pool:
            for index, table in pool.imap_unordered(
                _format_task, plan_tasks(row_costs(ds), procs), chunksize=1
            ):
                results.append((index, table))
                advance(len(index))
    finally:
        _WORK.clear()
    order = np.concatenate([index for index, _ in results])
    table = pa.concat_tables([table for _, table in results])
    return table.take(pa.array(np.argsort(order)))


def _start_worker(*work: Any) -> None:
    """Worker set-up: one Rust thread (the processes are the cores); the work when not forked;
    SIGTERM (the pool's way to stop its workers) ends the worker, whatever the parent set."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if work:
        _WORK.update(formatter=work[0], ds=work[1])


def _format_task(index: np.ndarray) -> tuple[np.ndarray, pa.Table]:
    return index, bounded_format(_WORK["formatter"], _WORK["ds"][index.tolist()])


ROW_SECONDS = 0.05  # a batch's bound per row: a chat template renders one in about 1 ms
# and per character of its text: the build tokenizes about 2 MB a second on one core (14 MB
# of 700 KB documents split into pieces in 6 s), so 10 us a character is 20 times that; a
# bound of rows alone stopped a batch of long documents as a template that loops
CHAR_SECONDS = 1e-5


def bounded_format(formatter: Formatter, batch: dict[str, list[Any]]) -> pa.Table:
    """The formatter's table for `batch`, within max(TEMPLATE_SECONDS, ROW_SECONDS a row,
    CHAR_SECONDS a character of its text): a chat template that loops without end for some
    conversations (three turns and more, say: the load's check renders one of two) held the
    build for ever; UserError naming it."""
    rows = len(next(iter(batch.values()), []))
    # a text past the cut is tokenized from its start only, unless every token is kept
    cut = None if formatter.overlong == "split" else formatter.max_seq_length * CUT_CHARS_PER_TOKEN
    seconds = max(TEMPLATE_SECONDS, ROW_SECONDS * rows, CHAR_SECONDS * _characters(batch, cut))
    try:
        with deadline(seconds):
            return formatter(batch)
    except TimedOut:  # a render's own bound, or the batch's
        if formatter.renders == "messages":
            raise UserError(TEMPLATE_LOOPS) from None
        raise UserError(  # no template renders these rows: the tokenizer itself was slow
            f"tokenizing {rows} examples took over {seconds:.0f} s, far past the usual "
            "(about 2 MB of text a second); is the tokenizer a slow one, or the machine "
            "overloaded?"
        ) from None


def _characters(value: Any, cut: int | None) -> int:
    """The characters of the text in `value` (a batch's columns: strings in lists and dicts,
    at any depth, walked without recursion), each string's counted up to `cut`."""
    count, left = 0, [value]
    while left:
        item = left.pop()
        if isinstance(item, str):
            count += len(item) if cut is None else min(len(item), cut)
        elif isinstance(item, dict):
            left.extend(item.values())
        elif isinstance(item, (list, tuple)):
            left.extend(item)
    return count


def row_costs(ds: datasets.Dataset) -> np.ndarray:
    """Estimated tokenizing work per row: the UTF-8 bytes of its text (messages included)."""

    table = ds.with_format("arrow")[:]
    costs = np.ones(len(table), dtype=np.int64)
    for column in table.itercolumns():
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        costs += _text_bytes(column, len(table))
    return costs


def _text_bytes(column: pa.Array, n: int) -> np.ndarray:
    """Bytes of the strings of one column per row (strings in lists/structs summed per row)."""

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    if pa.types.is_struct(kind):
        return sum(
            (_text_bytes(column.field(i), n) for i in range(kind.num_fields)),
            np.zeros(n, dtype=np.int64),
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        parents = pc.list_parent_indices(column).to_numpy()
        inner = _text_bytes(column.flatten(), len(parents))
        return np.bincount(parents, weights=inner, minlength=n).astype(np.int64)
    return np.zeros(n, dtype=np.int64)


def plan_tasks(costs: np.ndarray, procs: int) -> list[np.ndarray]:
    """Row indices of each task: longest rows first, tasks shrinking with the work left."""

    order = np.argsort(-costs, kind="stable")
    done = np.cumsum(costs[order])
    total = int(done[-1]) if len(done) else 0
    tasks, start = [], 0
    while start < len(order):
        before = int(done[start - 1]) if start else 0
        share = max((total - before) / (TASK_SHARE * procs), total * MIN_TASK_SHARE)
        stop = int(np.searchsorted(done, before + share, side="left")) + 1
        stop = min(len(order), max(stop, start + 1), start + BATCH_SIZE)
        tasks.append(order[start:stop])
        start = stop
    return tasks
