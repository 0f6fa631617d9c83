"""Paths a user gives us, made absolute without a traceback. A leaf module, like errors.py.

`Path.resolve()` raises RuntimeError on a symbolic link loop and ValueError on a NUL byte;
these turn into a UserError (exit 2) naming the argument or field, with the path shortened.
"""

from __future__ import annotations

import errno
from pathlib import Path

from expert_cli.errors import UserError

SHOWN_PATH_CHARS = 200


def shown_path(path: Path | str, limit: int = SHOWN_PATH_CHARS) -> str:
    """A path as an error shows it: NUL bytes visible, at most `limit` characters."""
    text = str(path).replace("\x00", "\\0")
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


def resolved_path(path: Path | str, label: str) -> Path:
    """`path` absolute, `~` expanded, links followed; UserError for a path that cannot be."""
    text = str(path)
    if "\x00" in text:
        raise UserError(f"{label} {shown_path(text)}: contains a NUL byte; expected a path")
    try:
        return Path(text).expanduser().resolve()
    except RuntimeError:  # Python's message for a loop of symbolic links
        raise UserError(f"{label} {shown_path(text)}: a loop of symbolic links") from None
    except OSError as exc:
        reason = "a name too long" if exc.errno == errno.ENAMETOOLONG else exc.strerror
        raise UserError(f"{label} {shown_path(text)}: cannot be used ({reason})") from None


def output_file_problem(path: Path, label: str, replace: bool = False) -> str | None:
    """Why `path` cannot take a file a command writes (its folder is missing; it is a folder,
    a device or another special file: the write renames a new file over it, which would
    replace such a node; it is a file already and `replace` was not asked for), or None."""
    if not path.parent.resolve().is_dir():
        return f"{label}: folder {path.parent} does not exist"
    if path.exists() and not path.is_file():
        return f"{label}: {path} is not a regular file; give a file path"
    if path.exists() and not replace:
        return f"{label}: {path} already exists; add --force to replace it"
    return None


def path_exists(path: Path) -> bool:
    """`path.exists()`, False (not an exception) for a name too long or a NUL byte."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False
