"""Reading the manifest's data sources through `datasets`, with errors that name file, line, field.

Every problem a user can fix (a missing file, a malformed JSON line, a row without a mapped field,
an empty dataset) is a `UserError` raised here, before any model is loaded. JSON Lines files are
checked line by line by us first, because `datasets` reports a malformed line without its number.
Sources are reduced to the mapped columns, renamed to their roles (`text`, `messages`,
`instruction`, `input`, `response`, `system`), so that several files or tasks concatenate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc

from expert_cli.config.resolve import ResolvedConfig, SourceRef
from expert_cli.errors import UserError

ROLES = ("text", "messages", "instruction", "input", "response", "system")
OPTIONAL_ROLES = {"input", "system"}
SUFFIX_FORMATS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
MESSAGES_SHAPE = 'a list of {"role": ..., "content": ...} objects'
BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "arrow": "arrow"}


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
        f"{sorted(cols)}); set training.dataset.field_mapping, e.g. "
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
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIX_FORMATS)
    if not files:
        raise UserError(f"{path}: folder has no data files ({', '.join(SUFFIX_FORMATS)})")
    return files


def _builder(ref: SourceRef, files: list[Path]) -> str:
    if ref.format in BUILDERS:
        return BUILDERS[ref.format]
    kinds = {SUFFIX_FORMATS[f.suffix] for f in files if f.suffix in SUFFIX_FORMATS}
    if len(kinds) != 1:
        raise UserError(
            f"{ref.location}: cannot tell the file format (found "
            f"{sorted(kinds) or 'no known suffix'}); set training.dataset.format"
        )
    return kinds.pop()


def check_json_rows(path: Path, required: dict[str, str]) -> int:
    """Check a JSON Lines (or JSON array) file row by row; return the number of rows."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot be read ({exc})") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        for number, row in enumerate(rows, start=1):
            _check_row(path, f"row {number}", row, required)
        return len(rows)
    count = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        count += 1
        _check_row(path, f"line {lineno}", row, required, prefix=f"{path}:{lineno}")
    return count


def _check_row(
    path: Path, where: str, row: Any, required: dict[str, str], prefix: str | None = None
) -> None:
    head = prefix or f"{path}: {where}"
    if not isinstance(row, dict):
        raise UserError(f"{head}: expected a JSON object, got {type(row).__name__}")
    for role, column in required.items():
        value = row.get(column)
        if value is None:
            raise UserError(f"{head}: field '{column}' missing (field_mapping.{role})")
        if not _row_value_ok(role, value):
            raise UserError(
                f"{head}: field '{column}' (field_mapping.{role}) is "
                f"{type(value).__name__}, expected {_expected(role)}"
            )


def _expected(role: str) -> str:
    return MESSAGES_SHAPE if role == "messages" else "a string"


def _row_value_ok(role: str, value: Any) -> bool:
    if role != "messages":
        return isinstance(value, str)
    return isinstance(value, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value
    )


def _first_columns(first: Path) -> list[str]:
    """Column names of the first row of a JSON (Lines) file, or [] when unreadable."""
    with first.open(encoding="utf-8") as fh:
        head = fh.read(1 << 20)
    line = head.lstrip().lstrip("[").split("\n", 1)[0].strip().rstrip(",")
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return []
    return list(row) if isinstance(row, dict) else []


def load_source(
    ref: SourceRef, fields: FieldSpec | None, mapping: dict[str, str] | None, cache_dir: Path
) -> tuple[datasets.Dataset, FieldSpec]:
    """One source as a Dataset whose columns are the mapped roles."""
    if ref.kind == "hub":
        ds = _load_hub(ref)
        where = ref.location
    else:
        ds, where = _load_local(ref, fields, mapping, cache_dir)
    if fields is None:
        fields = field_spec(mapping, ds.column_names, where)
    _check_columns(ds, fields, where)
    keep = {col: role for role, col in fields.mapping.items()}
    ds = ds.select_columns(list(keep)).rename_columns({c: r for c, r in keep.items() if c != r})
    if len(ds) == 0:
        raise UserError(f"{where}: no examples")
    return ds, fields


def _load_local(
    ref: SourceRef, fields: FieldSpec | None, mapping: dict[str, str] | None, cache_dir: Path
) -> tuple[datasets.Dataset, str]:

    files = source_files(ref)
    path = Path(ref.location)
    if (path / "state.json").exists():
        return datasets.load_from_disk(str(path)), str(path)
    builder = _builder(ref, files)
    if builder == "json":
        spec = fields
        if spec is None:
            columns = _first_columns(files[0])
            if not columns and check_json_rows(files[0], {}) == 0:
                raise UserError(f"{files[0]}: no examples")
            spec = field_spec(mapping, columns, str(files[0]))
        required = {r: c for r, c in spec.mapping.items() if r in spec.required}
        if sum(check_json_rows(f, required) for f in files) == 0:
            raise UserError(f"{ref.location}: no examples")
    try:
        ds = datasets.load_dataset(
            builder, data_files=[str(f) for f in files], split="train", cache_dir=str(cache_dir)
        )
    except Exception as exc:  # datasets raises many types for unreadable files
        raise UserError(
            f"{ref.location}: cannot be read as {builder} ({type(exc).__name__}: {exc})"
        ) from None
    return ds, str(ref.location)


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
                f"columns are {ds.column_names}"
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
