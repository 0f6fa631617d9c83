"""find-datasets: list the datasets in the Hugging Face caches (the `datasets` library's
Arrow cache and the hub's snapshot cache), and which expert manifests use or still need them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from expert_cli.config.loading import load_dataset_block
from expert_cli.config.refs import is_local, split_hub_spec
from expert_cli.errors import UserError
from expert_cli.paths import not_a_folder, shown_path

HUB_PREFIX = "datasets--"
DATASETS_SKIP = {"downloads"}  # folders of the datasets cache that are not datasets
HUB_REPO_PREFIXES = ("datasets--", "models--", "spaces--")  # hub layout, not datasets layout
CACHE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE")


def default_roots() -> dict[str, Path]:
    """Cache folders from HF_DATASETS_CACHE / HF_HUB_CACHE / HF_HOME, as the HF libraries do."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    home = Path(os.environ.get("HF_HOME", xdg / "huggingface"))
    return {
        "datasets": Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets")),
        "hub": Path(os.environ.get("HF_HUB_CACHE", home / "hub")),
    }


def cache_roots(cache_dir: Path | None) -> dict[str, Path]:
    """Which folders to scan. A --cache-dir with hub/ or datasets/ inside is an HF_HOME;
    any other --cache-dir is scanned for both layouts."""
    if cache_dir is None:
        for name in CACHE_VARIABLES:  # a file there scanned as an empty cache, exit 0
            value = os.environ.get(name)
            if value and os.path.lexists(value) and not _is_dir(Path(value)):
                raise UserError(
                    f"{name}: {shown_path(value)} is not a folder; expected the Hugging Face "
                    f"cache folder (or leave {name} unset)"
                )
        return default_roots()
    _require_folder(cache_dir, "--cache-dir")
    if cache_dir.name.startswith(HUB_REPO_PREFIXES):  # its blobs/ and snapshots/ list nothing
        raise UserError(
            f"--cache-dir {shown_path(cache_dir)}: one repository's folder of the hub cache; "
            f"give the cache folder that holds it ({shown_path(cache_dir.absolute().parent)})"
        )
    if _is_dir(cache_dir / "hub") or _is_dir(cache_dir / "datasets"):
        return {"datasets": cache_dir / "datasets", "hub": cache_dir / "hub"}
    return {"datasets": cache_dir, "hub": cache_dir}


def _require_folder(path: Path, label: str) -> None:
    if _is_dir(path):
        return
    raise UserError(f"{label}: {path} {not_a_folder(path)}; expected a folder")


