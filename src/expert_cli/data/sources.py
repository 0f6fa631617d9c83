"""The manifest's data sources, read with errors that name file, line, field and shape.

Every problem a user can fix (a missing file, a malformed line, a row without a mapped field or
with the wrong type, an empty dataset) is a `UserError` raised here, before any model is
loaded. Local files go through `reader.read_rows` (streamed, any JSON layout, CSV, Parquet,
Arrow), every row is checked, and the mapped columns are written, renamed to their roles
(`text`, `messages`, `instruction`, `input`, `response`, `system`), to an Arrow file that the
build reads memory-mapped. `check` runs the same scan without writing. Hub datasets and saved
dataset folders are read through `datasets` and checked by column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from expert_cli.config.refs import FILE_FORMATS
from expert_cli.config.resolve import ResolvedConfig, SourceRef
from expert_cli.data.reader import read_rows, shown_name, shown_names
from expert_cli.errors import UserError

ROLES = ("text", "messages", "instruction", "input", "response", "system")
OPTIONAL_ROLES = {"input", "system"}
MESSAGES_SHAPE = 'a list of {"role": "...", "content": "..."} objects'
WRITE_BATCH_ROWS = 4096
MAX_EXAMPLES = 100_000_000  # after task weights: more than any run trains on
MESSAGE_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


@dataclass(frozen=True)
class FieldSpec:
    """Which column holds each role, and which of the three formats that makes."""

    kind: str  # "text" | "messages" | "instruction"
    mapping: dict[str, str]  # role -> column

    @property
    def required(self) -> list[str]:
        return [r for r in self.mapping if r not in OPTIONAL_ROLES]


@dataclass
class LoadedSources:
    """Training and evaluation examples (columns renamed to roles), with counts read."""

    train: datasets.Dataset
    eval: datasets.Dataset | None
    fields: FieldSpec
    read: dict[str, int]
    notes: list[str]


def field_spec(mapping: dict[str, str] | None, columns: list[str], where: str) -> FieldSpec:
    """Validate `field_mapping`, or detect it from the columns when unset."""
    if mapping is None:
        mapping = _detect_mapping(columns, where)
    unknown = sorted(set(mapping) - set(ROLES))
    if unknown:
        raise UserError(
            f"training.dataset.field_mapping: unknown key(s) {unknown}; "
            f"expected some of {list(ROLES)}"
        )
    if "text" in mapping:
        kind = "text"
    elif "messages" in mapping:
        kind = "messages"
    elif "instruction" in mapping and "response" in mapping:
        kind = "instruction"
    else:
        raise UserError(
            "training.dataset.field_mapping: needs `text`, `messages`, or "
            "`instruction` + `response` (optionally `input`, `system`)"
        )
    return FieldSpec(kind=kind, mapping=dict(mapping))


def _detect_mapping(columns: list[str], where: str) -> dict[str, str]:
    cols = set(columns)
    if "text" in cols:
        return {"text": "text"}
    if "messages" in cols:
        return {"messages": "messages"}
    response = next((c for c in ("response", "output", "completion") if c in cols), None)
    prompt = next((c for c in ("instruction", "prompt", "question") if c in cols), None)
    if prompt and response:
        found = {"instruction": prompt, "response": response}
        if "input" in cols:
            found["input"] = "input"
        return found
    raise UserError(
        f"{where}: cannot tell which column holds the data (columns: "
        f"{shown_names(sorted(cols))}); set training.dataset.field_mapping, e.g. "
        '{"text": "<column>"}'
    )


def source_files(ref: SourceRef) -> list[Path]:
    """The local files of a source (a file, or the data files of a folder), sorted."""
    path = Path(ref.location)
    if not path.exists():
        raise UserError(f"{path}: not found (training.dataset)")
    if path.is_file():
        return [path]
    if (path / "state.json").exists():  # a dataset folder written by save_to_disk
        return sorted(p for p in path.iterdir() if p.is_file())
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in FILE_FORMATS)
    if not files:
        raise UserError(f"{path}: folder has no data files ({', '.join(FILE_FORMATS)})")
    return files


def file_format(ref: SourceRef, files: list[Path]) -> str:
    """The format of a local source's files: the manifest's, else their suffix's."""
    if ref.format in ("jsonl", "json", "csv", "parquet", "arrow"):
        return ref.format
    kinds = {FILE_FORMATS[f.suffix] for f in files if f.suffix in FILE_FORMATS}
    kinds = {"json" if k == "jsonl" else k for k in kinds}  # one reader reads both layouts
    if len(kinds) != 1:
        raise UserError(
            f"{ref.location}: cannot tell the file format (found "
            f"{sorted(kinds) or 'no known suffix'}); set training.dataset.format"
        )
    return kinds.pop()


