"""What a manifest's references mean: a local path or a hub id, `name::split::config`, and the
data format a file suffix stands for. Every module that resolves a reference uses these."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from expert_cli.config.base import has_control_character
from expert_cli.config.dataset_card import card_files
from expert_cli.config.split_names import HELD_OUT_SPLITS, file_splits, split_files
from expert_cli.errors import UserError
from expert_cli.paths import home_expanded, not_a_folder, path_exists, resolved_path, shown_path

# data file suffix -> the manifest's `format` value
FILE_FORMATS = {
    ".jsonl": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
# other names for a format's files
SUFFIX_ALIASES = {".ndjson": "jsonl", ".jsonlines": "jsonl"}
# compressed files the reader opens (the text formats only), by suffix
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz"}
TEXT_FORMATS = ("jsonl", "json", "csv")
# files a data folder commonly holds beside its data, not named as files left unread
NOT_DATA_SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".ipynb", ".lock"}
NOT_DATA_NAMES = ("readme", "license", "licence", "changelog")
# the datasets library's own records, which it leaves out of a folder's data files
LIBRARY_RECORDS = frozenset(
    {"config.json", "dataset_info.json", "dataset_infos.json", "dataset_dict.json"}
)
MAX_FOLDER_FILES = 1_000_000  # in a data folder, its subfolders and those it links to
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
        or suffix in SUFFIX_ALIASES
        or suffix in OTHER_LOCAL_SUFFIXES
    )


def suffix_format(path: Path | str) -> str | None:
    """The format a data file's name stands for: its suffix in any case (.JSONL), .ndjson
    as jsonl, a text format's under a compression suffix (data.jsonl.gz); None otherwise."""
    suffixes = [s.lower() for s in Path(path).suffixes[-2:]]
    if not suffixes:
        return None
    if suffixes[-1] in COMPRESSIONS:
        inner = suffixes[0] if len(suffixes) == 2 else ""
        fmt = FILE_FORMATS.get(inner) or SUFFIX_ALIASES.get(inner)
        return fmt if fmt in TEXT_FORMATS else None
    return FILE_FORMATS.get(suffixes[-1]) or SUFFIX_ALIASES.get(suffixes[-1])


def compression(path: Path | str) -> str | None:
    """The compression a file's suffix says (gzip, bz2, xz), or None."""
    return COMPRESSIONS.get(Path(path).suffix.lower())


def folder_files(path: Path) -> list[Path]:
    """Every file of a folder, sorted: linked subfolders followed (each real folder once, so
    a link back up is not a loop), hidden ones such as .cache/ or .ipynb_checkpoints/ left
    out. A subfolder that cannot be read is a UserError naming it."""
    top = os.path.realpath(path)
    found: list[Path] = []
    seen = {top}

    def unreadable(exc: OSError) -> None:
        why = exc.strerror or type(exc).__name__
        raise UserError(f"{shown_path(exc.filename or path)}: cannot be read ({why})")

    for root, dirs, files in os.walk(path, onerror=unreadable, followlinks=True):
        kept = []
        for name in sorted(dirs):
            real = os.path.realpath(os.path.join(root, name))
            above = os.path.commonpath([real, top]) == real  # a link up: the folder again
            if not name.startswith(".") and real not in seen and not above:
                seen.add(real)
                kept.append(name)
        dirs[:] = kept
        for name in files:
            file = Path(root, name)
            if name.startswith("."):
                continue
            if os.path.isfile(file):
                found.append(file)
            elif os.path.islink(file) and is_data_file(file):  # its data would go unread
                raise UserError(
                    f"{shown_path(file)}: {not_a_folder(file, 'file')}; a data file of the "
                    f"folder {shown_path(path)} (download it again, or remove the link)"
                )
        if len(found) > MAX_FOLDER_FILES:
            raise UserError(
                f"{shown_path(path)}: holds more than {MAX_FOLDER_FILES:,} files (a link to a "
                "large folder?); name a folder that holds the data alone"
            )
    return sorted(found)


