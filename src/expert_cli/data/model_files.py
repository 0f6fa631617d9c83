"""The files a base model is loaded from, judged before anything loads (milliseconds: names,
the weights index and the files' first bytes), in a local folder and in a hub cache snapshot
alike, so that `check` finds what `train` would stop at, and `train` stops before any data
is tokenized.

transformers reads a folder's weights from `model.safetensors`, else the index of its shards
(`model.safetensors.index.json`), else `pytorch_model.bin` or its index, in that order. What
stopped a load with a traceback, or only after the data was tokenized: a shard the index names
that is missing, shards without their index, an index that is not JSON or not an index, an
index naming a file outside the folder, GGUF weights alone, a Git LFS pointer in place of a
file (a `git clone` without LFS), a zip-format `.bin` cut short, and a generation_config.json
that transformers refuses. A file's contents are never quoted: a name read from the index is
shown only where it looks like a file or tensor name.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from transformers import GenerationConfig

from expert_cli.data.hub import offline, snapshot
from expert_cli.paths import shown_path
from expert_cli.weights import safetensors_problem

SAFE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
LFS_POINTER = b"version https://git-lfs"
LFS_MOST = 1024  # bytes: a pointer file is about 130
INDEX_MOST = 64 << 20  # bytes: a 1,000-shard index of a large model is a few MB
SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")
FILE_NAME = re.compile(r"[\w.\-]{1,200}", re.ASCII)
SHOWN = 2  # names a line shows
# the files besides the weights that the model, its tokenizer and its generation settings are
# read from (and remote code, *.py)
READ_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
    }
)


def base_file_problems(
    base_model: str, kind: str, revision: str | None = None, init: str = "pretrained"
) -> list[str]:
    """Lines `base model M: ...` for what stops the base's weights (or its generation config)
    loading; a hub model is judged in its cached snapshot, and not at all when it is not in
    the cache yet (the hub checks say so). A random `init` reads the generation config alone
    (its weights are built from config.json)."""
    folder = Path(base_model) if kind == "local" else snapshot(base_model, revision)
    if folder is None or not folder.is_dir():
        return []
    if init != "pretrained":
        lines = generation_config_problems(folder)
        return [f"base model {shown_path(base_model)}: {line}" for line in lines]
    # a hub snapshot with the hub on: what is not there yet is downloaded as the model loads
    # (the tokenizer's download leaves a snapshot of config and tokenizer alone), so only
    # files that are there are judged
    whole = kind == "local" or offline()
    lines = weights_problems(folder, whole) + _other_files(folder, whole)
    lines += generation_config_problems(folder)
    return [f"base model {shown_path(base_model)}: {line}" for line in lines]


def weights_problems(folder: Path, whole: bool = True) -> list[str]:
    """What stops the weights in `folder` loading, a line each (none when they load); files
    that are not there are judged only where the folder must be `whole` (nothing will be
    downloaded into it)."""
    for name in (SAFE, SAFE_INDEX, BIN, BIN_INDEX):
        path = folder / name
        if path.is_file():
            if name.endswith(".json"):
                return _index_problems(folder, name, whole)
            return [problem] if (problem := file_problem(path)) else []
        if path.is_symlink() and whole:  # a hub snapshot's link to a blob that is not there
            return [f"{name} is a link to a file that is not there (a download not finished?)"]
    return [_no_weights(folder)] if whole else []


def kept_base_problem(folder: Path) -> str | None:
    """Why a run's own random-init base (OUTPUT/base_model, kept for a resume) cannot be
    loaded, and what to do: nothing can be downloaded, it is built again from the seed."""
    problems = weights_problems(folder)
    if not problems:
        return None
    return (
        f"{shown_path(folder)}: {problems[0].split('; ')[0]}; it is this run's random-init "
        "base, built from its seed: remove that folder and --resume builds it again (the same "
        "weights where the device and dtype are the same)"
    )


def _head(path: Path) -> tuple[bytes, int]:
    """A file's first bytes (as many as an LFS pointer has at most) and its size."""
    size = path.stat().st_size
    with path.open("rb") as f:
        return f.read(min(size, LFS_MOST)), size


def _lfs_pointer(path: Path, head: bytes, size: int) -> str | None:
    if size > LFS_MOST or not head.startswith(LFS_POINTER):
        return None
    return (
        f"{path.name} is a Git LFS pointer, not the file: fetch the files with "
        "`git lfs pull` in the model's folder, or download the model again"
    )


def file_problem(path: Path) -> str | None:
    """Why one weights file cannot be read (a Git LFS pointer, cut short, damaged), or None."""
    try:
        head, size = _head(path)
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror})"
    if pointer := _lfs_pointer(path, head, size):
        return pointer
    if path.suffix == ".safetensors":
        problem = safetensors_problem(path)
        return f"{problem}; download or copy it again" if problem else None
    if size == 0 or (head.startswith(b"PK") and not zipfile.is_zipfile(path)):
        return f"{path.name} is damaged (cut short or broken); download or copy it again"
    if head.startswith(b"PK"):  # torch's zip format: its pickle read as the loader reads
        # it (weights_only), the tensors mapped from the file, not read
        try:
            torch.load(path, weights_only=True, mmap=True, map_location="cpu")
        except pickle.UnpicklingError:
            return (
                f"{path.name} holds objects other than tensors, which torch does not load "
                "(weights_only); use the model's safetensors weights"
            )
        except Exception:  # noqa: BLE001 - whatever a damaged archive makes torch raise
            return f"{path.name} is damaged (torch cannot read it); download or copy it again"
    return None  # torch's legacy format: read when loaded


