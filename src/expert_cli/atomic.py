"""Writing so that readers never see half of it: everything is built under a temporary name
beside its destination, then renamed into place in one step. A leaf module: the data path,
training outputs, telemetry and the benchmark all write through it.

The temporary name is `.tmp-<name>-<pid>`, so leftovers of a killed writer are easy to find.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


def temporary_path(dest: Path) -> Path:
    """Where `dest` is built before it is renamed into place."""
    return dest.with_name(f".tmp-{dest.name}-{os.getpid()}")


@contextmanager
def atomic_file(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; it becomes `dest` when the block ends, and is
    removed if the block fails."""
    tmp = temporary_path(dest)
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        with suppress(OSError):  # a read-only disk answers EROFS, not "no such file"
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_folder(dest: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside `dest`; when the block ends it replaces `dest`
    (the caller decides beforehand whether an existing `dest` may be replaced), and it is
    removed if the block fails."""
    tmp = temporary_path(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as indented JSON to `path`, all or nothing; a float that is not finite
    (a diverged loss) is written as null, as JSON has no NaN or infinity."""
    with atomic_file(path) as tmp:
        text = json.dumps(json_numbers(data), indent=2, default=str, allow_nan=False)
        tmp.write_text(text + "\n", encoding="utf-8")


def json_numbers(data: Any) -> Any:
    """`data` with every float that is not finite replaced by None, in dicts, lists, tuples."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: json_numbers(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_numbers(value) for value in data]
    return data