def _is_dir(path: Path) -> bool:
    """`path.is_dir()`, False where it cannot be looked at (no permission, /proc's links)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def files_under(folder: Path) -> list[Path]:
    """The files under `folder` (links to files included); folders that cannot be read are
    passed over."""
    found = []
    for parent, _, names in os.walk(folder):
        for name in names:
            path = Path(parent) / name
            try:
                if path.is_file():
                    found.append(path)
            except OSError:
                continue
    return found


def size_once(paths: list[Path]) -> int:
    """Total size of files, each real file (symlink target) counted once; a file that
    vanishes or cannot be looked at while counting counts 0."""
    total = 0
    for real in {os.path.realpath(p) for p in paths}:
        try:
            total += os.path.getsize(real)
        except OSError:
            continue
    return total


def scan_datasets_cache(root: Path) -> list[dict[str, Any]]:
    """Entries of the `datasets` Arrow cache: <owner>___<name>/<config>/<version>/<hash>/."""
    entries = []
    if not _is_dir(root):
        return entries
    for hash_dir in _version_folders(root):
        name_dir = hash_dir.parents[2]
        if not _holds_dataset(hash_dir):
            continue
        files = files_under(hash_dir)
        entries.append(
            {
                "name": name_dir.name.replace("___", "/"),
                "config": hash_dir.parents[1].name,
                "revision": f"{hash_dir.parent.name}/{hash_dir.name}",
                "size_bytes": size_once(files),
                "path": str(hash_dir),
                "layout": "datasets",
            }
        )
    return entries


def scan_hub_cache(root: Path, empty: list[str]) -> list[dict[str, Any]]:
    """Entries of the hub cache: datasets--<owner>--<name>/ with blobs/, snapshots/, refs/.
    A folder whose snapshots hold no byte (a download stopped before one, a folder made by
    hand), or whose refs/main names no snapshot it holds, is no dataset a run can read: its
    path goes to `empty` instead."""
    entries = []
    if not _is_dir(root):
        return entries
    for repo in _subfolders(root):
        if not repo.name.startswith(HUB_PREFIX):
            continue
        if not _repo_folder(repo.name.removeprefix(HUB_PREFIX)):
            continue  # no folder the hub library makes (`datasets--`, a--b--c): not its
        held = files_under(repo / "snapshots")
        if size_once(held) == 0:
            empty.append(str(repo))
            continue
        snapshots = [p.name for p in _subfolders(repo / "snapshots")]
        main = _ref(repo / "refs" / "main")
        if (repo / "refs" / "main").exists() and main not in snapshots:
            empty.append(str(repo))  # main names no snapshot here: check finds none to read
            continue
        revision = main or ",".join(snapshots) or None
        files = files_under(repo / "blobs") + held
        entries.append(
            {
                "name": repo.name.removeprefix(HUB_PREFIX).replace("--", "/"),
                "config": None,
                "revision": revision,
                "size_bytes": size_once(files),
                "path": str(repo),
                "layout": "hub",
            }
        )
    return entries


# a hub id's part: letters, digits, '-', '_', '.', no '..' in it (the hub's rule; '--' parts
# the folder's name)
REPO_PART = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def _repo_folder(name: str) -> bool:
    """Whether `name` (a hub cache folder's, its `datasets--` left out) is one the hub library
    makes for a repository: `owner--name`, or `name` alone."""
    parts = name.split("--")
    return 1 <= len(parts) <= 2 and all(REPO_PART.fullmatch(part) for part in parts)


def _subfolders(folder: Path) -> list[Path]:
    """The folders in `folder` (not through links), sorted; none where it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _version_folders(root: Path) -> list[Path]:
    """<name>/<config>/<version>/<hash> folders of a datasets cache."""
    found = []
    for name_dir in _subfolders(root):
        if name_dir.name in DATASETS_SKIP or name_dir.name.startswith(HUB_REPO_PREFIXES):
            continue
        for config in _subfolders(name_dir):
            for version in _subfolders(config):
                found += _subfolders(version)
    return found


def _holds_dataset(folder: Path) -> bool:
    """A datasets-cache version folder: its dataset_info.json or an .arrow file directly in
    it (checked before its tree is walked, so a folder that is no cache costs one listing)."""
    try:
        with os.scandir(folder) as entries:
            return any(e.name == "dataset_info.json" or e.name.endswith(".arrow") for e in entries)
    except OSError:
        return False


def _ref(path: Path) -> str | None:
    """The revision a hub ref file names (a commit hash), or None for a missing file or one
    that holds anything else (a short single printable word is all a ref is)."""
    try:
        with path.open("rb") as f:
            text = f.read(100).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if 0 < len(text) <= 64 and text.isprintable() and " " not in text else None


def parse_dataset_ref(ref: str, manifest_dir: Path) -> dict[str, Any]:
    """Split `name::split::config` and tell a local file from a hub dataset id."""
    name, split, config = split_hub_spec(ref)
    kind = "local" if is_local(manifest_dir, name) else "hub"
    return {"id": name, "split": split, "config": config, "kind": kind}


def manifest_refs(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The datasets one manifest names: training.dataset.path and validation_path, and each
    task's train and valid."""
    try:
        name, dataset = load_dataset_block(path)
    except UserError as exc:
        detail = "; ".join(line.removeprefix(f"{path}").lstrip(":").strip() for line in exc.lines)
        return {}, [f"{path}: cannot read manifest ({detail})"]
    found = []
    if dataset.path:
        found.append(("training.dataset.path", dataset.path))
    if dataset.validation_path:
        found.append(("training.dataset.validation_path", dataset.validation_path))
    for task, spec in (dataset.tasks or {}).items():
        found.append((f"training.dataset.tasks.{task}.train", spec.train))
        if spec.valid:
            found.append((f"training.dataset.tasks.{task}.valid", spec.valid))
    refs = [dict(parse_dataset_ref(ref, path.parent), field=f) for f, ref in found]
    return {"manifest": str(path), "expert": name, "datasets": refs}, []


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _match_manifests(entries: list[dict[str, Any]], manifests: list[dict[str, Any]]) -> list:
    """Mark cached/used_by in place; return the hub datasets manifests need but lack."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        entry["used_by"] = []
        by_name.setdefault(entry["name"].lower(), []).append(entry)
    missing: dict[str, list[str]] = {}
    for m in manifests:
        for ref in m["datasets"]:
            if ref["kind"] != "hub":
                ref["cached"] = None
                continue
            hits = by_name.get(ref["id"].lower(), [])
            ref["cached"] = bool(hits)
            for entry in hits:
                if m["manifest"] not in entry["used_by"]:
                    entry["used_by"].append(m["manifest"])
            if not hits:
                missing.setdefault(ref["id"], [])
                if m["manifest"] not in missing[ref["id"]]:
                    missing[ref["id"]].append(m["manifest"])
    return [{"id": k, "needed_by": v} for k, v in sorted(missing.items())]


def discover(cache_dir: Path | None, experts: Path | None) -> dict[str, Any]:
    """Cached datasets (largest first), manifests' datasets, and hub datasets not cached."""
    roots = cache_roots(cache_dir)
    if experts is not None:
        _require_folder(experts, "--experts")
    empty: list[str] = []
    entries = scan_datasets_cache(roots["datasets"]) + scan_hub_cache(roots["hub"], empty)
    entries.sort(key=lambda e: (-e["size_bytes"], e["name"], e["config"] or ""))
    for entry in entries:
        entry["size"] = human_size(entry["size_bytes"])
    manifests, problems = [], []
    for path in sorted(experts.rglob("manifest.json")) if experts is not None else []:
        found, errors = manifest_refs(path)
        problems += errors
        if found:
            manifests.append(found)
    missing = _match_manifests(entries, manifests)
    return {
        "cache_roots": {k: str(v) for k, v in roots.items()},
        "datasets": entries,
        "manifests": manifests,
        "missing": missing,
        "problems": problems,
        "empty": empty,
        "absent": [str(r) for r in dict.fromkeys(roots.values()) if not _is_dir(r)],
    }
