"""What changed in a token cache's inputs since the expert's last build, as the lines a build
shows (`max_seq_length 512 -> 1024`): hashes by their first digits, long text cut, control
characters escaped."""

from __future__ import annotations

import re
from typing import Any

from expert_cli.errors import escaped

SHOWN_VALUE_CHARS = 40


def changed_inputs(old: dict[str, Any], new: dict[str, Any], recorded: bool = False) -> list[str]:
    """`key old -> new` for each leaf that differs between two fingerprint input dicts; with
    `recorded`, only leaves `old` has (what a newer version records besides is no change)."""
    a, b = _flatten(old), _flatten(new)
    lines = []
    for key in sorted(set(a) if recorded else set(a) | set(b)):
        if a.get(key) != b.get(key):
            lines.append(f"{key} {_short(a.get(key, '(none)'))} -> {_short(b.get(key, '(none)'))}")
    return lines


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _short(value: Any) -> str:
    """A value as a change shows it: a hash by its first 12 digits, text by its first 40
    characters (a path, a custom prompt template), control characters escaped."""
    text = escaped(str(value))
    if len(text) > 16 and re.fullmatch(r"[0-9a-f]+", text):
        return text[:12] + "…"
    return text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS] + "…"