def is_data_file(path: Path) -> bool:
    """Whether a folder's file is data by its name: a data format's suffix (suffix_format),
    and not one of the records the datasets library writes and passes over as data (a
    `hf download` of an older dataset holds dataset_infos.json beside its files)."""
    return bool(suffix_format(path)) and path.name not in LIBRARY_RECORDS


def folder_data_files(path: Path) -> list[Path]:
    """The data files of a folder (is_data_file), as folder_files lists them."""
    return [p for p in folder_files(path) if is_data_file(p)]


def unread_files(files: list[Path]) -> list[Path]:
    """The files of a data folder (`files`, as folder_files lists them) that no format reads
    (a .tsv, a .zst, a compressed Parquet file), those a data folder commonly holds beside its
    data (README, scripts) left out."""
    return [
        p
        for p in files
        if not suffix_format(p)
        and p.name not in LIBRARY_RECORDS
        and p.suffix.lower() not in NOT_DATA_SUFFIXES
        and not p.name.lower().startswith(NOT_DATA_NAMES)
    ]


def of_format(files: list[Path], fmt: str | None) -> list[Path]:
    """The files of a manifest `format` (json and jsonl alike: one reader reads both); all of
    them where the format is not a file format (unset, huggingface)."""
    if fmt not in FILE_FORMATS.values():
        return files
    same = {"json", "jsonl"} if fmt in ("json", "jsonl") else {fmt}
    return [f for f in files if suffix_format(f) in same]


SHOWN_FILES = 3  # files named in a note


def held_out_notes(train: list[Any], valid: list[Any]) -> list[str]:
    """A note for each local training folder that holds files named for a held-out split
    (left out of training: split_files), and for each local validation source whose files
    are read for training too (the same file; a file in the training folder under a name
    that names no split): its eval loss would measure examples the run trains on."""
    notes, trained = [], set()
    for ref in train:
        files, left = _local_files(ref, training=True)
        trained |= files
        if left:
            notes.append(
                f"{ref.field}: {len(left)} file(s) of a held-out split are left out of "
                f"training ({_named(left, ref.location)})"
            )
    for ref in valid:
        files, left = _local_files(ref, training=False)
        kinds = file_splits(Path(ref.location), left)
        left = [f for f in left if kinds[f] in HELD_OUT_SPLITS]
        if left:  # a folder of validation and test files evaluates the validation ones
            notes.append(
                f"{ref.field}: {len(left)} file(s) of another split are left out of "
                f"evaluation ({_named(left, ref.location)})"
            )
        if files & trained:
            notes.append(
                f"{ref.field}: {shown_path(ref.location)} is also read for training; the eval "
                "loss then measures examples the run trains on (a validation file in the "
                "training folder is left out of training when its name says its split: "
                "valid.jsonl)"
            )
    return notes


def trained_test_notes(train: list[Any], tests: list[Any]) -> list[str]:
    """A note for each test source whose files (or hub split) training reads too: evaluate
    then scores examples the run trained on (it says how many; check said nothing)."""
    trained = {f for ref in train if ref.kind == "local" for f in _local_files(ref, True)[0]}
    hub = {(r.location, r.split, r.config) for r in train if r.kind == "hub"}
    return [
        f"{ref.field}: {shown_path(ref.location)} is also read for training; evaluate then "
        "scores examples the run trained on"
        for ref in tests
        if (ref.kind == "local" and _local_files(ref, False)[0] & trained)
        or (ref.kind == "hub" and (ref.location, ref.split, ref.config) in hub)
    ]


