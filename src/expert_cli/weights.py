"""Whether a safetensors file is whole, from its header alone (milliseconds, whatever its size).
A leaf module: `check` looks at a base model's weights with it, resume at a checkpoint's,
`package` and `check --package` at the adapter's. And whether an adapter's numbers are numbers
(`non_finite_tensors`, which reads the whole file: for adapters, not base models).

A safetensors file is an 8-byte header length, a JSON header giving each tensor's byte range,
then the tensors. A file cut short (an interrupted download or copy, a full disk) has a header
whose last range ends past the file's end; loading it was a traceback from inside the loader.
"""

from __future__ import annotations

import json
from pathlib import Path

DAMAGED = "is damaged (its header does not match its size)"
HEADER_LIMIT = 100_000_000  # the loader's own bound on a header
HEAD_BYTES = 1 << 20  # what a reader of a stream keeps to judge it: any adapter's header fits


def header_problem(head: bytes, size: int) -> str | None:
    """DAMAGED when the header at the start of `head` (a file's first bytes) does not end its
    last tensor at the file's `size`; None when it does, or when `head` is too short to hold
    the whole header (a model with more tensors than fit HEAD_BYTES: not judged)."""
    length = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if length < 0 or length > HEADER_LIMIT or 8 + length > size:
        return DAMAGED
    if len(head) < 8 + length:
        return None
    try:
        header = json.loads(head[8 : 8 + length])
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return DAMAGED
    return None if 8 + length + max(ends, default=0) == size else DAMAGED


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at `path` cannot be loaded (`<name> is damaged ...`), or None."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            start = f.read(8)
            length = int.from_bytes(start, "little") if len(start) == 8 else 0
            fits = length <= HEADER_LIMIT and 8 + length <= size  # else judged on `start`
            head = start + f.read(length if fits else 0)
    except OSError:
        return f"{path.name} cannot be read"
    problem = header_problem(head, size)
    return f"{path.name} {problem}" if problem else None


def damaged_weights(folder: Path) -> list[str]:
    """A line per damaged `*.safetensors` file directly in `folder` (a model's shards)."""
    return [p for f in sorted(folder.glob("*.safetensors")) if (p := safetensors_problem(f))]


def weights_error(model: str, damaged: list[str]) -> str:
    """The error for a base model whose weight files are damaged."""
    return f"base model {model}: {'; '.join(damaged)}; download or copy it again"


def non_finite_tensors(file: Path | bytes) -> list[str] | None:
    """Names of the floating-point tensors of a safetensors file (a path, or the file's bytes)
    that hold NaN or infinity ([] when none do); None when it cannot be read as safetensors
    (said by `safetensors_problem` / `header_problem`)."""
    from safetensors.torch import load, load_file

    try:
        tensors = load(file) if isinstance(file, bytes) else load_file(str(file))
    except Exception:  # noqa: BLE001 - damaged, or not safetensors at all
        return None
    return sorted(
        name
        for name, tensor in tensors.items()
        if tensor.is_floating_point() and not bool(tensor.isfinite().all())
    )


def non_finite_line(bad: list[str], shown: int = 3) -> str:
    """`N tensor(s) ... NaN or infinity (names)` for the names `non_finite_tensors` found."""
    more = f" and {len(bad) - shown} more" if len(bad) > shown else ""
    verb = "hold" if len(bad) > 1 else "holds"
    plural = "s" if len(bad) > 1 else ""
    return f"{len(bad)} tensor{plural} {verb} NaN or infinity ({', '.join(bad[:shown])}{more})"
