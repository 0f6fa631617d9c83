"""`expert-cli check`: validate a manifest and everything it points at, without training.

The report says: the manifest (path, name, version, schema), the resolved configuration with
the manifest's own field names, the decisions (notes), what a run would download from the hub,
the problems that stop a run, and the machine.
"""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from transformers import AutoTokenizer

from expert_cli.config import load_manifest
from expert_cli.config.environment import probe_environment
from expert_cli.config.resolve import ResolvedConfig, SourceRef, resolve
from expert_cli.errors import UserError

PEEK_ROWS = 5
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
KNOWN_LAYOUTS = (
    {"text"},
    {"messages"},
    {"instruction", "response"},
    {"instruction", "output"},
    {"prompt", "completion"},
)


@dataclass
class CheckReport:
    """What `check` found; `problems` empty means a run can start."""

    manifest: dict[str, Any]
    environment: dict[str, Any]
    config: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    downloads: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_manifest(path: Path) -> CheckReport:
    """Everything `check` reports about one manifest; never raises for bad input."""
    env = probe_environment()
    report = CheckReport(manifest={"path": str(path)}, environment=env.to_dict())
    try:
        loaded = load_manifest(path)
        resolved = resolve(loaded, env)
    except UserError as exc:
        report.problems = exc.lines
        return report
    m = loaded.manifest
    report.manifest.update(name=m.name, version=m.version, schema_version=m.schema_version)
    report.config = resolved.model_dump(mode="json", exclude={"notes"})
    report.notes = resolved.notes
    problems, downloads = _check_model(resolved)
    for source in resolved.train_sources + resolved.validation_sources:
        more, dl = _check_source(source, resolved.field_mapping)
        problems += more
        downloads += dl
    report.problems = problems
    report.downloads = downloads
    return report


# --------------------------------------------------------------------------- base model


def _check_model(cfg: ResolvedConfig) -> tuple[list[str], list[str]]:
    where = "base model"
    if cfg.base_model_kind == "hub":
        rev = f" at revision {cfg.revision}" if cfg.revision else ""
        return [], [
            f"{where}: {cfg.base_model}{rev} will be downloaded from the Hugging Face "
            "hub on first use (or read from its cache)"
        ]
    folder = Path(cfg.base_model)
    if not folder.is_dir():
        return [
            f"{where}: {folder} is not a folder (expected a local model folder with "
            "config.json, or a hub id such as Qwen/Qwen3-0.6B)"
        ], []
    problems = []
    if not (folder / "config.json").is_file():
        problems.append(f"{where}: {folder}/config.json is missing")
    if cfg.init == "pretrained" and not any(next(folder.glob(p), None) for p in WEIGHT_PATTERNS):
        problems.append(
            f"{where}: {folder} has no weights (*.safetensors or *.bin); add them, "
            'or set "init": "random" to train from a random initialisation'
        )
    problems += _check_tokenizer(folder, cfg)
    return problems, []


def _check_tokenizer(folder: Path, cfg: ResolvedConfig) -> list[str]:
    try:
        tok = AutoTokenizer.from_pretrained(
            str(folder), trust_remote_code=cfg.trust_remote_code, local_files_only=True
        )
    except Exception as exc:  # noqa: BLE001 - any loader failure is the user's folder
        return [f"tokenizer: cannot load from {folder} ({type(exc).__name__}: {exc})"]
    if not tok.is_fast:
        return [
            f"tokenizer: {folder} has only a slow tokenizer; expert-cli needs a fast one "
            "(tokenizer.json)"
        ]
    return []


# --------------------------------------------------------------------------- data


def _check_source(src: SourceRef, mapping: dict[str, str] | None) -> tuple[list[str], list[str]]:
    if src.kind == "hub":
        spec = src.location + (f" (split {src.split})" if src.split else "")
        return [], [
            f"dataset: {spec} will be downloaded from the Hugging Face hub on first "
            "use (or read from its cache)"
        ]
    path = Path(src.location)
    if not path.exists():
        return [f"{path}: dataset file not found"], []
    if path.is_dir():
        return [], []
    try:
        rows = _peek_rows(path, src.format)
    except UserError as exc:
        return exc.lines, []
    if not rows:
        return [f"{path}: no examples (the file is empty)"], []
    return _check_fields(path, rows, mapping), []


def _peek_rows(path: Path, fmt: str | None) -> list[dict[str, Any]]:
    """The first rows of a local file, with errors naming the file and line."""
    try:
        if fmt in ("jsonl", "json") and path.suffix != ".json":
            return _peek_jsonl(path)
        if fmt == "json" or path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8") or "[]")
            return data[:PEEK_ROWS] if isinstance(data, list) else [data]
        if fmt == "csv":
            with path.open(newline="", encoding="utf-8") as fh:
                return list(itertools.islice(csv.DictReader(fh), PEEK_ROWS))
        if fmt == "parquet":
            table = pq.ParquetFile(path).read_row_group(0) if path.stat().st_size else None
            return table.slice(0, PEEK_ROWS).to_pylist() if table is not None else []
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: cannot be read ({exc})") from None
    return [{}]  # arrow and other formats: left to the data path


def _peek_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{number}: expected a JSON object per line")
            rows.append(row)
            if len(rows) == PEEK_ROWS:
                break
    return rows


def _check_fields(
    path: Path, rows: list[dict[str, Any]], mapping: dict[str, str] | None
) -> list[str]:
    if rows == [{}]:
        return []
    columns = set().union(*(row.keys() for row in rows))
    if mapping:
        return [
            f"{path}: field '{column}' (training.dataset.field_mapping.{role}) is not in the "
            f"first rows; columns are: {', '.join(sorted(columns))}"
            for role, column in mapping.items()
            if column not in columns
        ]
    if any(layout <= columns for layout in KNOWN_LAYOUTS):
        return []
    return [
        f"{path}: no field_mapping and no known columns (text, messages, instruction/response)"
        f"; columns are: {', '.join(sorted(columns))}; set training.dataset.field_mapping"
    ]
