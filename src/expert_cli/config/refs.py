"""What a manifest's references mean: a local path or a hub id, `name::split::config`, and the
data format a file suffix stands for. Every module that resolves a reference uses these."""

from __future__ import annotations

import os
import re
from pathlib import Path

from expert_cli.config.base import has_control_character
from expert_cli.errors import UserError
from expert_cli.paths import home_expanded, path_exists, resolved_path, shown_path

# data file suffix -> the manifest's `format` value
FILE_FORMATS = {
    ".jsonl": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
# the manifest's `format` value -> the `datasets` builder that reads it
BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "arrow": "arrow"}
# other suffixes that only a local file has (compressed or plain-text data)
OTHER_LOCAL_SUFFIXES = {".tsv", ".txt", ".gz", ".zst", ".xz", ".bz2"}
WINDOWS_PATH = re.compile(r"[A-Za-z]:|\\\\")  # a drive (F:/x, F:x), or a share: two backslashes
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def split_hub_spec(spec: str) -> tuple[str, str | None, str | None]:
    """`name::split::config` -> (name, split, config)."""
    name, _, rest = spec.partition("::")
    split, _, config = rest.partition("::")
    return name, split or None, config or None


def looks_like_hub_id(value: str) -> bool:
    """True for `owner/name` or `name` (no drive letters, no ./ or ../, no backslashes)."""
    return bool(_HUB_ID.match(value)) and ".." not in value


def local_path(folder: Path, value: str, label: str = "path") -> Path:
    """`value` as a path: absolute, or relative to the manifest's folder (UserError naming
    `label` for one that cannot be resolved)."""
    if "\x00" in value:
        raise UserError(f"{label} {shown_path(value)}: contains a NUL byte; expected a path")
    if has_control_character(value):
        raise UserError(f"{label}: contains a control character (a line break?); expected a path")
    if on_another_system(value) and not path_exists(folder / value):
        return Path(value)  # as written: the checks that find it missing say why (windows_note)
    if os.sep == "/" and "\\" in value and not path_exists(folder / value):
        value = value.replace("\\", "/")  # written on Windows, datasets\train.jsonl
    path = home_expanded(value)
    if path is None:
        raise UserError(
            f"{label}: starts with ~ but that home folder is not known here; give the path "
            "in full, or relative to the manifest's folder"
        )
    return path if path.is_absolute() else resolved_path(folder / path, label)


def on_another_system(value: str) -> bool:
    """Whether `value` is a Windows path (`F:/models`, `F:models`, `\\\\server\\share`) on a
    system that has no drives."""
    return os.name != "nt" and bool(WINDOWS_PATH.match(value))


def windows_reason(path: Path | str) -> str | None:
    """Why `path` cannot be opened here, when it is a Windows path; None otherwise."""
    text = str(path)
    if not on_another_system(text):
        return None
    kind = "network path" if text.startswith("\\\\") else f"path, drive {text[0]}:"
    return (
        f"a Windows {kind}, which this machine cannot open; give the path on this machine, "
        "absolute or relative to the manifest's folder"
    )


def windows_note(path: Path | str) -> str:
    """What to add where `path` is not found: why, when it is a Windows path."""
    reason = windows_reason(path)
    return f" ({reason})" if reason else ""


def is_local(folder: Path, name: str) -> bool:
    """Whether a reference (without its `::split::config`) names a local file or folder: it
    exists, or it cannot be a hub id, or its suffix is a data file's. A path this machine
    cannot use (a NUL byte) is local too: no hub id looks like one."""
    suffix = Path(name).suffix.lower()
    try:
        exists = path_exists(local_path(folder, name))
    except UserError:
        return True
    return (
        exists
        or not looks_like_hub_id(name)
        or suffix in FILE_FORMATS
        or suffix in OTHER_LOCAL_SUFFIXES
    )
