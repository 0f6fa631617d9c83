"""A local dataset folder downloaded from the hub (`hf download --local-dir`): the
configurations its README.md's YAML header lists, whose files a folder source would all read
together."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from expert_cli.paths import shown_path

NAME = re.compile(r"[\w.-]{1,64}")  # a configuration's name as a line may show it
README_HEADER_CHARS = 1 << 20  # a dataset card's YAML header is read from its first MiB


def _card_configs(folder: Path) -> list[Any]:
    """The `configs:` list of a dataset folder's README.md YAML header (as the hub writes a
    dataset card); empty where the folder has no such header."""
    card = folder / "README.md"
    try:
        if not card.is_file():  # a pipe would never end
            return []
        with card.open("rb") as fh:  # its first MiB: a card may be any size
            text = fh.read(README_HEADER_CHARS).decode("utf-8", errors="replace")
    except OSError:
        return []
    end = text.find("\n---", 3)
    if not text.startswith("---") or end < 0:
        return []
    try:
        header = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return []
    configs = header.get("configs") if isinstance(header, dict) else None
    return configs if isinstance(configs, list) else []


def readme_configs(folder: Path) -> list[tuple[str, str | None]]:
    """The configurations a dataset folder's README.md names in its YAML header, each with
    the folder its first data files lie in (None where they lie at the top)."""
    found = []
    for config in _card_configs(folder):
        if isinstance(config, dict) and isinstance(config.get("config_name"), str):
            files = config.get("data_files")
            first = files[0] if isinstance(files, list) and files else files
            path = first.get("path") if isinstance(first, dict) else first
            path = path[0] if isinstance(path, list) and path else path
            parts = Path(path).parts if isinstance(path, str) else ()
            found.append((config["config_name"], parts[0] if len(parts) > 1 else None))
    return found


def configs_problem(path: Path, label: str) -> str | None:
    """A local folder holding a hub dataset's several configurations (`hf download` of one):
    every configuration's files would be read together."""
    try:
        configs = readme_configs(path) if path.is_dir() else []
    except OSError:  # a name too long, a folder that cannot be entered: said where it is read
        return None
    if len(configs) < 2:
        return None
    names = ", ".join(shown_name(name) for name, _ in configs[:8])
    folder = next((where for _, where in configs if where), None)
    example = f", e.g. {shown_path(path / folder)}" if folder else ""
    return (
        f"{label}: {shown_path(path)} holds a hub dataset's {len(configs)} configurations "
        f"({names}, as its README.md lists them), whose files would all be read together; name "
        f"one configuration's files or folder{example}"
    )


def shown_name(name: str) -> str:
    """A configuration's or split's name as a line may show it."""
    return repr(name) if NAME.fullmatch(name) else f"<a {len(name):,}-character name>"


def card_splits(folder: Path) -> dict[str, list[str]]:
    """The splits of the one configuration a folder's README.md lists, each with the path
    patterns of its files (`data/train_sft-*`), relative to the folder; none where the card
    lists no configuration or several."""
    configs = _card_configs(folder)
    if len(configs) != 1 or not isinstance(configs[0], dict):
        return {}
    files = configs[0].get("data_files")
    entries = files if isinstance(files, list) else [files]
    splits: dict[str, list[str]] = {}
    for entry in entries:
        split, paths = (
            ("train", entry)
            if not isinstance(entry, dict)
            else (entry.get("split", "train"), entry.get("path"))
        )
        paths = paths if isinstance(paths, list) else [paths]
        if isinstance(split, str):
            splits.setdefault(split, []).extend(p for p in paths if isinstance(p, str))
    return {split: paths for split, paths in splits.items() if paths}


@functools.lru_cache(maxsize=256)  # a card's few patterns, matched against every file
def _glob(pattern: str) -> re.Pattern[str]:
    """A card's path pattern as the hub matches it: `*` and `?` within one folder, `**` any
    number of folders (none too), a leading `./` left out."""
    out, i = "", 0
    pattern = pattern.removeprefix("./")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


def card_split_of(splits: dict[str, list[str]], relative: Path) -> str | None:
    """The split (of `card_splits`) whose patterns match a file's path in the folder."""
    name = relative.as_posix()
    return next((s for s, ps in splits.items() if any(_glob(p).fullmatch(name) for p in ps)), None)


def card_files(folder: Path, files: list[Path], split: str) -> list[Path]:
    """The files of `folder` the card's `split` names."""
    splits = card_splits(folder)
    patterns = [_glob(p) for p in splits.get(split, [])]
    return [
        f for f in files if any(p.fullmatch(f.relative_to(folder).as_posix()) for p in patterns)
    ]
