"""An expert's earlier token caches: every change of its data, tokenizer or settings leaves a
finished cache beside the new one, kept so that switching back costs nothing. They are
counted for the user and removed only when asked (`pretokenize --prune`)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import weakref
from dataclasses import dataclass
from pathlib import Path

from expert_cli.data.cache import STATS, is_complete
from expert_cli.data.discovery import files_under, size_once

FINGERPRINT_CHARS = 16  # of a cache folder's name: <expert>-<fingerprint[:16]>


@dataclass(frozen=True)
class Earlier:
    """How many finished caches of the expert lie beside its current one, and their bytes."""

    caches: int = 0
    size: int = 0


def earlier_caches(cache_dir: Path, expert: str) -> list[Path]:
    """The other finished caches of `expert` beside `cache_dir`: named as its own are (the
    fingerprint's 16 hex digits end every name, so an expert whose name begins with this
    one's is not taken) and built for it (names that differ only in characters a folder
    name cannot hold, `a+b` and `a_b`, share a folder name)."""
    prefix = cache_dir.name[: -FINGERPRINT_CHARS - 1]
    name = re.compile(re.escape(prefix) + rf"-[0-9a-f]{{{FINGERPRINT_CHARS}}}")
    try:
        return sorted(
            path
            for path in cache_dir.parent.iterdir()
            if path != cache_dir
            and name.fullmatch(path.name)
            and is_complete(path)
            and _built_for(path) == expert
        )
    except OSError:
        return []


def _built_for(folder: Path) -> str | None:
    try:
        return json.loads((folder / STATS).read_bytes())["inputs"]["expert"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Hold:
    """A shared lock on a cache folder, held until closed, collected or the interpreter
    exits (a finalizer, not `__del__`: at exit that ran after `os` was torn down and printed
    an AttributeError under every script that kept a prepared dataset to the end)."""

    def __init__(self, fd: int) -> None:
        self._release = weakref.finalize(self, os.close, fd)

    @property
    def held(self) -> bool:
        return self._release.alive

    def close(self) -> None:
        self._release()


def hold_shared(cache_dir: Path) -> Hold | None:
    """A shared lock on a cache folder a process reads (for as long as the data read from
    it is kept): `prune_earlier` leaves a folder so held. None where the folder cannot be
    opened or locked."""
    try:
        fd = os.open(cache_dir, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return None
    return Hold(fd)


def _claim(folder: Path) -> int | None:
    """An exclusive lock on `folder` (the descriptor holding it), or None where a process
    holds it (hold_shared): a reader that opens it meanwhile waits until it is gone."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def count_earlier(cache_dir: Path, expert: str) -> Earlier:
    folders = earlier_caches(cache_dir, expert)
    return Earlier(len(folders), sum(folder_bytes(f) for f in folders))


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder`, each real file once."""
    return size_once(files_under(folder))


def prune_earlier(cache_dir: Path, expert: str) -> Earlier:
    """Remove the other finished caches of `expert` beside `cache_dir` (the caller holds the
    folder's lock, so none is being built), but those a process reads (hold_shared); returns
    what went. Each is first renamed to a temporary name the next build sweeps
    (`.tmp-<name>-<pid>`): one whose removal is cut short is never read."""
    removed = Earlier()
    for folder in earlier_caches(cache_dir, expert):
        if (fd := _claim(folder)) is None:
            continue
        try:
            size = folder_bytes(folder)
            doomed = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
            os.replace(folder, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        except OSError:
            continue
        finally:
            os.close(fd)
        removed = Earlier(removed.caches + 1, removed.size + size)
    return removed