def unread_notes(refs: list[Any]) -> list[str]:
    """A note for each local data folder holding files no format reads (data.tsv,
    data.jsonl.zst): the run trains without them, so each is named (at most SHOWN_FILES)."""
    notes, done = [], set()
    for ref in refs:
        path = Path(ref.location)
        try:
            if ref.kind != "local" or ref.location in done or not path.is_dir():
                continue
            done.add(ref.location)
            if _saved(path):
                continue
            files = folder_files(path)  # walked once: a folder may hold 1,000,000 files
            left, data = unread_files(files), [f for f in files if is_data_file(f)]
            read = set(of_format(data, ref.format))
            other = [f for f in data if f not in read]
        except (OSError, UserError):  # the data check names a folder that cannot be read
            continue
        if left:
            notes.append(
                f"{ref.field}: {len(left)} file(s) in {shown_path(path)} are not read "
                f"({_named(left, ref.location)}): jsonl, json, csv, parquet and arrow files "
                "are, the first three also as .gz, .bz2 or .xz"
            )
        if other:
            notes.append(
                f"{ref.field}: {len(other)} data file(s) in {shown_path(path)} are not read "
                f"({_named(other, ref.location)}): format {ref.format} reads its own files "
                "only (split them into folders of one format each to train on both)"
            )
    return notes


def _saved(path: Path) -> bool:
    """Whether `path` is a folder `save_to_disk` wrote (a dataset, or a dataset's splits)."""
    return path_exists(path / "state.json") or path_exists(path / "dataset_dict.json")


def _named(files: list[Path], folder: str) -> str:
    """The first SHOWN_FILES files, relative to `folder`, and how many more there are."""
    names = ", ".join(shown_path(f.relative_to(folder)) for f in files[:SHOWN_FILES])
    return names + (f" and {len(files) - SHOWN_FILES} more" if len(files) > SHOWN_FILES else "")


def _local_files(ref: Any, training: bool) -> tuple[set[str], list[Path]]:
    """The real paths of the files a local source reads, and the files of its folder it
    leaves out; nothing for a hub source, a saved dataset (or a folder of saved splits) or a
    path that cannot be read (the data check names it)."""
    path = Path(ref.location)
    try:
        if ref.kind != "local":
            return set(), []
        if _saved(path) or not path.is_dir():  # a file (or one not there yet), a saved dataset
            return {os.path.realpath(path)}, []
        files = of_format(folder_data_files(path), ref.format)
        if ref.split is not None:  # a split its README.md lists
            return {os.path.realpath(f) for f in card_files(path, files, ref.split)}, []
        kept, left = split_files(path, files, "train" if training else "validation")
        return {os.path.realpath(f) for f in kept}, left
    except (OSError, ValueError):
        return set(), []


def unread_fields(ds: Any, folder: Path) -> list[str]:
    """Notes for the dataset block's sources that its `type` leaves unread (`path` beside
    tasks, tasks beside `path`), and for a `test_path` (read by `evaluate` alone, after
    training) naming nothing on this machine."""
    notes = []
    if ds.type == "single":
        tests = [("training.dataset.test_path", ds.test_path)]
    else:
        tests = [(f"training.dataset.tasks.{n}.test", t.test) for n, t in (ds.tasks or {}).items()]
    if ds.type == "multi_task" and ds.test_path:
        notes.append(
            "training.dataset.test_path: not read with type multi_task (evaluate reads each "
            "task's test)"
        )
    for field, test in tests:
        if test and is_local(folder, test) and not _there(folder, test):
            notes.append(
                f"{field}: {shown_path(test)} is not there (evaluate --split test reads it; "
                "check the path)"
            )
    if ds.type == "multi_task" and ds.path:
        notes.append(
            "training.dataset.path: not read with type multi_task (each task names its file)"
        )
    if ds.type == "single" and ds.tasks:
        notes.append(
            "training.dataset.tasks: not read with type single (training.dataset.path is); "
            "set type multi_task to train on the tasks"
        )
    return notes


def _there(folder: Path, value: str) -> bool:
    try:
        return path_exists(local_path(folder, value))
    except UserError:  # a path no machine has (a NUL byte): not there
        return False
