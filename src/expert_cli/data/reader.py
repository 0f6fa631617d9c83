"""One reader for local data files, shared by `check` and the cache build.

It streams: memory is bounded by the largest single example (at most `MAX_ITEM_BYTES`), not by
the file. JSON is read in any layout (JSON Lines, one JSON array however it is indented,
pretty-printed objects one after another, a `.json` file holding lines); CSV with a header
row; Parquet and Arrow by record batch. Every problem is a `UserError` that names the file and
the line, row or byte offset, and the expected shape. No error quotes the file's data: column
names are shown only when they look like names, and never more than a few.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import json
import lzma
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from expert_cli.config.refs import TEXT_FORMATS, compression
from expert_cli.errors import UserError
from expert_cli.jsontext import json_int

OPENERS = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}
# what a damaged or cut-short compressed stream raises on read
STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
CHUNK_BYTES = 1 << 20
MAX_ITEM_BYTES = 256 << 20  # one example (a JSON value, a CSV record) at most this big
ARROW_BATCH_ROWS = 1024
CUT_MARGIN = 16  # characters: a \uXXXX escape, a number or `false` cut by the buffer
SHOWN_NAMES = 12
NAME_LIKE = re.compile(r"[\w .\-/]{1,40}")
_WHITESPACE = " \t\r\n"

Row = tuple[str, Any]  # (where: "line 12" / "row 3", the value read)


class RepeatedKeys(dict):  # type: ignore[type-arg]
    """An object (a JSON object, a CSV or Arrow row) that gave a key more than once: the last
    value is kept, as every JSON reader does; `repeated` names the keys, so that a field the
    run trains on is refused rather than read as one of its values."""

    repeated: frozenset[str] = frozenset()


def repeated_keys(value: Any) -> frozenset[str]:
    """The keys `value` (a row or an object in it) was given more than once."""
    return value.repeated if isinstance(value, RepeatedKeys) else frozenset()


def repeats(keys: list[str]) -> frozenset[str]:
    """The keys that appear more than once in `keys`."""
    return frozenset(k for k, n in Counter(keys).items() if n > 1)


def _marked(row: dict[str, Any], repeated: frozenset[str]) -> dict[str, Any]:
    """`row`, marked with the keys it was given more than once (when there are any)."""
    if not repeated:
        return row
    marked = RepeatedKeys(row)
    marked.repeated = repeated
    return marked


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict (`object_pairs_hook`: the pairs as written, repeats included)."""
    row = dict(pairs)
    return row if len(row) == len(pairs) else _marked(row, repeats([k for k, _ in pairs]))


def shown_name(name: str) -> str:
    """A column name as an error may show it: itself when it looks like a name, else only its
    length (a "column" read from a file that is not tabular is the file's data)."""
    text = str(name)
    return repr(text) if NAME_LIKE.fullmatch(text) else f"<a {len(text)}-character name>"


def shown_names(names: list[str]) -> str:
    """Up to SHOWN_NAMES column names, each as `shown_name` allows."""
    head = ", ".join(shown_name(n) for n in list(names)[:SHOWN_NAMES])
    more = len(names) - SHOWN_NAMES
    return head + (f" and {more} more" if more > 0 else "") if names else "none"


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
        yield from _json_rows(path)
    elif fmt == "csv":
        yield from _csv_rows(path)
    elif fmt == "parquet":
        yield from _parquet_rows(path, columns)
    elif fmt == "arrow":
        yield from _arrow_rows(path, columns)
    else:
        raise UserError(f"{path}: cannot read format {fmt!r} (jsonl, json, csv, parquet, arrow)")


# --------------------------------------------------------------------------- text


class _Text:
    """UTF-8 text of a binary file, a chunk at a time (a byte order mark is skipped), with the
    byte offset of each chunk and errors that say where the bytes stop being text: the byte
    offset and the line it is on."""

    def __init__(self, path: Path, fh: BinaryIO) -> None:
        self.path, self.fh = path, fh
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self.offset = 0  # bytes read
        self.newlines = 0  # in the bytes decoded before the last chunk read
        self.eof = False

    def read(self) -> str:
        try:
            data = self.fh.read(CHUNK_BYTES)
        except STREAM_ERRORS as exc:
            kind = compression(self.path)
            what = f"its {kind} data is damaged or cut short" if kind else "cannot be read"
            at = f" after {self.offset} bytes of text" if self.offset else ""
            raise UserError(f"{self.path}: {what}{at} ({type(exc).__name__})") from None
        self.eof = not data
        skip = len(codecs.BOM_UTF8) if self.offset == 0 and data.startswith(codecs.BOM_UTF8) else 0
        pending = self.decoder.getstate()[0]  # the start of a character cut by the last read
        try:
            text = self.decoder.decode(data[skip:], final=self.eof)
        except UnicodeDecodeError as exc:
            start = self.offset + skip - len(pending) + exc.start  # exc.start: in pending+data
            before = (pending + data[skip:])[: exc.start]
            line = self.newlines + before.count(b"\n") + 1
            of = " of its uncompressed text" if compression(self.path) else ""
            raise UserError(
                f"{self.path}:{line}: byte {start}{of}: not UTF-8 text (is the file binary, "
                "compressed or UTF-16? save it as UTF-8)"
            ) from None
        self.newlines += text.count("\n")
        self.offset += len(data)
        return text


def _open(path: Path) -> BinaryIO:
    try:
        if not path.is_file():
            raise UserError(f"{path}: not a regular file (a device, pipe or socket)")
        kind = compression(path)
        return OPENERS[kind](path, "rb") if kind else path.open("rb")  # type: ignore[return-value]
    except OSError as exc:
        raise UserError(
            f"{path}: cannot be opened ({exc.strerror or type(exc).__name__})"
        ) from None


