"""A local data source, row by row: which files it is, which columns hold which role, and
every row checked against that mapping, with errors that name file, line, field and shape.

`check` counts the checked rows; the build writes them to Arrow (`sources.write_arrow`). Both
read through `reader.read_rows`, so they agree on every file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from expert_cli.config.dataset_card import card_files, shown_name
from expert_cli.config.refs import (
    FILE_FORMATS,
    compression,
    folder_data_files,
    of_format,
    suffix_format,
    windows_note,
)
from expert_cli.config.resolve import SourceRef
from expert_cli.config.split_names import field_role, split_files
from expert_cli.data.fields import (
    OPTIONAL_ROLES,
    TOOLS,
    FieldSpec,
    field_spec,
    source_fields,
    turn_lists,
)
from expert_cli.data.file_text import shown_names
from expert_cli.data.reader import Columns, column_names, read_rows
from expert_cli.data.values import check_row, kind_of
from expert_cli.errors import UserError
from expert_cli.paths import path_exists, shown_path


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` is a dataset folder written by `Dataset.save_to_disk`."""
    return path_exists(path / "state.json")


def missing_sources(refs: list[SourceRef]) -> list[str]:
    """The problem of each local source that is not there or cannot be listed, all at once."""
    lines = []
    for ref in refs:
        if ref.kind == "local":
            try:
                source_files(ref)
            except UserError as exc:
                lines += exc.lines
    return lines


def source_files(ref: SourceRef) -> list[Path]:
    """The local files of a source (a file, or the data files of a folder, hidden ones such as
    .cache/ or .ipynb_checkpoints/ left out, and those named for another split: see
    config.split_names.split_files), sorted."""
    path = Path(ref.location)
    try:
        if not path.exists():
            raise UserError(f"{shown_path(path)}: not found ({ref.field}){windows_note(path)}")
    except OSError as exc:  # a name too long, a folder that cannot be entered
        raise UserError(f"{shown_path(path)}: cannot be read ({exc.strerror})") from None
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"{path}: not a regular file (a device, pipe or socket)")
    if is_saved_dataset(path):
        return sorted(p for p in path.iterdir() if p.is_file())
    if path_exists(path / "dataset_dict.json"):  # DatasetDict.save_to_disk: a folder a split
        splits = sorted(p.name for p in path.iterdir() if is_saved_dataset(p))
        raise UserError(
            f"{ref.field}: {shown_path(path)} holds several saved splits "
            f"({shown_names(splits[:8]) or 'none readable'}); name one split's folder, e.g. "
            f"{shown_path(path / ('train' if 'train' in splits or not splits else splits[0]))}"
        )
    files = folder_data_files(path)
    if not files:
        raise UserError(f"{path}: folder has no data files ({', '.join(FILE_FORMATS)})")
    if ref.format in FILE_FORMATS.values():  # a folder of several formats: the one named
        files = of_format(files, ref.format)
        if not files:
            raise UserError(f"{path}: folder has no {ref.format} files ({ref.field})")
    if ref.split is not None:  # a split its README.md lists (resolve checked it does)
        if not (named := card_files(path, files, ref.split)):
            raise UserError(
                f"{ref.field}: {shown_path(path)}: no data file matches the paths its README.md "
                f"gives split {shown_name(ref.split)}"
            )
        return named
    kept, left = split_files(path, files, field_role(ref.field))
    if not kept and field_role(ref.field) == "test":
        raise UserError(
            f"{ref.field}: {shown_path(path)}: no data file in it is named for the test split "
            "(e.g. test.jsonl, data/test-00000.parquet); name the test file"
        )
    if not kept:  # a validation source keeps its validation (else test) files: never empty
        raise UserError(
            f"{ref.field}: {shown_path(path)}: every data file in it is named for a held-out "
            f"split (validation, test), e.g. {shown_path(left[0].relative_to(path))}; name the "
            "training files' folder or file"
        )
    return kept


def file_format(ref: SourceRef, files: list[Path]) -> str:
    """The format of a local source's files: the manifest's, else their suffix's."""
    if ref.format in ("jsonl", "json", "csv", "parquet", "arrow"):
        return ref.format
    kinds = {k for k in map(suffix_format, files) if k}
    kinds = {"json" if k == "jsonl" else k for k in kinds}  # one reader reads both layouts
    if len(kinds) > 1:  # a format set reads only its own files (source_files)
        raise UserError(
            f"{ref.location}: holds data files of several formats ({', '.join(sorted(kinds))}); "
            "keep one format in the folder, or set training.dataset.format to the one to read"
        )
    if not kinds and any(compression(f) or f.suffix.lower() == ".zst" for f in files):
        raise UserError(
            f"{ref.location}: a compressed file of no format the reader knows; jsonl, json and "
            "csv files are read compressed with gzip, bz2 or xz, named for both "
            "(data.jsonl.gz): decompress it (Parquet and Arrow files are read uncompressed, "
            "their columns compressed inside), or compress a text file with one of those"
        )
    if not kinds and any(f.suffix.lower() == ".tsv" for f in files):  # format: csv reads commas
        raise UserError(
            f"{ref.location}: tab-separated values are not read; convert the file to CSV or "
            "JSON Lines (e.g. with pandas: read_csv(path, sep='\\t').to_json(out, "
            "orient='records', lines=True))"
        )
    if not kinds:
        raise UserError(
            f"{ref.location}: cannot tell the file format (no known suffix); set "
            "training.dataset.format"
        )
    return kinds.pop()


