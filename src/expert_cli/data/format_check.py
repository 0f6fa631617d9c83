"""`check` formats the examples of small data as the build will, so a split the build would
leave empty (every evaluation example over `max_seq_length` with its answer cut away, every
training one dropped with `overlong: drop`) is exit 2 at `check`, in the build's words, not
after tokenizing in `train`.

Only the rows of sources of at most KEEP_ROWS rows and KEEP_CHARS characters are kept while
`check` reads them; the examples `eval_fraction` holds out, and those a task's weight trains,
are picked as the build picks them (data/splits.py). A split with a larger source is not
formatted: its examples are too many for every one to be dropped by length unnoticed, and
formatting them would cost what tokenizing does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.build import nothing_left
from expert_cli.data.conversations import conversation_text
from expert_cli.data.fields import TOOLS
from expert_cli.data.formatting import KEPT_CODES, Formatter
from expert_cli.data.layouts import conversation_row
from expert_cli.data.shard_stats import drop_counts
from expert_cli.data.splits import held_rows, weighted_rows
from expert_cli.data.stats_words import drop_reasons
from expert_cli.data.tools import parsed_tools, tools_text
from expert_cli.data.workers import bounded_format
from expert_cli.deadline import TEMPLATE_LOOPS
from expert_cli.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

KEEP_ROWS = 4096  # rows of a source `check` keeps to format
KEEP_CHARS = 16 << 20  # and characters of text: formatting costs what tokenizing does
FORMAT_BATCH = 64  # examples formatted at a time, until one is kept


def small_splits(
    resolved: ResolvedConfig, kept: list[tuple[bool, list[dict[str, Any]] | None]]
) -> dict[bool, list[dict[str, Any]]]:
    """The examples of each split (True: training) the build will format, where every source
    of the split was kept whole (`kept`: per source in the manifest's order, training ones
    first, whether it is a training one and its rows or None): the held-out ones picked and
    a task's weight applied as the build does. None under `overlong: split`, which drops
    nothing for its length."""
    if resolved.overlong == "split":
        return {}
    train = [rows for is_train, rows in kept if is_train]
    valid = [rows for is_train, rows in kept if not is_train]
    out: dict[bool, list[dict[str, Any]]] = {}
    if resolved.validation_sources and None not in valid:
        out[False] = [row for rows in valid if rows is not None for row in rows]
    if None in train or len(train) != len(resolved.train_sources):
        return out
    trained: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for i, (rows, ref) in enumerate(zip(train, resolved.train_sources, strict=True)):
        assert rows is not None
        out_of = set()
        if not resolved.validation_sources:
            out_of = set(held_rows(len(rows), resolved.eval_fraction, resolved.eval_seed + i))
            held += [rows[j] for j in sorted(out_of)]
        rest = [row for j, row in enumerate(rows) if j not in out_of]
        if rest:
            trained += [rest[j] for j in weighted_rows(len(rest), ref.weight, resolved.seed + i)]
    out[True] = trained
    if held:
        out[False] = held
    return out


def formatted_problems(
    resolved: ResolvedConfig,
    tokenizer: PreTrainedTokenizerFast,
    kind: str,
    splits: dict[bool, list[dict[str, Any]]],
) -> list[str]:
    """The build's line for each split of `splits` whose every example it drops."""
    formatter = Formatter(
        tokenizer=tokenizer,
        kind=kind,
        max_seq_length=resolved.max_seq_length,
        overlong=resolved.overlong,
        prompt_template=resolved.prompt_template,
        response_template=resolved.response_template,
    )
    problems = []
    for train, rows in splits.items():
        statuses, refusals = [], []
        for lo in range(0, len(rows), FORMAT_BATCH):  # until an example is kept
            batch = [  # instruction data beside conversations, as the build reads it
                conversation_row(row) if kind == "messages" and "instruction" in row else row
                for row in rows[lo : lo + FORMAT_BATCH]
            ]
            roles = sorted({role for row in batch for role in row})
            try:
                columns = {r: [_stored(r, row.get(r)) for row in batch] for r in roles}
                table = bounded_format(formatter, columns)
            except UserError as exc:  # a template that cannot render: said by check's lines,
                if TEMPLATE_LOOPS in exc.lines:  # but for one that runs without end
                    raise
                return []
            statuses.append(np.asarray(table.column("status")))
            refusals += table.column("refused").drop_null().to_pylist()
            if np.isin(statuses[-1], KEPT_CODES).any():
                break
        else:
            if rows:
                status = np.concatenate(statuses)
                stats: dict[str, Any] = drop_counts(status)
                stats["template_refusal"] = refusals[0] if refusals else None
                why = drop_reasons(stats, resolved.max_seq_length)
                problems.append(nothing_left(resolved, train, len(rows), why))
    return problems


def _stored(role: str, value: Any) -> Any:
    """A row's value as the build's Arrow file holds it: a conversation and its tools as
    their JSON text."""
    if role == TOOLS:
        return tools_text(parsed_tools(value)[0])
    return conversation_text(value) if role == "messages" and value is not None else value


def row_chars(row: dict[str, Any]) -> int:
    """About how many characters of text a checked row holds (its conversation's contents)."""
    total = 0
    for value in row.values():
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, list):  # a conversation's contents, or its tools
            total += sum(len(str(m.get("content") or m)) for m in value if isinstance(m, dict))
    return total
