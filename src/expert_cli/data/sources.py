"""The manifest's data sources, read with errors that name file, line, field and shape.

Every problem a user can fix (a missing file, a malformed line, a row without a mapped field or
with the wrong type, an empty dataset) is a `UserError` raised here, before any model is
loaded. Local files are scanned by `rows.scan_local` (streamed, any JSON layout, CSV, Parquet,
Arrow; every row checked), and the mapped columns are written, renamed to their roles
(`text`, `messages`, `instruction`, `input`, `response`, `system`, `tools`), to an Arrow file
that the build reads memory-mapped. `check` runs the same scan without writing. Hub datasets
and saved dataset folders are read through `datasets` and checked by column (`check` then
reads their rows as a file's: data/dataset_rows.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from expert_cli.atomic import atomic_file
from expert_cli.config.resolve import SourceRef
from expert_cli.data.column_checks import first_not_utf8
from expert_cli.data.conversations import TURN_FORMS, conversation_text
from expert_cli.data.dataset_rows import as_text
from expert_cli.data.fields import (
    OPTIONAL_ROLES,
    TOOLS,
    FieldSpec,
    field_spec,
    source_fields,
)
from expert_cli.data.file_text import shown_names
from expert_cli.data.hub import dataset_snapshot
from expert_cli.data.rows import Scan, is_saved_dataset, scan_local
from expert_cli.data.tools import tools_problem, tools_text, typed_objects
from expert_cli.data.values import column_kind, expected_shape, messages_problem
from expert_cli.errors import RunError, UserError, exception_chain
from expert_cli.paths import shown_path

WRITE_BATCH_ROWS = 4096
MAX_EXAMPLES = 100_000_000  # after task weights: more than any run trains on
# what datasets.load_from_disk raises on a damaged folder: state.json not JSON or of another
# shape, an Arrow file missing or cut short
SAVED_DATASET_FAILURES = (
    IndexError,  # a split saved with no rows has no Arrow file (earlier versions wrote one)
    OSError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    pa.ArrowException,
)


def _arrow_value(role: str, value: Any) -> Any:
    # a conversation is kept whole, as JSON text (data/conversations.py); so are its tools
    if role == TOOLS:
        return tools_text(value)
    return conversation_text(value) if role == "messages" else value


def write_arrow(scan: Scan, dest: Path, on_rows: Callable[[int], None] | None = None) -> int:
    """Write the scan's rows to an Arrow stream file (what `datasets` memory-maps); the count.
    The file appears only when every row was read and checked."""
    roles = scan.fields.stored
    schema = pa.schema([(r, pa.string()) for r in roles])
    dest.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with (
        atomic_file(dest) as tmp,
        pa.OSFile(str(tmp), "wb") as sink,
        pa.ipc.new_stream(sink, schema) as writer,
    ):
        columns: dict[str, list[Any]] = {r: [] for r in roles}
        for row in scan.rows:
            for role in roles:
                columns[role].append(_arrow_value(role, row[role]))
            count += 1
            if count % WRITE_BATCH_ROWS == 0:
                writer.write_batch(pa.record_batch(columns, schema=schema))
                columns = {r: [] for r in roles}
                if on_rows is not None:
                    on_rows(WRITE_BATCH_ROWS)
        if columns[roles[0]]:
            writer.write_batch(pa.record_batch(columns, schema=schema))
    return count


def load_source(
    ref: SourceRef, fields: FieldSpec | None, mapping: dict[str, str] | None, work_dir: Path
) -> tuple[datasets.Dataset, FieldSpec]:
    """One source as a Dataset whose columns are the mapped roles."""
    if ref.kind == "local" and not is_saved_dataset(Path(ref.location)):
        scan = scan_local(ref, fields, mapping)
        # named the same in every process (str hashes differ per process): a resumed or
        # retried build writes over its copy, never a second one beside it
        named = hashlib.sha256(f"{ref.location}\0{ref.task}".encode()).hexdigest()[:16]
        dest = work_dir / f"source-{named}.arrow"
        write_arrow(scan, dest)
        return datasets.Dataset.from_file(str(dest)), scan.fields
    ds = load_hub(ref) if ref.kind == "hub" else load_saved(ref.location)
    ds, fields = checked_columns(ds, ref.location, fields, mapping)
    return (as_text(ds, work_dir) if fields.kind == "messages" else ds), fields


def load_saved(
    folder: Path | str,
    fix: str = "save it again with Dataset.save_to_disk, or point training.dataset.path at "
    "its source files",
    error: type[UserError] | type[RunError] = UserError,
) -> datasets.Dataset:
    """A `save_to_disk` folder, memory-mapped; `error` naming the folder (and the file it
    lacks) and saying `fix` where it is damaged: state.json not JSON, an Arrow file cut short
    or gone."""
    try:
        return datasets.load_from_disk(str(folder))
    except SAVED_DATASET_FAILURES as exc:
        retyped = _retyped(Path(folder)) if isinstance(exc, pa.ArrowException) else []
        why = (
            f"its dataset_info.json gives {shown_names(retyped)} a type other than its Arrow "
            "files hold"
            if retyped
            else _damage(exc)
        )
        raise error(f"{shown_path(folder)}: not a readable saved dataset ({why}); {fix}") from None


def _retyped(folder: Path) -> list[str]:
    """The columns whose type a saved dataset's dataset_info.json gives otherwise than its
    Arrow files' schema (a hand edit: loading casts and fails); [] where they agree or either
    cannot be read (then the files are what is damaged)."""
    splits = [folder] if (folder / "state.json").is_file() else sorted(folder.glob("*/"))
    for split in (s for s in splits if (s / "state.json").is_file()):
        try:
            state = json.loads((split / "state.json").read_text(encoding="utf-8"))
            info = json.loads((split / "dataset_info.json").read_text(encoding="utf-8"))
            wanted = datasets.Features.from_dict(info["features"]).arrow_schema
            first = split / state["_data_files"][0]["filename"]
            with pa.memory_map(str(first)) as source:
                held = pa.ipc.open_stream(source).schema
        except (OSError, ValueError, TypeError, KeyError, IndexError, pa.ArrowException):
            continue
        differ = [
            f.name for f in held if f.name in wanted.names and wanted.field(f.name).type != f.type
        ]
        if differ:
            return differ
    return []


def _damage(exc: BaseException) -> str:
    """What is wrong in a saved dataset folder, from what loading it raised (by kind: the
    messages are the libraries')."""
    lacks = getattr(exc, "filename", None) if isinstance(exc, FileNotFoundError) else None
    if lacks:
        return f"{shown_path(lacks)} is missing"
    if isinstance(exc, json.JSONDecodeError):
        return "its state.json or dataset_info.json is not JSON"
    if isinstance(exc, (OSError, pa.ArrowException)):
        return f"an Arrow file in it is damaged or cut short: {type(exc).__name__}"
    return type(exc).__name__


def checked_columns(
    ds: datasets.Dataset, where: str, fields: FieldSpec | None, mapping: dict[str, str] | None
) -> tuple[datasets.Dataset, FieldSpec]:
    """A hub or saved dataset's mapped columns, checked (present, of the role's type, no
    missing value, UTF-8 text) and renamed to their roles."""
    if mapping is None:  # detected from its own columns: those of turns (structs or JSON)
        turns = [n for n, f in ds.features.items() if _of_type(f, "messages") and not _texts(f)]
        fields = source_fields(ds.column_names, where, frozenset(turns), whole=True)
    elif fields is None:
        fields = field_spec(mapping, ds.column_names, where)
    _check_columns(ds, fields, where)
    keep = {col: role for role, col in fields.mapping.items() if col in ds.column_names}
    ds = ds.select_columns(list(keep)).rename_columns({c: r for c, r in keep.items() if c != r})
    for role in fields.mapping:  # a detected input/system it has not: empty, as in a file
        if role not in ds.column_names:
            ds = ds.add_column(role, pa.nulls(len(ds), pa.string()))
    if len(ds) == 0:
        raise UserError(f"{where}: no examples")
    return ds, fields


# the first line of the hub library's message for a dataset it cannot find or split (names of
# splits and configurations, not rows), cut to this length
HUB_MESSAGE_CHARS = 300


def load_hub(ref: SourceRef) -> datasets.Dataset:
    split = ref.split or "train"
    local = dataset_snapshot(ref.location, ref.revision)
    try:
        if local is not None:
            return datasets.load_dataset(str(local), ref.config, split=split)
        return datasets.load_dataset(ref.location, ref.config, split=split, revision=ref.revision)
    except datasets.exceptions.DatasetGenerationError as exc:
        # its files were fetched but not read: the causes' messages may quote a row (a CSV
        # parse error does), so only their kind is said, and where to get each row named
        raise UserError(
            f"{ref.field}: hub dataset {ref.location}: its data files could not be read into a "
            f"dataset ({_unreadable_because(exc)}); download them (hf download {ref.location} "
            f"--repo-type dataset --local-dir data/{ref.location.split('/')[-1]}) and set "
            "training.dataset.path to that folder: expert-cli's own reader names the file, "
            "line and field"
        ) from None
    except StopIteration:  # the builder found files but not one row in them
        raise UserError(
            f"{ref.field}: hub dataset {ref.location}: its data files hold no rows"
        ) from None
    except Exception as exc:  # offline, unknown id, unknown split: all the user's to fix
        said = str(exc).strip().splitlines()
        detail = f": {said[0][:HUB_MESSAGE_CHARS]}" if said else ""
        place = f"its cached snapshot, {shown_path(local)}" if local else "the hub or its cache"
        raise UserError(
            f"{ref.field}: hub dataset {ref.location}: cannot be read from {place} "
            f"({type(exc).__name__}{detail})"
        ) from None


def _unreadable_because(exc: BaseException) -> str:
    """What the first cause of a generation error was, by kind, never by message."""
    causes = exception_chain(exc, limit=9)[1:]
    if any(isinstance(c, UnicodeDecodeError) for c in causes):
        return "a file is not UTF-8 text"
    if isinstance(exc, datasets.exceptions.DatasetGenerationCastError) or any(
        isinstance(c, datasets.table.CastError) for c in causes
    ):
        return "its files do not all have the same columns"
    return f"{type(causes[0]).__name__} while parsing" if causes else "no cause given"


def _check_columns(ds: datasets.Dataset, fields: FieldSpec, where: str) -> None:
    for role, column in fields.mapping.items():
        if column not in ds.column_names and role in fields.maybe:
            continue
        named = fields.named(role)
        if column not in ds.column_names:
            raise UserError(
                f"{where}: field '{column}' missing ({named}); "
                f"columns are {shown_names(ds.column_names)}"
            )
        feature = ds.features[column]
        shape = fields.shape(role, isinstance(feature, datasets.Value))
        text = role == "messages" and _texts_of(feature)  # JSON text of turns (Toucan's)
        if not (_of_type(feature, shape) or text) or (shape != role and _texts(feature)):
            either = "an answer's text, or " if shape != role else ""  # a response's turns
            if role == "messages":  # beside a response, a prompt's text (xlam's query)
                either, shape = ("a prompt's text, or " if shape != role else ""), role
            raise UserError(
                f"{where}: field '{column}' ({named}) holds {column_kind(feature)}, expected "
                f"{either}{expected_shape(shape)} in every row"
            )
        values = ds.data.column(column)
        row = first_not_utf8(values)
        if row is not None:
            raise UserError(
                f"{where}: row {row + 1}: field '{column}' ({named}) holds bytes "
                "that are not UTF-8 text; expected UTF-8 strings"
            )
        checks = {"messages": messages_problem, TOOLS: tools_problem}
        if role == "messages" and shape != role:  # a prompt's text, or JSON text of turns
            bad = messages_problem(ds, column, prompts=True)
        else:
            bad = checks[shape](ds, column) if shape in checks else None
        if bad:
            raise UserError(f"{where}: row {bad[0] + 1}: field '{column}' ({named}) {bad[1]}")
        if role in OPTIONAL_ROLES:
            continue
        if values.null_count:
            row = pc.indices_nonzero(pc.is_null(values)).to_pylist()[0] + 1
            raise UserError(f"{where}: row {row}: field '{column}' missing ({named})")


def _texts_of(feature: Any) -> bool:
    """Whether a column holds text (a dataset's strings)."""
    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _texts(feature: Any) -> bool:
    """Whether a column holds lists of texts (LIMA's conversations)."""
    inner = getattr(feature, "feature", None)
    return (
        isinstance(feature, (datasets.List, datasets.LargeList))
        and isinstance(inner, datasets.Value)
        and inner.dtype in ("string", "large_string")
    )


TEXT_TYPES = ("string", "large_string", "null")  # a typed text column's (null: all empty)


def _of_type(feature: Any, role: str) -> bool:
    """Whether a column of `feature` holds what `role` reads."""
    if role == TOOLS:  # objects of any keys, or JSON (each row read by tools_problem)
        ok = (
            typed_objects(feature)
            or isinstance(feature, datasets.Json)
            or (
                isinstance(feature, (datasets.List, datasets.LargeList))
                and isinstance(feature.feature, datasets.Json)
            )
            or _texts(feature)  # each tool's JSON text (When2Call's)
            or (
                isinstance(feature, datasets.Value)
                and feature.dtype in ("string", "large_string", "null")
            )
        )
    elif role == "messages":
        inner = getattr(feature, "feature", None)
        keys = set(inner) if isinstance(inner, dict) else set()  # Json: keys that differ
        named = all(  # a turn's role (ShareGPT's `from`) is text: a list was a traceback
            isinstance(inner[k], datasets.Value) and inner[k].dtype in TEXT_TYPES
            for k in keys & {"role", "from"}
        )
        ok = isinstance(feature, (datasets.List, datasets.LargeList)) and (
            (named and any(keys >= form for form in TURN_FORMS))
            or isinstance(inner, datasets.Json)
            or _texts(feature)  # LIMA's texts: a user's and the assistant's turns in turn
        )
    else:
        ok = isinstance(feature, datasets.Value) and (
            feature.dtype in ("string", "large_string")
            or (feature.dtype == "null" and role in OPTIONAL_ROLES)
        )
    return ok
