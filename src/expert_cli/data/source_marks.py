"""What identifies the data a token cache is built from, file by file: a local file's size and
content hash, a cached hub snapshot's files by the blobs they link to (the hub's own content
hashes). The cache's fingerprint and a resumed run's data check both compare these."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xxhash

from expert_cli.config.resolve import SourceRef
from expert_cli.data.hub import dataset_snapshot
from expert_cli.data.rows import source_files

FULL_HASH_LIMIT = 256 * 2**20  # a larger file is known by its edges, size and mtime
EDGE_BYTES = 2**20


def file_hash(path: Path) -> dict[str, Any]:
    """Size and content hash of a file (whole file when small; edges and mtime when large)."""

    stat = path.stat()
    digest = xxhash.xxh3_128()
    with path.open("rb") as fh:
        if stat.st_size <= FULL_HASH_LIMIT:
            for block in iter(lambda: fh.read(8 * 2**20), b""):
                digest.update(block)
            return {"size": stat.st_size, "xxh3": digest.hexdigest()}
        digest.update(fh.read(EDGE_BYTES))
        fh.seek(-EDGE_BYTES, os.SEEK_END)
        digest.update(fh.read(EDGE_BYTES))
    return {"size": stat.st_size, "xxh3_edges": digest.hexdigest(), "mtime_ns": stat.st_mtime_ns}


def source_inputs(ref: SourceRef, folder: Path) -> dict[str, Any]:
    """What identifies a source's data as the cache's fingerprint records it: a local one's
    files by their names relative to the manifest's `folder`, with sizes and hashes; a hub
    one's revision, and the files of the cached snapshot it is read from."""
    entry = ref.model_dump(exclude_none=True, exclude={"field"})  # where it is named: no input
    if ref.kind == "local":
        files = {}
        for f in source_files(ref):
            name = str(f.relative_to(folder)) if f.is_relative_to(folder) else str(f)
            files[name] = file_hash(f)
        entry["location"] = (
            str(Path(ref.location).relative_to(folder))
            if Path(ref.location).is_relative_to(folder)
            else ref.location
        )
        entry["files"] = files
        return entry
    if not ref.revision:
        entry["revision"] = "unpinned (set training.dataset.revision to detect hub updates)"
    if (snapshot := dataset_snapshot(ref.location, ref.revision)) is not None:
        # read from this cached snapshot (sources.load_hub): a download since, or a file of it
        # cut short, is another input (an unpinned one was taken for the same data)
        entry["snapshot"] = snapshot.name
        entry["files"] = _snapshot_files(snapshot)
    return entry


def _snapshot_files(snapshot: Path) -> dict[str, Any]:
    """Each file of a cached hub snapshot: the name of the blob it links to (the hub's hash
    of its content) and its size; one that is no link (a cache made without links) by its
    own hash."""
    files: dict[str, Any] = {}
    for path in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        name = path.relative_to(snapshot).as_posix()
        if path.is_symlink():
            files[name] = {"blob": Path(os.readlink(path)).name, "size": path.stat().st_size}
        else:
            files[name] = file_hash(path)
    return files