def _index_problems(folder: Path, name: str, whole: bool) -> list[str]:
    """An index that is JSON mapping tensor names to files in `folder` that are there (where
    it must be `whole`) and undamaged. Which shard holds which tensor is not judged:
    transformers reads the names from the shards themselves (a stale entry loads)."""
    index = folder / name
    weight_map = _weight_map(index)
    if isinstance(weight_map, str):
        return [f"{name}: {weight_map}"]
    problems: list[str] = []
    files = sorted(set(weight_map.values()))
    outside = [f for f in files if not _inside(f)]
    if outside:
        return [f"{name}: names a file outside the model's folder ({_shown_files(outside)})"]
    missing = [f for f in files if not (folder / f).is_file()]
    if missing and whole:
        are = "is" if len(missing) == 1 else "are"
        shown = _shown_files(missing)
        problems.append(f"{name}: names {_count(missing, 'file')} that {are} not there ({shown})")
    for file in (f for f in files if f not in missing):
        if problem := file_problem(folder / file):
            problems.append(problem)
    return problems


def _weight_map(index: Path) -> dict[str, str] | str:
    """The index's tensor -> file map, or why it is not one."""
    try:
        if index.stat().st_size > INDEX_MOST:
            return f"over {INDEX_MOST >> 20} MB: not a weights index"
        data = json.loads(index.read_bytes())
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    except (ValueError, RecursionError) as exc:
        at = f" at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        return f"not JSON{at}; download or copy it again"
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in weight_map.items()
    ):
        return "not a weights index (a weight_map of tensor names to file names)"
    return weight_map


def _other_files(folder: Path, whole: bool) -> list[str]:
    """The configuration, tokenizer and remote-code files that are links to nothing (a hub
    blob deleted) or Git LFS pointers: the tokenizer was said to be damaged
    (JSONDecodeError). Files nothing here reads (another framework's weights) are not."""
    problems = []
    for path in sorted(folder.iterdir()):
        if path.name not in READ_FILES and path.suffix != ".py":
            continue
        if path.is_symlink() and not path.exists():
            if not whole:
                continue  # downloaded again as the model loads
            problems.append(f"{_shown_files([path.name])} is a link to a file that is not there")
        elif path.is_file():
            with suppress(OSError):  # one that cannot be read is said as its loader reads it
                if pointer := _lfs_pointer(path, *_head(path)):
                    problems.append(pointer)
    return problems


def _no_weights(folder: Path) -> str:
    """What a folder with none of the files transformers loads weights from holds instead."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    if shards := [n for n in names if SHARD.fullmatch(n)]:
        index = SAFE_INDEX if shards[0].endswith(".safetensors") else BIN_INDEX
        return (
            f"has shards ({_shown_files(shards)}) but not {index}, the index they are loaded "
            "by: download it too"
        )
    if gguf := [n for n in names if n.endswith(".gguf")]:
        return (
            f"holds GGUF weights only ({_shown_files(gguf)}), which expert-cli does not train "
            f"on: use the model's safetensors release ({SAFE})"
        )
    return (
        f"has no weights ({SAFE}, {SAFE_INDEX}, {BIN} or {BIN_INDEX}); add them, or set "
        '"init": "random" to train from a random initialisation'
    )


def generation_config_problems(folder: Path) -> list[str]:
    """generation_config.json as transformers reads it with the model (one it refuses, a
    value out of its bounds, stopped the load with a traceback; one that is not JSON it
    passes over in silence, and the expert decoded without the base's sampling values and
    stops); a pretrained base's, or the folder's whose config.json a random init is built
    from."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return []
    try:
        json.loads(path.read_bytes())
    except OSError:
        return []  # one that cannot be read is said as its loader reads it
    except (ValueError, RecursionError):
        return [
            "generation_config.json is not JSON: transformers would pass it over, and the "
            "expert would decode without the base's sampling values and stops; fix or remove "
            "the file"
        ]
    try:
        GenerationConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever its values make transformers raise
        return [
            f"generation_config.json is refused by transformers ({type(exc).__name__}: a "
            "value out of its bounds or of the wrong type); fix or remove the file"
        ]
    return []


def _inside(file: str) -> bool:
    """Whether an index's file name stays in the model's folder (no `..`, not absolute)."""
    parts = PurePosixPath(file.replace("\\", "/")).parts
    return (
        bool(parts) and not file.startswith(("/", "\\")) and ".." not in parts and ":" not in file
    )


def _shown_files(files: list[str]) -> str:
    shown = [f if FILE_NAME.fullmatch(f) else f"<a {len(f)}-character name>" for f in files[:SHOWN]]
    return ", ".join(shown) + (", ..." if len(files) > SHOWN else "")


def _count(items: list[Any], what: str) -> str:
    return f"{len(items)} {what}{'s' if len(items) != 1 else ''}"
