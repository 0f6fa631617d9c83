"""The Hugging Face hub references of a manifest: is each in the local cache (and how big), and
can the hub be reached for the ones that are not?

`check` reports this per model and dataset. `train` and `pretokenize` call `require_hub` before
anything is loaded, so that a missing reference fails in seconds with a message saying what to
do, instead of a minute of the hub client's retries: offline mode (HF_HUB_OFFLINE) with a
reference not in the cache is bad input (exit 2); a hub that cannot be reached is a run-time
condition (exit 1). A local data file that is not there is named in the same message, so one
try shows every missing input.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import try_to_load_from_cache

from expert_cli.config.loading import load_manifest
from expert_cli.config.resolve import (
    ResolvedConfig,
    SourceRef,
    base_model_settings,
    resolve_sources,
)
from expert_cli.data.discovery import default_roots, files_under, size_once
from expert_cli.data.rows import missing_sources
from expert_cli.errors import RunError, UserError

PROBE_TIMEOUT_S = 5.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubRef:
    """A model or dataset the manifest names by hub id, and the manifest field naming it."""

    kind: Literal["model", "dataset"]
    repo: str
    revision: str | None
    field: str


@dataclass(frozen=True)
class HubStatus:
    """Where a reference stands on this machine."""

    ref: HubRef
    cache_path: str | None  # its folder in the local cache, or None
    cached_bytes: int  # 0 when not cached
    reachable: bool | None  # None: not tried (cached, or offline)
    why: str | None  # why the hub cannot be reached, or why it was not tried

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.ref), **{k: v for k, v in asdict(self).items() if k != "ref"}}


def offline() -> bool:
    """Whether the user switched the hub off (any of the libraries' offline variables)."""
    return any(os.environ.get(name, "").strip().lower() in TRUE for name in OFFLINE_VARIABLES)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_refs(resolved: ResolvedConfig) -> list[HubRef]:
    """The hub models and datasets a run needs (the base model unless it is a local folder; a
    random init of a hub model needs its config and tokenizer; the hub datasets among the
    sources)."""
    model = _model_refs(resolved.base_model, resolved.base_model_kind, resolved.revision)
    return model + source_refs(resolved.train_sources + resolved.validation_sources)


def _model_refs(model: str, kind: str, revision: str | None) -> list[HubRef]:
    """The base model where it is a hub id (a random init still needs its config and
    tokenizer)."""
    return [HubRef("model", model, revision, "base_models[0].name")] if kind == "hub" else []


def source_refs(sources: list[SourceRef]) -> list[HubRef]:
    """The hub datasets among `sources` (each once)."""
    refs = []
    seen = set()
    for source in sources:
        if source.kind == "hub" and source.location not in seen:
            seen.add(source.location)
            refs.append(HubRef("dataset", source.location, source.revision, source.field))
    return refs


def cached(ref: HubRef, roots: dict[str, Path] | None = None) -> tuple[Path, int] | None:
    """The reference's folder in the local caches and its size, or None."""
    roots = roots or default_roots()
    owner_name = ref.repo.replace("/", "--")
    repo = roots["hub"] / f"{ref.kind}s--{owner_name}"
    snapshots = repo / "snapshots"
    wanted = ref.revision
    if snapshots.is_dir():
        found = [p for p in snapshots.iterdir() if p.is_dir()]
        if ref.kind == "model":
            found = [p for p in found if (p / "config.json").exists()]
        found = [p for p in found if _holds_bytes(p)]  # not a download stopped before a byte
        if wanted and not (repo / "refs" / wanted).is_file():
            found = [p for p in found if p.name == wanted]
        if ref.kind == "model" and snapshot(ref.repo, wanted, roots["hub"]) is None:
            found = []  # refs/main to a snapshot not there, or none: the loader finds nothing
        if ref.kind == "dataset" and _snapshot_at(repo, wanted) is None:
            found = []  # read offline from the snapshot its ref names: none there
        if found:
            files = [p for part in ("blobs", "snapshots") for p in (repo / part).rglob("*")]
            return repo, size_once([p for p in files if p.is_file()])
    if ref.kind == "dataset":  # the datasets library's own Arrow cache: <owner>___<name>/
        arrow = roots["datasets"] / ref.repo.replace("/", "___")
        files = [p for p in arrow.rglob("*.arrow")] if arrow.is_dir() else []
        if files:
            return arrow, size_once([p for p in arrow.rglob("*") if p.is_file()])
    return None


def snapshot(repo: str, revision: str | None, hub: Path | None = None) -> Path | None:
    """The folder of `repo`'s cached snapshot at `revision` (main) in the hub cache `hub`
    (the default's), as the hub library finds it offline: through refs/ (or a commit hash
    given), the snapshot holding config.json; None when none is (a ref to a snapshot not
    there, no refs)."""
    try:
        found = try_to_load_from_cache(
            repo, "config.json", cache_dir=hub or default_roots()["hub"], revision=revision
        )
    except ValueError:  # not a hub id (a local path that is not there): said elsewhere
        return None
    return Path(found).parent if isinstance(found, str) else None


def dataset_snapshot(repo: str, revision: str | None) -> Path | None:
    """The cached snapshot of dataset `repo` at `revision` (main) that the datasets library
    can read as a local folder, where the hub cannot be asked (offline, or not reachable):
    the library loads a hub id from its own Arrow cache alone then, and a download by `hf
    download` (the hub cache) was "cached" to `check` and unloadable to `train`."""
    if not (offline() or unreachable(endpoint())):
        return None
    return _snapshot_at(default_roots()["hub"] / f"datasets--{repo.replace('/', '--')}", revision)


def _snapshot_at(repo_dir: Path, revision: str | None) -> Path | None:
    """The snapshot of a cached dataset repository at `revision` (main): through refs/, or
    a commit's folder; None when it is not there or holds no byte."""
    wanted = revision or "main"
    ref = repo_dir / "refs" / wanted
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else wanted
        found = repo_dir / "snapshots" / commit
        return found if commit and found.is_dir() and _holds_bytes(found) else None
    except (OSError, UnicodeDecodeError, ValueError):  # not a name this cache holds
        return None


def _holds_bytes(snapshot: Path) -> bool:
    """Whether a snapshot holds a file of at least one byte (its links lead to blobs); an
    empty one, or one of links to blobs never finished, is not a download."""
    return size_once(files_under(snapshot)) > 0


@functools.lru_cache(maxsize=8)
def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why `url`'s host cannot be reached within `timeout` seconds, or None if it answered
    (any HTTP status counts as an answer)."""
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        return str(getattr(exc, "reason", exc))
    except (TimeoutError, OSError) as exc:
        return str(exc) or type(exc).__name__


def hub_status(refs: list[HubRef], probe: bool = True) -> list[HubStatus]:
    """Each hub reference: cached (with its size), else whether the hub can be reached."""
    statuses = []
    for ref in refs:
        found = cached(ref)
        if found is not None:
            statuses.append(HubStatus(ref, str(found[0]), found[1], None, None))
        elif offline():
            statuses.append(HubStatus(ref, None, 0, None, "the hub is switched off"))
        elif probe:
            why = unreachable(endpoint())
            statuses.append(HubStatus(ref, None, 0, why is None, why))
        else:
            statuses.append(HubStatus(ref, None, 0, None, None))
    return statuses


def how_to_fix(ref: HubRef) -> str:
    """What the user can do about a reference that is neither cached nor downloadable."""
    pinned = f" --revision {ref.revision}" if ref.revision else ""
    if ref.kind == "model":
        return (
            f"download it where there is a network (hf download {ref.repo}{pinned} --local-dir "
            f"models/{ref.repo.split('/')[-1]}) and set {ref.field} to that folder"
        )
    return (
        f"download it where there is a network (hf download {ref.repo} --repo-type dataset"
        f"{pinned} --local-dir data/{ref.repo.split('/')[-1]}) and set {ref.field} to the "
        "folder or its files"
    )


def revision_field(ref: HubRef) -> str:
    """The manifest field that pins a reference's revision."""
    if ref.kind == "dataset":
        return "training.dataset.revision"
    return f"{ref.field.rpartition('.')[0]}.revision"


def missing_problems(statuses: list[HubStatus]) -> list[str]:
    """A line per reference that is neither cached nor downloadable here."""
    lines = []
    for s in statuses:
        if s.cache_path is not None or not (s.reachable is False or offline()):
            continue
        why = (
            "the hub is switched off (HF_HUB_OFFLINE)"
            if s.reachable is None
            else f"the hub cannot be reached at {endpoint()} ({s.why})"
        )
        thing = "file or folder" if s.ref.kind == "dataset" else "folder"
        # a mistyped local folder reads as a hub id: say what it was taken for
        read_as = f" (no {thing} of that name beside the manifest, so it is read as a hub id)"
        at = f" at revision {s.ref.revision} ({revision_field(s.ref)})" if s.ref.revision else ""
        lines.append(
            f"{s.ref.field}: {s.ref.kind} {s.ref.repo}{read_as} is not in the local cache"
            f"{at} and {why}; {how_to_fix(s.ref)}"
        )
    return lines


def require_hub(refs: list[HubRef], sources: list[SourceRef] | None = None) -> list[HubStatus]:
    """Before a run loads anything: every hub reference cached or downloadable and every local
    source in `sources` there, else a UserError (offline mode, or a local file missing: bad
    input) or RunError (no network) naming each one."""
    statuses = hub_status(refs)
    problems = missing_problems(statuses)
    local = missing_sources(sources or [])
    if local or (problems and offline()):
        raise UserError([*problems, *local])
    if problems:
        raise RunError("\n".join(problems))
    return statuses


def preflight(manifest: Path, overrides: list[str]) -> None:
    """`require_hub` for a manifest file, before the training libraries are even imported:
    with no network, `train` fails in seconds rather than after loading them."""
    loaded = load_manifest(manifest, overrides)
    model = base_model_settings(loaded)  # from the manifest alone: no machine probe, no torch
    train, valid = resolve_sources(loaded)
    refs = _model_refs(model["base_model"], model["base_model_kind"], model["revision"])
    refs += source_refs(train + valid)
    require_hub(refs, train + valid)
