"""An expert's earlier token caches: every change of its data, tokenizer or settings leaves a
finished cache beside the new one, kept so that switching back costs nothing. They are
counted for the user and removed only when asked (`pretokenize --prune`)."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from expert_cli.data.cache import is_complete

FINGERPRINT_CHARS = 16  # of a cache folder's name: <expert>-<fingerprint[:16]>


@dataclass(frozen=True)
class Earlier:
    """How many finished caches of the expert lie beside its current one, and their bytes."""

    caches: int = 0
    size: int = 0


def earlier_caches(cache_dir: Path) -> list[Path]:
    """The other finished caches of `cache_dir`'s expert in its folder (another expert whose
    name begins with this one's is not taken: the fingerprint's 16 hex digits end every
    name)."""
    prefix = cache_dir.name[: -FINGERPRINT_CHARS - 1]
    name = re.compile(re.escape(prefix) + rf"-[0-9a-f]{{{FINGERPRINT_CHARS}}}")
    try:
        return sorted(
            path
            for path in cache_dir.parent.iterdir()
            if path != cache_dir and name.fullmatch(path.name) and is_complete(path)
        )
    except OSError:
        return []


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder` (those that cannot be read count nothing)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def count_earlier(cache_dir: Path) -> Earlier:
    folders = earlier_caches(cache_dir)
    return Earlier(len(folders), sum(folder_bytes(f) for f in folders))


def prune_earlier(cache_dir: Path) -> Earlier:
    """Remove the other finished caches of `cache_dir`'s expert (the caller holds the
    folder's lock, so none is being built); returns what went. Each is first renamed to a
    temporary name the next build sweeps (`.tmp-<name>-<pid>`): one whose removal is cut
    short is never read."""
    removed = Earlier()
    for folder in earlier_caches(cache_dir):
        size = folder_bytes(folder)
        doomed = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
        try:
            os.replace(folder, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed = Earlier(removed.caches + 1, removed.size + size)
    return removed
