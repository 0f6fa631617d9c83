"""Fuzzing the two inputs a user hands us: manifests and data files (hypothesis).

Every case must end in success or a `UserError` (the CLI's exit 2) whose every line names where
the problem is (the manifest file, a JSON path, an option, a data file); never another
exception (a traceback), never a hang, and never a line that quotes a data file's content.
A slow-marked variant runs many more examples.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expert_cli.config import load_manifest
from expert_cli.config.environment import Environment
from expert_cli.config.resolve import SourceRef, resolve
from expert_cli.data.rows import scan_local
from expert_cli.data.sources import write_arrow
from expert_cli.errors import UserError

ENV = Environment(cpu_count=2)
MARKER = "QQ$SECRET:QQ"  # planted in data files (not name-like): no error may repeat it
BASE = {
    "name": "fuzz",
    "version": "0.1.0",
    "schema_version": "2.0",
    "base_models": [{"name": "model", "init": "random", "adapters": [{"type": "lora"}]}],
    "training": {
        "dataset": {"path": "train.jsonl", "field_mapping": {"text": "text"}},
        "config": {"rank": 8, "batch_size": 2, "max_seq_length": 128, "learning_rate": 1e-3},
    },
}
PATHS = [
    ("name",),
    ("schema_version",),
    ("base_models",),
    ("base_models", 0, "name"),
    ("base_models", 0, "init"),
    ("base_models", 0, "quantization"),
    ("base_models", 0, "trust_remote_code"),
    ("base_models", 0, "adapters"),
    ("base_models", 0, "adapters", 0, "r"),
    ("training",),
    ("training", "dataset"),
    ("training", "dataset", "path"),
    ("training", "dataset", "type"),
    ("training", "dataset", "format"),
    ("training", "dataset", "tasks"),
    ("training", "dataset", "field_mapping"),
    ("training", "dataset", "eval_fraction"),
    ("training", "dataset", "validation_split"),
    ("training", "dataset", "use_pretokenized"),
    ("training", "dataset", "max_in_memory_samples"),
    ("training", "dataset", "error_injection_ratio"),
    ("training", "config"),
    *[
        ("training", "config", key)
        for key in (
            "rank",
            "alpha",
            "dropout",
            "epochs",
            "max_steps",
            "learning_rate",
            "batch_size",
            "gradient_accumulation_steps",
            "max_seq_length",
            "dataloader_num_workers",
            "seed",
            "packing",
            "bf16",
            "attention",
            "fused_loss",
            "tokens_per_step",
            "warmup_ratio",
            "save_total_limit",
            "target_modules",
            "learing_rate",
            "lr_scheduler",
            "lr_scheduler_kwargs",
            "gradient_checkpointing",
            "gradient_checkpointing_kwargs",
            "pretokenized_cache",
        )
    ],
    ("training", "confg"),
    ("training", "distributed"),
]
LOCATION_WORDS = ("manifest.json", "training.", "base_model", "--", "train.jsonl", "schema")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        [
            "auto",
            "sdpa",
            "lora",
            "2.0",
            "/dev/zero",
            "../../etc/shadow",
            "a\x00b",
            "x" * 5000,
            "F:/models/x",
            "\\\\srv\\x",
            "full",
            "warmup_stable_decay",
            "cosine_with_min_lr",
            "num_cycles",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _set(data: dict, path: tuple, value: object) -> None:
    node = data
    for part in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(part, {})
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return
    if (
        isinstance(node, dict)
        or isinstance(node, list)
        and isinstance(path[-1], int)
        and path[-1] < len(node)
    ):
        node[path[-1]] = value


def _check_lines(lines: list[str]) -> None:
    for line in lines:
        assert any(word in line for word in LOCATION_WORDS), line
        assert MARKER not in line, line


def _manifest_case(tmp_path: Path, edits: list[tuple[tuple, object]], deletes: list[tuple]) -> None:
    data = json.loads(json.dumps(BASE))
    for path, value in edits:
        _set(data, path, value)
    for path in deletes:
        node = data
        for part in path[:-1]:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(path[-1], None)
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data, allow_nan=True))
    try:
        resolve(load_manifest(path), ENV)
    except UserError as exc:
        _check_lines(exc.lines)


manifest_edits = st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=4)
manifest_deletes = st.lists(st.sampled_from(PATHS), max_size=2)

# a conversation's turns, near enough to right that the checks past the first one run
turn_keys = ["role", "content", "from", "value", "weight", "tool_calls", "reasoning_content"]
turn_keys += ["function_call", "name", "id"]  # calls: ShareGPT's, OpenAI's earlier form
calls = ['{"name": "f", "arguments": {}}', '[{"name": "f", "parameters": "{}"}]', "[]"]
calls += ['{"name": "f", "arguments": \'{"a": 1}\'}', '{"name": "f", "arguments": "{"}']
roles = ["user", "assistant", "system", "tool", "function_call", "function-call", "function"]
turn_values = st.one_of(st.sampled_from([*roles, "observation", *calls, 0, 1]), values)
turns = st.lists(
    st.one_of(st.dictionaries(st.sampled_from(turn_keys), turn_values, max_size=4), st.text()),
    max_size=4,
)
# the columns detection reads: conversations, TRL's prompt and completion, a system prompt
# beside them, tools, Nemotron's input and output, KTO's label, xlam's query and answers
columns = ["text", "messages", "other", MARKER, "prompt", "completion", "system", "tools"]
columns += ["conversations", "input", "output", "label", "system_prompt", "query", "answers"]
json_rows = st.lists(
    st.one_of(  # a conversation as its JSON text too (Toucan's)
        st.dictionaries(
            st.sampled_from(columns), st.one_of(values, turns, turns.map(json.dumps)), max_size=4
        ),
        values,
    ),
    max_size=6,
)


def _data_bytes(rows: list, layout: str, noise: bytes) -> bytes:
    def dump(value: object) -> str:
        return json.dumps(value, allow_nan=True)

    if layout == "lines":
        text = "".join(dump(r) + "\n" for r in rows)
    elif layout == "array":
        text = json.dumps(rows, indent=2, allow_nan=True)
    elif layout == "csv":
        text = "text,note\n" + "".join(f"{dump(r)[:20]},{MARKER}\n" for r in rows)
    else:
        text = ""
    return (text + MARKER).encode() + noise if layout != "none" else noise + MARKER.encode()


def _data_case(tmp_path: Path, rows: list, layout: str, noise: bytes, fmt: str) -> None:
    suffix = {"json": ".json", "jsonl": ".jsonl", "csv": ".csv", "parquet": ".parquet"}[fmt]
    path = tmp_path / f"train{suffix}"
    path.write_bytes(_data_bytes(rows, layout, noise))
    ref = SourceRef(kind="local", location=str(path), format=fmt)
    try:  # read and written as the build writes a source (conversations joined, as text)
        scan = scan_local(ref, None, {"text": "text"} if layout == "csv" else None)
        count = write_arrow(scan, tmp_path / "out.arrow")
        assert count == len(datasets.Dataset.from_file(str(tmp_path / "out.arrow")))
    except UserError as exc:
        _check_lines([line.replace(str(path), "train.jsonl") for line in exc.lines])


def _run(
    tmp_path_factory: pytest.TempPathFactory, n: int, which: tuple[str, ...] = ("manifests", "data")
) -> None:
    @settings(
        max_examples=n,
        deadline=5000,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(edits=manifest_edits, deletes=manifest_deletes)
    def manifests(edits: list, deletes: list) -> None:
        _manifest_case(tmp_path_factory.mktemp("m"), edits, deletes)

    @settings(
        max_examples=n,
        deadline=5000,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(
        rows=json_rows,
        layout=st.sampled_from(["lines", "array", "csv", "none"]),
        noise=st.binary(max_size=40),
        fmt=st.sampled_from(["json", "jsonl", "csv", "parquet"]),
    )
    def data_files(rows: list, layout: str, noise: bytes, fmt: str) -> None:
        _data_case(tmp_path_factory.mktemp("d"), rows, layout, noise, fmt)

    if "manifests" in which:
        manifests()
    if "data" in which:
        data_files()


def test_fuzz_manifests_and_data(tmp_path_factory: pytest.TempPathFactory) -> None:
    _run(tmp_path_factory, 80)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["manifests", "data"])  # two tests: two workers share them
def test_fuzz_manifests_and_data_at_length(
    tmp_path_factory: pytest.TempPathFactory, which: str
) -> None:
    _run(tmp_path_factory, 400, (which,))


def test_the_fuzzers_own_checks_can_fail() -> None:
    with pytest.raises(AssertionError):
        _check_lines([f"{MARKER} leaked"])
    with pytest.raises(AssertionError):
        _check_lines(["no place named at all"])
    assert not math.isfinite(float("inf"))
