"""One reader for local data files, shared by `check` and the cache build.

It streams: memory is bounded by the largest single example (at most `MAX_ITEM_BYTES`), not by
the file. JSON is read in any layout (data/json_rows.py: JSON Lines, one JSON array however it
is indented, pretty-printed objects one after another, a `.json` file holding lines, an object
of columns or one wrapping the examples); CSV with a header row; Parquet and Arrow by record
batch. Every problem is a `UserError` that names the file and the line, row or byte offset, and
the expected shape. No error quotes the file's data: column names are shown only when they look
like names, and never more than a few (data/file_text.py).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from expert_cli.config.refs import TEXT_FORMATS, compression
from expert_cli.data.fields import DETECTED_COLUMNS
from expert_cli.data.file_text import (
    MAX_ITEM_BYTES,
    Row,
    Text,
    marked,
    open_data,
    repeats,
    shown_name,
)
from expert_cli.data.json_rows import json_rows
from expert_cli.errors import UserError

ARROW_BATCH_ROWS = 1024


@dataclass(frozen=True)
class Columns:
    """The columns a run reads of a Parquet or Arrow file: those it maps, of which `required`
    must be in every row. Only they are decoded (a wide file's other columns, images or long
    metadata, were read whole), unless one is missing or given twice: then every column is
    read, so the row's check names the field among the row's others."""

    wanted: frozenset[str]
    required: frozenset[str]

    def of(self, names: list[str]) -> list[str] | None:
        """The columns of a file with `names` to read, None for all of them."""
        if any(names.count(c) > 1 for c in self.wanted) or not self.required <= set(names):
            return None
        return [n for n in names if n in self.wanted]


def read_rows(path: Path, fmt: str, columns: Columns | None = None) -> Iterator[Row]:
    """Every row (example) of one local file, in order, for format jsonl/json/csv/parquet/
    arrow; of a Parquet or Arrow file only `columns` where they are given."""
    if path.is_dir() or not path.exists():
        raise UserError(f"{path}: not a data file")
    if path.suffix.lower() == ".zst":
        raise UserError(f"{path}: zstd-compressed; decompress it, or compress it with gzip")
    if compression(path) and fmt not in TEXT_FORMATS:
        raise UserError(
            f"{path}: a compressed {fmt} file; only jsonl, json and csv are read compressed: "
            "decompress it"
        )
    if fmt in ("jsonl", "json"):
        name = Path(path.stem) if compression(path) else path  # rows.jsonl.gz: rows.jsonl
        lines = name.suffix.lower() in (".jsonl", ".ndjson")  # a line is one example
        keys = None if lines else columns.wanted if columns else DETECTED_COLUMNS
        yield from json_rows(path, keys)
    elif fmt == "csv":
        yield from _csv_rows(path)
    elif fmt == "parquet":
        yield from _parquet_rows(path, columns)
    elif fmt == "arrow":
        yield from _arrow_rows(path, columns)
    else:
        raise UserError(f"{path}: cannot read format {fmt!r} (jsonl, json, csv, parquet, arrow)")


# --------------------------------------------------------------------------- CSV


# after \n, \r\n or a lone \r: CSV's line ends. str.splitlines also ends lines at \x0b, \x0c,
# \x1c-\x1e, \x85, \u2028 and \u2029, which pandas leaves unquoted inside a field.
LINE_END = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


def _lines(text: Text) -> Iterator[str]:
    rest = ""
    while not text.eof:
        chunk = rest + text.read()
        lines = LINE_END.split(chunk)
        rest = lines.pop()  # "" after a line end, else a line the next chunk goes on with
        if lines and lines[-1].endswith("\r") and not text.eof:  # its \n may come next
            rest = lines.pop() + rest
        if len(rest) > MAX_ITEM_BYTES:
            raise UserError(f"{text.path}: a line longer than {MAX_ITEM_BYTES >> 20} MB")
        yield from lines
    if rest:
        yield rest


def _csv_rows(path: Path) -> Iterator[Row]:
    """Rows of a CSV file with a header row, as {column: text}; a row with more or fewer
    fields than the header is an error naming it, and so is a quote out of place: read
    leniently, a quote never closed took every later row into one field, and `"a"b` read as
    `ab`."""
    csv.field_size_limit(MAX_ITEM_BYTES)
    with open_data(path) as fh:
        reader = csv.reader(_lines(Text(path, fh)), strict=True)
        ended = 0  # the line the last row read ended on
        try:
            header = next(reader, None)
            if header is None:
                return
            twice, ended = repeats(header), reader.line_num
            for number, fields in enumerate(reader, start=1):
                ended = reader.line_num
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise UserError(
                        f"{path}: row {number}: {len(fields)} fields where the header has "
                        f"{len(header)} (a comma or quote out of place?)"
                    )
                # an empty field is a missing value (CSV has no null)
                row = {k: (v if v != "" else None) for k, v in zip(header, fields, strict=True)}
                yield f"row {number}", marked(row, twice)
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                raise UserError(
                    f"{path}: line {ended + 1}: a quoted field opens on this line and is never "
                    'closed (a stray "?); every later line was read into it'
                ) from None
            raise UserError(f"{path}: line {reader.line_num}: not valid CSV ({exc})") from None


# --------------------------------------------------------------------------- Arrow


def _batches_as_rows(
    path: Path, batches: Iterator[pa.RecordBatch], chosen: list[str] | None = None, before: int = 0
) -> Iterator[Row]:
    """Each batch's rows, numbered on from `before`, of the `chosen` columns only where given
    (a Parquet reader's batches hold only the columns it was asked for already)."""
    number = before
    try:
        for batch in batches:
            if chosen is not None:
                batch = batch.select(chosen)
            try:
                rows = batch.to_pylist()
            except UnicodeDecodeError:  # Arrow keeps the bytes of a string as written
                raise UserError(_not_text(path, batch, number)) from None
            twice = repeats(batch.schema.names)
            for row in rows:
                number += 1
                yield f"row {number}", marked(row, twice)
    except (pa.ArrowException, OSError) as exc:
        raise _Unreadable(
            f"{path}: row {number + 1}: cannot be read ({type(exc).__name__})"
        ) from None


class _Unreadable(UserError):
    """Arrow or the disk failed on a batch (not a value the run refuses)."""


def _not_text(path: Path, batch: pa.RecordBatch, before: int) -> str:
    """Where in `batch` (after `before` rows) a string column holds bytes that are not UTF-8."""
    for i in range(batch.num_rows):
        for name in batch.column_names:
            try:
                batch.column(name).slice(i, 1).to_pylist()
            except UnicodeDecodeError:
                return (
                    f"{path}: row {before + i + 1}: column {shown_name(name)} holds bytes that "
                    "are not UTF-8 text; expected UTF-8 strings"
                )
    return f"{path}: row {before + 1}: holds bytes that are not UTF-8 text"


def column_names(path: Path, fmt: str) -> tuple[list[str], frozenset[str]] | None:
    """The column names of a Parquet or Arrow file, read from its schema alone, and those
    holding lists of objects (turns of a conversation); None for another format or a file
    that cannot be read (reading its rows names the problem)."""
    try:
        if fmt == "parquet":
            schema = pq.read_schema(path)
        elif fmt == "arrow":
            with pa.memory_map(str(path)) as source:
                schema = _arrow_batches(source)[0]
        else:
            return None
    except (pa.ArrowException, OSError):
        return None
    turns = frozenset(
        f.name
        for f in schema
        if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
        if pa.types.is_struct(f.type.value_type)
    )
    return list(schema.names), turns


def _parquet_rows(path: Path, columns: Columns | None) -> Iterator[Row]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path}: not a Parquet file ({type(exc).__name__})") from None
    chosen = columns.of(parquet.schema_arrow.names) if columns else None
    groups, before = parquet.metadata.num_row_groups, 0
    for group in range(groups):  # one at a time: the reader reads a group's pages ahead
        size = parquet.metadata.row_group(group).num_rows
        batches = parquet.iter_batches(ARROW_BATCH_ROWS, row_groups=[group], columns=chosen)
        try:
            yield from _batches_as_rows(path, batches, before=before)
        except _Unreadable:
            raise UserError(
                f"{path}: rows {before + 1}-{before + size} (row group {group + 1} of {groups}) "
                "cannot be read: the file is damaged or cut short; write or copy it again"
            ) from None
        before += size


def _arrow_batches(source: Any) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """Schema and batches of an Arrow IPC stream (what `datasets` writes) or file."""
    try:
        stream = pa.ipc.open_stream(source)
        return stream.schema, iter(stream)
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))


def _arrow_rows(path: Path, columns: Columns | None) -> Iterator[Row]:
    try:
        schema, batches = _arrow_batches(pa.memory_map(str(path)))
    except pa.ArrowException as exc:
        raise UserError(f"{path}: not an Arrow file ({type(exc).__name__})") from None
    yield from _batches_as_rows(path, batches, columns.of(schema.names) if columns else None)