# --------------------------------------------------------------------------- JSON


def _json_rows(path: Path) -> Iterator[Row]:
    """JSON values one after another (JSON Lines, concatenated objects), or the items of one
    top-level array; each with the line it starts on."""
    decoder = json.JSONDecoder(parse_int=json_int, object_pairs_hook=_object)
    with _open(path) as fh:
        text = _Text(path, fh)
        buf, pos, line = "", 0, 1
        in_array = None  # unknown until the first non-blank character
        while True:
            pos, line = _skip_blank(buf, pos, line)
            if pos >= len(buf) - 1 and not text.eof:  # keep one look-ahead character
                buf, pos = buf[pos:] + text.read(), 0
                continue
            if pos >= len(buf):
                if in_array:
                    raise UserError(f"{path}:{line}: the JSON array is not closed with ]")
                return
            if in_array is None:
                in_array = buf[pos] == "["
                if in_array:
                    pos += 1
                    continue
            if in_array and buf[pos] in ",]":
                if buf[pos] == "]":
                    pos, line = _skip_blank(buf, pos + 1, line)
                    if pos < len(buf) or not text.eof and text.read().strip():
                        raise UserError(f"{path}:{line}: text after the closing ] of the array")
                    return
                pos += 1
                continue
            value, end, buf, pos = _decode_one(decoder, text, buf, pos, line)
            yield f"line {line}", value
            line += buf.count("\n", pos, end)
            pos = end


def _skip_blank(buf: str, pos: int, line: int) -> tuple[int, int]:
    while pos < len(buf) and buf[pos] in _WHITESPACE:
        line += buf[pos] == "\n"
        pos += 1
    return pos, line


def _decode_one(
    decoder: json.JSONDecoder, text: _Text, buf: str, pos: int, line: int
) -> tuple[Any, int, str, int]:
    """The JSON value at `pos`, reading more of the file while it is cut off by the buffer."""
    while True:
        try:
            value, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError as exc:
            # near the end of what was read, the value may only be cut off: read on
            cut = exc.pos >= len(buf) - CUT_MARGIN or exc.msg.startswith("Unterminated")
            if cut and not text.eof:
                buf, pos = _more(text, buf, pos, line)
                continue
            at = exc.pos  # the line of the last token before the error, not of what follows
            while at > pos and buf[at - 1] in _WHITESPACE:
                at -= 1
            where = line + buf.count("\n", pos, at)
            raise UserError(f"{text.path}:{where}: invalid JSON ({exc.msg})") from None
        except RecursionError:
            raise UserError(f"{text.path}:{line}: JSON nested too deeply") from None
        if end >= len(buf) and not text.eof:  # a number may go on in the next chunk
            buf, pos = _more(text, buf, pos, line)
            continue
        return value, end, buf, pos


def _more(text: _Text, buf: str, pos: int, line: int) -> tuple[str, int]:
    if len(buf) - pos > MAX_ITEM_BYTES:
        raise UserError(
            f"{text.path}:{line}: one JSON value is larger than {MAX_ITEM_BYTES >> 20} MB "
            "(one example per value is expected)"
        )
    return buf[pos:] + text.read(), 0


# --------------------------------------------------------------------------- CSV


# after \n, \r\n or a lone \r: CSV's line ends. str.splitlines also ends lines at \x0b, \x0c,
# \x1c-\x1e, \x85, \u2028 and \u2029, which pandas leaves unquoted inside a field.
LINE_END = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


def _lines(text: _Text) -> Iterator[str]:
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
    fields than the header is an error naming it."""
    csv.field_size_limit(MAX_ITEM_BYTES)
    with _open(path) as fh:
        reader = csv.reader(_lines(_Text(path, fh)))
        try:
            header = next(reader, None)
            if header is None:
                return
            twice = repeats(header)
            for number, fields in enumerate(reader, start=1):
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise UserError(
                        f"{path}: row {number}: {len(fields)} fields where the header has "
                        f"{len(header)} (a comma or quote out of place?)"
                    )
                # an empty field is a missing value (CSV has no null)
                row = {k: (v if v != "" else None) for k, v in zip(header, fields, strict=True)}
                yield f"row {number}", _marked(row, twice)
        except csv.Error as exc:
            raise UserError(f"{path}: line {reader.line_num}: not valid CSV ({exc})") from None


# --------------------------------------------------------------------------- Arrow


def _batches_as_rows(
    path: Path, batches: Iterator[pa.RecordBatch], chosen: list[str] | None = None
) -> Iterator[Row]:
    """Each batch's rows, of the `chosen` columns only where given (a Parquet reader's
    batches hold only the columns it was asked for already)."""
    number = 0
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
                yield f"row {number}", _marked(row, twice)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(
            f"{path}: row {number + 1}: cannot be read ({type(exc).__name__})"
        ) from None


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


def column_names(path: Path, fmt: str) -> list[str] | None:
    """The column names of a Parquet or Arrow file, read from its schema alone; None for
    another format or a file that cannot be read (reading its rows names the problem)."""
    try:
        if fmt == "parquet":
            return list(pq.read_schema(path).names)
        if fmt == "arrow":
            with pa.memory_map(str(path)) as source:
                return list(_arrow_batches(source)[0].names)
    except (pa.ArrowException, OSError):
        return None
    return None


def _parquet_rows(path: Path, columns: Columns | None) -> Iterator[Row]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path}: not a Parquet file ({type(exc).__name__})") from None
    chosen = columns.of(parquet.schema_arrow.names) if columns else None
    batches = parquet.iter_batches(batch_size=ARROW_BATCH_ROWS, columns=chosen)
    yield from _batches_as_rows(path, batches)


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