def _value_problem(role: str, value: Any) -> str | None:
    """What is wrong with a mapped field's value (None when it is right)."""
    if role in OPTIONAL_ROLES and value is None:
        return None
    if role != "messages":
        return None if isinstance(value, str) else f"is {_kind(value)}, expected a string"
    if not isinstance(value, list):
        return f"is {_kind(value)}, expected {MESSAGES_SHAPE}"
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            return f"item {i} is {_kind(message)}, expected an object with role and content"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                return f"item {i}: {key} is {_kind(message.get(key))}, expected a string"
    return None


KINDS = {
    "dict": "an object",
    "list": "a list",
    "int": "a number",
    "float": "a number",
    "bool": "a boolean",
    "str": "a string",
}


def _kind(value: Any) -> str:
    if value is None:
        return "missing (null)"
    return KINDS.get(type(value).__name__, f"a {type(value).__name__}")


def check_row(row: Any, fields: FieldSpec, where: str) -> dict[str, Any]:
    """The row's mapped values by role, or a UserError naming the place and the field."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected an object with named fields, found {_kind(row)}")
    out = {}
    for role, column in fields.mapping.items():
        value = row.get(column)
        if value is None and role not in OPTIONAL_ROLES:
            present = "" if column in row else f"; this row has {shown_names(list(row))}"
            raise UserError(
                f"{where}: field {shown_name(column)} missing (field_mapping.{role}){present}"
            )
        problem = _value_problem(role, value)
        if problem:
            raise UserError(f"{where}: field {shown_name(column)} (field_mapping.{role}) {problem}")
        out[role] = value
    return out


def _expected(role: str) -> str:
    return MESSAGES_SHAPE if role == "messages" else "a string"


@dataclass
class Scan:
    """The checked rows of one local source, by role, and the field mapping they follow."""

    fields: FieldSpec
    rows: Iterator[dict[str, Any]]


def _file_rows(files: list[Path], fmt: str) -> Iterator[tuple[str, Any]]:
    for path in files:
        for where, row in read_rows(path, fmt):
            yield (f"{path}:{where[5:]}" if where.startswith("line ") else f"{path}: {where}"), row


def scan_local(ref: SourceRef, fields: FieldSpec | None, mapping: dict[str, str] | None) -> Scan:
    """Every row of a local source, checked against the field mapping (detected from the
    first row when the manifest has none), streamed."""
    files = source_files(ref)
    rows = _file_rows(files, file_format(ref, files))
    first = next(rows, None)
    if first is None:
        why = "the file is empty" if len(files) == 1 else f"none of its {len(files)} files has rows"
        raise UserError(f"{ref.location}: no examples ({why})")
    where, row = first
    if fields is None:
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected an object with named fields, found {_kind(row)}")
        fields = field_spec(mapping, list(row), where)
    spec = fields

    def checked() -> Iterator[dict[str, Any]]:
        yield check_row(row, spec, where)
        for at, value in rows:
            yield check_row(value, spec, at)

    return Scan(fields, checked())


def _arrow_value(role: str, value: Any) -> Any:
    if role == "messages":
        return [{"role": m["role"], "content": m["content"]} for m in value]
    return value


def write_arrow(scan: Scan, dest: Path, on_rows: Callable[[int], None] | None = None) -> int:
    """Write the scan's rows to an Arrow stream file (what `datasets` memory-maps); the count."""
    roles = list(scan.fields.mapping)
    schema = pa.schema([(r, MESSAGE_TYPE if r == "messages" else pa.string()) for r in roles])
    dest.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with pa.OSFile(str(dest), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
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
    if ref.kind == "local" and not (Path(ref.location) / "state.json").exists():
        scan = scan_local(ref, fields, mapping)
        dest = work_dir / f"source-{abs(hash((ref.location, ref.task))):x}.arrow"
        write_arrow(scan, dest)
        return datasets.Dataset.from_file(str(dest)), scan.fields
    if ref.kind == "hub":
        ds, where = _load_hub(ref), ref.location
    else:
        ds, where = datasets.load_from_disk(ref.location), ref.location
    if fields is None:
        fields = field_spec(mapping, ds.column_names, where)
    _check_columns(ds, fields, where)
    keep = {col: role for role, col in fields.mapping.items()}
    ds = ds.select_columns(list(keep)).rename_columns({c: r for c, r in keep.items() if c != r})
    if len(ds) == 0:
        raise UserError(f"{where}: no examples")
    return ds, fields


def _load_hub(ref: SourceRef) -> datasets.Dataset:

    try:
        return datasets.load_dataset(
            ref.location, ref.config, split=ref.split or "train", revision=ref.revision
        )
    except Exception as exc:  # offline, unknown id, unknown split: all the user's to fix
        raise UserError(
            f"{ref.location}: cannot load from the hub or its local cache "
            f"({type(exc).__name__}: {exc})"
        ) from None


def _check_columns(ds: datasets.Dataset, fields: FieldSpec, where: str) -> None:

    for role, column in fields.mapping.items():
        if column not in ds.column_names:
            raise UserError(
                f"{where}: field '{column}' missing (field_mapping.{role}); "
                f"columns are {shown_names(ds.column_names)}"
            )
        _check_type(ds.features[column], role, column, where)
        if role in OPTIONAL_ROLES:
            continue
        values = ds.data.column(column)
        if values.null_count:
            row = pc.indices_nonzero(pc.is_null(values)).to_pylist()[0] + 1
            raise UserError(f"{where}: row {row}: field '{column}' missing (field_mapping.{role})")


def _check_type(feature: Any, role: str, column: str, where: str) -> None:
    """A mapped column must hold text (or, for `messages`, a list of role/content objects);
    anything else would be rendered with str() and trained on as if it were text."""

    if role == "messages":
        inner = getattr(feature, "feature", None)
        ok = (
            isinstance(feature, (datasets.List, datasets.LargeList))
            and isinstance(inner, dict)
            and {"role", "content"} <= set(inner)
        )
    else:
        ok = isinstance(feature, datasets.Value) and (
            feature.dtype in ("string", "large_string")
            or (feature.dtype == "null" and role in OPTIONAL_ROLES)
        )
    if not ok:
        raise UserError(
            f"{where}: field '{column}' (field_mapping.{role}) holds {feature}, "
            f"expected {_expected(role)} in every row"
        )


def hold_out(
    ds: datasets.Dataset, fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Split a seeded `fraction` of `ds` off for evaluation (at least one example)."""

    n = len(ds)
    if fraction <= 0 or n < 2:
        return ds, None
    k = max(1, round(n * fraction))
    perm = np.random.default_rng(seed).permutation(n)
    return ds.select(np.sort(perm[k:])), ds.select(np.sort(perm[:k]))


def apply_weight(ds: datasets.Dataset, weight: float, seed: int) -> datasets.Dataset:
    """Repeat `ds` int(weight) times and add a seeded sample of the fractional part."""

    if weight == 1.0:
        return ds
    n = len(ds)
    whole, frac = int(weight), weight - int(weight)
    extra = np.random.default_rng(seed).choice(n, size=round(frac * n), replace=False)
    index = np.concatenate([np.tile(np.arange(n), whole), np.sort(extra)])
    if len(index) == 0:
        index = np.array([0])
    return ds.select(index)


def load_sources(resolved: ResolvedConfig, cache_dir: Path) -> LoadedSources:
    """Read every training and validation source of the resolved config."""
    fields: FieldSpec | None = None
    train_parts, eval_parts, notes = [], [], []
    read = {"train": 0, "eval": 0}
    for i, ref in enumerate(resolved.train_sources):
        ds, fields = load_source(ref, fields, resolved.field_mapping, cache_dir)
        read["train"] += len(ds)
        if not resolved.validation_sources:
            ds, held = hold_out(ds, resolved.eval_fraction, resolved.seed + i)
            if held is not None:
                eval_parts.append(held)
        weighted = apply_weight(ds, ref.weight, resolved.seed + i)
        if ref.weight != 1.0:
            notes.append(
                f"task {ref.task}: weight {ref.weight}: {len(weighted)} examples from {len(ds)}"
            )
        train_parts.append(weighted)
    for ref in resolved.validation_sources:
        ds, fields = load_source(ref, fields, resolved.field_mapping, cache_dir)
        read["eval"] += len(ds)
        eval_parts.append(ds)
    assert fields is not None  # the manifest model requires at least one source
    return LoadedSources(
        train=_concat(train_parts),
        eval=_concat(eval_parts) if eval_parts else None,
        fields=fields,
        read=read,
        notes=notes,
    )


def _concat(parts: list[datasets.Dataset]) -> datasets.Dataset:

    if len(parts) == 1:
        return parts[0]
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError as exc:
        raise UserError(f"training.dataset: sources have different column types ({exc})") from None
