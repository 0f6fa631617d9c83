"""Paths a user gives us, made absolute without a traceback. A leaf module, like errors.py.

`Path.resolve()` raises RuntimeError on a symbolic link loop and ValueError on a NUL byte;
these turn into a UserError (exit 2) naming the argument or field, with the path shortened.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import tempfile
from pathlib import Path

from expert_cli.errors import UserError, escaped

SHOWN_PATH_CHARS = 200
LISTED_LINKS = 10_000  # a folder's entries looked at for links (links_in)


def shown_path(path: Path | str, limit: int = SHOWN_PATH_CHARS) -> str:
    """A path as an error shows it: NUL bytes and other control characters visible (a newline
    as `\\n`), at most `limit` characters."""
    text = escaped(str(path).replace("\x00", "\\0"))
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


NAME_MAX_BYTES, PATH_MAX_BYTES = 255, 4096  # Linux's limits (and most file systems')


def name_length_problem(text: str) -> str | None:
    """Why no file system takes `text` as a path (a name in it over 255 bytes, or the whole
    over 4,096), or None: found before anything is created on the way to it."""
    try:
        encoded = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None  # the OS call names what it cannot encode
    if len(encoded) > PATH_MAX_BYTES:
        return f"over {PATH_MAX_BYTES:,} bytes; give a shorter path"
    if any(len(part) > NAME_MAX_BYTES for part in encoded.split(b"/")):
        return f"a name in it is over {NAME_MAX_BYTES} bytes; give a shorter one"
    return None


def resolved_path(path: Path | str, label: str) -> Path:
    """`path` absolute, `~` expanded, links followed; UserError for a path that cannot be."""
    text = str(path)
    if "\x00" in text:
        raise UserError(f"{label} {shown_path(text)}: contains a NUL byte; expected a path")
    expanded = home_expanded(text)
    if expanded is None:
        raise UserError(
            f"{label} {shown_path(text)}: that home folder (~) is not known here; give the "
            "path in full"
        )
    if problem := name_length_problem(str(expanded)):
        raise UserError(f"{label} {shown_path(text)}: {problem}")
    try:
        return expanded.resolve()
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
        if path_exists(path.parent):  # a file where the folder should be
            return f"{label}: {path.parent} is not a folder; give a path in a folder"
        return f"{label}: folder {path.parent} does not exist"
    if path.exists() and not path.is_file():
        return f"{label}: {path} is not a regular file; give a file path"
    if path.exists() and not replace:
        return f"{label}: {path} already exists; add --force to replace it"
    return None


PICTURE_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}  # by the file's suffix


def picture_problem(path: Path, label: str) -> str | None:
    """A picture's file name whose suffix names no format it is written in (a PNG under
    `metrics.json` or `u.txt`), or None."""
    if path.suffix.lower() in PICTURE_FORMATS:
        return None
    *first, last = PICTURE_FORMATS
    if path.name.lower() in PICTURE_FORMATS:  # ".png": a hidden file's name, no suffix
        return (
            f"{label}: {path.name} is a suffix alone; give a name before it (e.g. util{path.name})"
        )
    return f"{label}: {path.name} should end in {', '.join(first)} or {last} (the format written)"


# what `train` writes into its output folder (train/run_folder.py sets these aside on
# --overwrite; other commands refuse to write over them)
RUN_OUTPUTS = (
    "checkpoints",
    "runs",
    "base_model",
    "metrics.json",
    "training.png",
    "manifest.resolved.json",
    "manifest.source.json",
    "training_args.bin",
    "adapter_model.safetensors",
    "adapter_config.json",
    "adapter_init.safetensors",  # B0 A0 of a run whose init decomposed the base (PiSSA)
    "README.md",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
RUN_RECORD = "manifest.resolved.json"  # the file that says a folder holds a run


def run_file_problem(path: Path, label: str) -> str | None:
    """Why another command must not write `path`: it is one of a training run's own files
    (a name `train` writes, in a folder holding a run's manifest.resolved.json). `benchmark
    --output RUN/metrics.json --force` replaced a run's record, and `report` then called the
    folder no run."""
    if path.name not in RUN_OUTPUTS or not path_exists(path.parent / RUN_RECORD):
        return None
    return (
        f"{label} {shown_path(path)}: is the {path.name} of the training run in "
        f"{shown_path(path.parent)}, not this command's to write; give another file name"
    )


def place_problem(path: Path, label: str) -> str | None:
    """Why nothing can be created at `path` (folders on the way made as needed), or None: one
    of its parents is a file, or the nearest existing folder cannot be written to (tried with
    an empty temporary file, removed at once: a read-only disk, /proc, no permission)."""
    existing = next((p for p in path.parents if path_exists(p)), None)
    if existing is None:  # only a path that cannot be looked up at all
        return f"{label} {shown_path(path)}: cannot be used; give a path in a folder"
    if not existing.is_dir():
        kind = "a file, not a folder" if existing.is_file() else "not a folder"
        return (
            f"{label} {shown_path(path)}: {shown_path(existing)} is {kind}; give a path in a folder"
        )
    try:
        handle, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=existing)
    except OSError as exc:
        return (
            f"{label} {shown_path(path)}: {shown_path(existing)} cannot be written to "
            f"({exc.strerror or type(exc).__name__}); give a path in a folder you can write"
        )
    os.close(handle)
    os.unlink(probe)
    return None


def new_file_problem(path: Path, label: str, replace: bool = False) -> str | None:
    """Why a command cannot write a file at `path`, making the folders on the way, or None:
    `place_problem`'s reasons; a folder or a special file there (the write renames a new file
    over it: never replaced, even with --force); a file there and `replace` not asked."""
    problem = place_problem(path, label)
    if problem is None and path_exists(path) and not path.is_file():
        problem = (
            f"{label} {shown_path(path)}: is a folder or a special file, which --force does "
            "not replace; give a file path"
        )
    if problem is None and path_exists(path) and not replace:
        problem = f"{label} {shown_path(path)}: exists; choose another name or --force"
    return problem


def path_exists(path: Path) -> bool:
    """`path.exists()`, False (not an exception) for a name too long or a NUL byte."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def home_expanded(path: Path | str) -> Path | None:
    """`path` with a leading `~` or `~name` expanded; None when that home folder is not
    known here (no such user, or no home at all: Python raises RuntimeError)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return None


def path_is_file(path: Path | str) -> bool:
    """Whether `path` (`~` expanded) is a file (or a link to one); False, not an exception,
    where it cannot be looked at."""
    expanded = home_expanded(path)
    try:
        return expanded is not None and expanded.is_file()
    except (OSError, ValueError):
        return False


def path_is_dir(path: Path | str) -> bool:
    """Whether `path` (`~` expanded) is a folder; False (not an exception) for a `~name` of
    no known user, a name too long or a NUL byte."""
    expanded = home_expanded(path)
    try:
        return expanded is not None and expanded.is_dir()
    except (OSError, ValueError):
        return False


def not_a_folder(path: Path | str, kind: str = "folder") -> str:
    """Why `path`, not a `kind` (a folder, or a file where one is expected), is not one, in
    words after its name: it does not exist, is a link loop, a link to nothing, cannot be
    looked at, or is something else."""
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return "does not exist"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"is a link loop (a link that leads back to itself), not a {kind}"
        if exc.errno == errno.ENOENT:
            return "is a link to a path that does not exist"
        return f"cannot be looked at ({exc.strerror})"
    return f"is not a {kind}"


def links_in(folder: Path) -> dict[Path, str]:
    """The files `folder`'s symbolic links lead to (a data file linked in from elsewhere is
    named by its target), by the link's name; {} where it cannot be listed."""
    links: dict[Path, str] = {}
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in itertools.islice(entries, LISTED_LINKS):
            if entry.is_symlink():
                with contextlib.suppress(OSError, RuntimeError):
                    links.setdefault(Path(entry.path).resolve(), entry.name)
    return links
