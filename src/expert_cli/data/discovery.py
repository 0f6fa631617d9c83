"""find-datasets: list the datasets in the Hugging Face caches (the `datasets` library's
Arrow cache and the hub's snapshot cache), and which expert manifests use or still need them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from expert_cli.config.loading import load_dataset_block
from expert_cli.config.refs import is_local, split_hub_spec
from expert_cli.errors import UserError

HUB_PREFIX = "datasets--"
DATASETS_SKIP = {"downloads"}  # folders of the datasets cache that are not datasets
HUB_REPO_PREFIXES = ("datasets--", "models--", "spaces--")  # hub layout, not datasets layout


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
        return default_roots()
    if not cache_dir.is_dir():
        raise UserError(f"--cache-dir: folder {cache_dir} does not exist")
    if (cache_dir / "hub").is_dir() or (cache_dir / "datasets").is_dir():
        return {"datasets": cache_dir / "datasets", "hub": cache_dir / "hub"}
    return {"datasets": cache_dir, "hub": cache_dir}


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def size_once(paths: list[Path]) -> int:
    """Total size of files, each real file (symlink target) counted once."""
    real = {os.path.realpath(p) for p in paths}
    return sum(os.path.getsize(p) for p in real)


def scan_datasets_cache(root: Path) -> list[dict[str, Any]]:
    """Entries of the `datasets` Arrow cache: <owner>___<name>/<config>/<version>/<hash>/."""
    entries = []
    if not root.is_dir():
        return entries
    for hash_dir in sorted(root.glob("*/*/*/*")):
        name_dir = hash_dir.parents[2]
        skip = name_dir.name in DATASETS_SKIP or name_dir.name.startswith(HUB_REPO_PREFIXES)
        if skip or not hash_dir.is_dir():
            continue
        files = _files(hash_dir)
        if not any(f.suffix == ".arrow" or f.name == "dataset_info.json" for f in files):
            continue
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


def scan_hub_cache(root: Path) -> list[dict[str, Any]]:
    """Entries of the hub cache: datasets--<owner>--<name>/ with blobs/, snapshots/, refs/."""
    entries = []
    if not root.is_dir():
        return entries
    for repo in sorted(root.glob(f"{HUB_PREFIX}*")):
        if not repo.is_dir():
            continue
        main = repo / "refs" / "main"
        snapshots = sorted(p.name for p in (repo / "snapshots").glob("*") if p.is_dir())
        revision = main.read_text().strip() if main.is_file() else ",".join(snapshots) or None
        files = _files(repo / "blobs") + _files(repo / "snapshots")
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


def parse_dataset_ref(ref: str, manifest_dir: Path) -> dict[str, Any]:
    """Split `name::split::config` and tell a local file from a hub dataset id."""
    name, split, config = split_hub_spec(ref)
    kind = "local" if is_local(manifest_dir, name) else "hub"
    return {"id": name, "split": split, "config": config, "kind": kind}


def manifest_refs(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The datasets one manifest names (training.dataset.path, tasks.*.train)."""
    try:
        name, dataset = load_dataset_block(path)
    except UserError as exc:
        detail = "; ".join(line.removeprefix(f"{path}").lstrip(":").strip() for line in exc.lines)
        return {}, [f"{path}: cannot read manifest ({detail})"]
    found = []
    if dataset.path:
        found.append(("training.dataset.path", dataset.path))
    for task, spec in (dataset.tasks or {}).items():
        found.append((f"training.dataset.tasks.{task}.train", spec.train))
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
    if experts is not None and not experts.is_dir():
        raise UserError(f"--experts: folder {experts} does not exist")
    entries = scan_datasets_cache(roots["datasets"]) + scan_hub_cache(roots["hub"])
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
    }
