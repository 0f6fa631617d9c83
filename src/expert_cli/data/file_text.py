"""A local data file's bytes as text, and the names an error may show.

A file is opened through its compression (gzip, bz2, xz) and decoded as UTF-8 a chunk at a time;
errors say where the bytes stop being text (the byte offset and its line) or the stream is
damaged. Objects that give a key more than once are marked, so that a field the run trains on
is refused rather than read as one of its values. Column names are shown only when they look
like names, and never more than a few: a "column" read from a file that is not tabular is the
file's data.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

from expert_cli.config.refs import compression
from expert_cli.errors import UserError

OPENERS = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}
# what a damaged or cut-short compressed stream raises on read
STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
CHUNK_BYTES = 1 << 20
MAX_ITEM_BYTES = 256 << 20  # one example (a JSON value, a CSV record) at most this big
SHOWN_NAMES = 12
NULL_DEPTH = 64  # nested objects deeper than this keep their nulls (no template looks there)
NAME_LIKE = re.compile(r"[\w .\-/]{1,40}")

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


def marked(row: dict[str, Any], repeated: frozenset[str]) -> dict[str, Any]:
    """`row`, marked with the keys it was given more than once (when there are any)."""
    if not repeated:
        return row
    marked = RepeatedKeys(row)
    marked.repeated = repeated
    return marked


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


class Text:
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


def open_data(path: Path) -> BinaryIO:
    try:
        if not path.is_file():
            raise UserError(f"{path}: not a regular file (a device, pipe or socket)")
        kind = compression(path)
        return OPENERS[kind](path, "rb") if kind else path.open("rb")  # type: ignore[return-value]
    except OSError as exc:
        raise UserError(
            f"{path}: cannot be opened ({exc.strerror or type(exc).__name__})"
        ) from None


def drop_nulls(value: Any, depth: int = 0) -> Any:
    """`value` without the keys whose value is null, at every depth up to NULL_DEPTH."""
    if depth > NULL_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: drop_nulls(v, depth + 1) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v, depth + 1) for v in value]
    return value
