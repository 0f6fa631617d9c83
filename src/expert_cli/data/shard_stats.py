"""A token cache's counts: each shard's, from its formatting status codes, and a split's
summed from its shards (stats.json)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from expert_cli.data.formatting import (
    DROPPED_ANSWER_CUT,
    DROPPED_NO_COMPLETION,
    DROPPED_NO_MARKER,
    DROPPED_OVERLONG,
    DROPPED_TEMPLATE,
    KEPT_CODES,
)


def shard_styles(table: Any, status: Any) -> dict[str, int]:
    """How many of the shard's kept examples each masking rule found (formatting.py)."""
    kept = pa.array(np.isin(status, KEPT_CODES))
    counts = pc.value_counts(table.column("style").filter(kept)).to_pylist()
    return dict(sorted((c["values"], c["counts"]) for c in counts))


def first_value(column: Any) -> str | None:
    """The first non-null value of a string column."""
    valid = column.drop_null()
    return str(valid[0]) if len(valid) else None


# each drop's status code and its key in the stats
DROP_CODES = {
    DROPPED_OVERLONG: "dropped_overlong",
    DROPPED_NO_COMPLETION: "dropped_no_completion",
    DROPPED_NO_MARKER: "dropped_no_marker",
    DROPPED_TEMPLATE: "dropped_template",
    DROPPED_ANSWER_CUT: "dropped_answer_cut",
}
DROP_KEYS = tuple(DROP_CODES.values())


def drop_counts(status: np.ndarray) -> dict[str, int]:
    """How many examples of each drop reason `status` (formatting's codes) holds."""
    return {key: int((status == code).sum()) for code, key in DROP_CODES.items()}


def summed(stats: list[dict[str, Any]], examples_read: int) -> dict[str, Any]:
    keys = ("kept", "truncated", "split", *DROP_KEYS)
    keys += ("no_marker", "tokens", "trained_tokens", "rows")
    # .get: shards finished by an earlier version have no dropped_template
    total = {k: sum(s.get(k, 0) for s in stats) for k in (*keys, "capacity")}
    total["template_refusal"] = next(
        (s["template_refusal"] for s in stats if s.get("template_refusal")), None
    )
    styles: Counter[str] = Counter()
    for shard in stats:  # shards finished by an earlier version have none
        styles.update(shard.get("styles") or {})
    total["styles"] = dict(sorted(styles.items()))
    total["examples"] = sum(s["examples_read"] for s in stats)
    total["examples_read"] = examples_read
    total["dropped"] = sum(total[k] for k in DROP_KEYS)
    total["packing_efficiency"] = (
        round(total["tokens"] / total["capacity"], 6) if total["capacity"] else 0.0
    )
    return total


def task_rows(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """`tasks`: each task's packed rows of the evaluation split in its order, with their
    tokens, trained tokens and examples, from shards that each hold one task's (build.py);
    none where a shard names none. (Evaluated apart where they are two or more.)"""
    tasks: list[dict[str, Any]] = []
    for shard in stats:
        if not isinstance(shard.get("task"), str):
            return {}
        if not tasks or tasks[-1]["task"] != shard["task"]:
            tasks.append({"task": shard["task"], "rows": 0, "tokens": 0, "trained_tokens": 0})
            tasks[-1]["examples"] = 0
        for key in ("rows", "tokens", "trained_tokens", *DROP_KEYS):
            tasks[-1][key] = tasks[-1].get(key, 0) + shard.get(key, 0)
        tasks[-1]["examples"] += shard["examples_read"] - sum(shard.get(k, 0) for k in DROP_KEYS)
    emptied = [t for t in tasks if not t["rows"]]  # its examples all dropped, and why
    tasks = [{k: v for k, v in t.items() if k not in DROP_KEYS} for t in tasks if t["rows"]]
    found = {"tasks": tasks} if tasks else {}  # one alone: its loss is the split's
    return {**found, "emptied_tasks": emptied} if emptied else found