@dataclass
class Scan:
    """The checked rows of one local source, by role, and the field mapping they follow; `at`
    names the place (file:line) of the row last yielded."""

    fields: FieldSpec
    rows: Iterator[dict[str, Any]]
    at: str = ""


def _file_rows(files: list[Path], fmt: str, columns: Columns | None) -> Iterator[tuple[str, Any]]:
    for path in files:
        for where, row in read_rows(path, fmt, columns):
            yield (f"{path}:{where[5:]}" if where.startswith("line ") else f"{path}: {where}"), row


def _columns(fields: FieldSpec | None, mapping: dict[str, str] | None) -> Columns | None:
    """The columns the mapping reads (None when it is detected from the first row)."""
    roles = fields.mapping if fields else mapping
    if not roles:
        return None
    required = {c for r, c in roles.items() if r not in OPTIONAL_ROLES}
    return Columns(frozenset(roles.values()), frozenset(required))


def _schema(files: list[Path], fmt: str) -> tuple[list[str], frozenset[str]] | None:
    """The columns of a Parquet or Arrow source's files together (an `input` only a later
    file holds is read, so check says so) and those holding turns; None for another format
    or a first file whose schema cannot be read."""
    first = column_names(files[0], fmt)
    if first is None:
        return None
    names, turns = dict.fromkeys(first[0]), set(first[1])
    for path in files[1:]:
        if (more := column_names(path, fmt)) is not None:
            names.update(dict.fromkeys(more[0]))
            turns |= more[1]
    return list(names), frozenset(turns)


def scan_local(ref: SourceRef, fields: FieldSpec | None, mapping: dict[str, str] | None) -> Scan:
    """Every row of a local source, checked against the field mapping (detected from the
    first row when the manifest has none), streamed."""
    files = source_files(ref)
    fmt = file_format(ref, files)
    schema = _schema(files, fmt)  # a Parquet or Arrow source's columns, turns
    detect = mapping is None  # from this source's own columns (source_fields)
    if detect and schema:  # from the schema, as from a first row
        fields = source_fields(schema[0], f"{files[0]}: row 1", schema[1], whole=True)
    elif detect:
        fields = None  # from the first row, each source its own
    rows = _file_rows(files, fmt, _columns(fields, mapping))
    first = next(rows, None)
    if first is None:
        why = (
            "the file has no rows"
            if len(files) == 1
            else f"none of its {len(files)} files has rows"
        )
        raise UserError(f"{ref.location}: no examples ({why})")
    where, row = first
    if fields is None:
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected an object with named fields, found {kind_of(row)}")
        columns = schema[0] if schema else list(row)  # a mapped file reads its own alone
        if detect:
            fields = source_fields(columns, where, turn_lists(row))
        else:
            fields = field_spec(mapping, columns, where, turn_lists(row))
    scan = Scan(fields, iter(()), where)
    typed = fmt in ("parquet", "arrow")  # rows of Arrow structs, filled in with nulls
    # a given input/system column no row holds (a misspelt name): its text was left out
    unseen = {r: c for r, c in fields.mapping.items() if r in OPTIONAL_ROLES - fields.maybe}

    # a `tools` column a later row holds that the mapping leaves unread (OpenAI's files leave
    # the key out of rows without tools): said as one in the first row is (unread_words)
    watch = TOOLS not in fields.mapping and TOOLS not in fields.unread

    def checked() -> Iterator[dict[str, Any]]:
        nonlocal watch
        yield check_row(row, scan.fields, where, typed)
        _strike(unseen, row)
        for at, value in rows:
            scan.at = at
            yield check_row(value, scan.fields, at, typed)
            if unseen:
                _strike(unseen, value)
            if watch and isinstance(value, dict) and value.get(TOOLS):
                scan.fields, watch = replace(scan.fields, unread=frozenset({TOOLS})), False
        if unseen:
            role, column = sorted(unseen.items())[0]
            raise UserError(
                f"{ref.location}: field '{column}' (field_mapping.{role}) is in no row; "
                "check the column's name, or remove it from field_mapping"
            )

    scan.rows = checked()
    return scan


def _strike(unseen: dict[str, str], row: Any) -> None:
    """Strike from `unseen` (role -> column) the columns `row` holds."""
    if isinstance(row, dict):
        for role in [r for r, c in unseen.items() if c in row]:
            del unseen[role]
