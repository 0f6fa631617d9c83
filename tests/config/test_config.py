"""The manifest models: HiveLLM 1.0/2.0 loading, comments, errors by JSON path, resolution."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from expert_cli.config import load_manifest, strip_comments
from expert_cli.config.environment import Environment, cpu_environment
from expert_cli.config.refs import split_hub_spec
from expert_cli.config.resolve import ResolvedConfig, resolve
from expert_cli.errors import UserError

FIXTURES = Path(__file__).parent.parent / "fixtures"
H100 = Environment(
    gpu_count=1,
    gpu_name="NVIDIA H100 80GB HBM3",
    gpu_capability=(9, 0),
    bf16=True,
    tf32=True,
    cpu_count=16,
    bitsandbytes="0.50.2",
    flash_attn=None,
)
T4 = Environment(
    gpu_count=1,
    gpu_name="Tesla T4",
    gpu_capability=(7, 5),
    bf16=False,
    tf32=False,
    cpu_count=4,
    bitsandbytes="0.50.2",
)


@pytest.fixture()
def v2_dir(tmp_path: Path) -> Path:
    shutil.copy(FIXTURES / "hivellm_v2.json", tmp_path / "manifest.json")
    return tmp_path


def _write(folder: Path, data: dict) -> Path:
    path = folder / "manifest.json"
    path.write_text(json.dumps(data))
    return path


def _mutate(folder: Path, edit) -> Path:
    data = json.loads((FIXTURES / "hivellm_v2.json").read_text())
    edit(data)
    return _write(folder, data)


def _errors(path: Path) -> list[str]:
    with pytest.raises(UserError) as info:
        load_manifest(path)
    return info.value.lines


def test_hivellm_v2_loads_unchanged_and_keeps_metadata(v2_dir: Path) -> None:
    loaded = load_manifest(v2_dir / "manifest.json")
    m = loaded.manifest
    assert m.schema_version == "2.0"
    assert m.primary_base_model.prompt_template == "chatml"  # "qwen3" is ChatML
    assert m.primary_adapter.r == 14 and m.primary_adapter.type == "dora"
    assert m.routing["keywords"] == ["sql", "select"]
    assert m.limitations[0]["pattern"] == "no_recursive_cte"
    assert m.training.decoding.top_k == 20 and m.training.decoding.model_extra == {}
    assert m.training.alternative_checkpoints["checkpoint-1250"]["step"] == 1250
    assert m.training.dataset.distributions == {
        "task_distribution": {"generation": 9, "correction": 1},
        "format_distribution": {"generic": 10},
    }
    assert m.training.config.gradient_accumulation_steps == 45
    assert "_comment" not in json.dumps(m.model_dump(mode="json"))
    assert loaded.raw["training"]["dataset"]["_comment"] == "c"  # the raw file is kept whole


def test_hivellm_v1_layout(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "hivellm_v1.json", tmp_path / "manifest.json")
    m = load_manifest(tmp_path / "manifest.json").manifest
    assert m.primary_base_model.quantization == "int8"
    assert m.primary_base_model.rope_scaling == "yarn-128k"
    assert m.primary_adapter.path == "weights/adapter.safetensors"
    cfg = resolve(load_manifest(tmp_path / "manifest.json"), cpu_environment())
    assert (cfg.rank, cfg.alpha, cfg.warmup_steps, cfg.epochs) == (16, 16.0, 100, 3.0)


def test_comments_are_dropped_at_any_depth() -> None:
    data = {"_a": 1, "b": [{"_c": 2, "d": {"_e": 3, "f": 4}}]}
    assert strip_comments(data) == {"b": [{"d": {"f": 4}}]}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda d: d["training"]["config"].__setitem__("learing_rate", 1e-4),
            "training.config.learing_rate: unknown field; did you mean learning_rate?",
        ),
        (
            lambda d: d["training"]["dataset"].__setitem__("feild_mapping", {}),
            "training.dataset.feild_mapping: unknown field; did you mean field_mapping?",
        ),
        (
            lambda d: d["base_models"][0]["adapters"][0].__setitem__("alpah", 3),
            "base_models[0].adapters[0].alpah: unknown field; did you mean alpha?",
        ),
        (
            lambda d: d["base_models"][0].__setitem__("quantisation", "int4"),
            "base_models[0].quantisation: unknown field; did you mean quantization?",
        ),
        (
            lambda d: d["training"]["config"].__setitem__("rank", 0),
            "training.config.rank: Input should be greater than or equal to 1",
        ),
        (
            lambda d: d["training"]["config"].__setitem__("dropout", 1.5),
            "training.config.dropout: Input should be less than 1",
        ),
        (
            lambda d: d["training"]["config"].__setitem__("learning_rate", -0.001),
            "training.config.learning_rate: Input should be greater than 0",
        ),
        (
            lambda d: d["training"]["config"].__setitem__("batch_size", "two"),
            'training.config.batch_size: expected a whole number of rows from 1 to 4096, or "auto"',
        ),
        (
            lambda d: d["training"]["config"].__setitem__("fp16", True),
            "training.config: fp16 and bf16 are both true; choose one",
        ),
        (
            lambda d: d["training"]["config"].__setitem__("num_epochs", 3),
            "training.config: epochs and num_epochs differ; give one of them",
        ),
        (
            lambda d: d["training"]["config"].__setitem__("adapter_type", "lorax"),
            "training.config.adapter_type: Input should be 'lora', 'dora', 'ia3', 'lokr' or "
            "'adalora'",
        ),
        (lambda d: d["training"]["dataset"].pop("path"), "training.dataset: `path` is required"),
        (lambda d: d.pop("base_models"), "schema 2.0 needs `base_models`"),
    ],
)
def test_errors_name_the_json_path(tmp_path: Path, edit, expected: str) -> None:
    lines = _errors(_mutate(tmp_path, edit))
    assert any(expected in line for line in lines), lines
    assert all(line.startswith("manifest.json: ") for line in lines)


def test_several_errors_are_reported_at_once(tmp_path: Path) -> None:
    def edit(d: dict) -> None:
        d["training"]["config"]["rank"] = 0
        d["training"]["config"]["optimm"] = "sgd"

    lines = _errors(_mutate(tmp_path, edit))
    assert len(lines) == 2
    assert "did you mean optim?" in lines[1]


def test_invalid_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text('{\n  "name": "x",\n  "version": 1,,\n}')
    [line] = _errors(path)
    assert line.startswith(f"{path}:3:")
    assert "invalid JSON" in line


def test_missing_manifest_file(tmp_path: Path) -> None:
    [line] = _errors(tmp_path / "nope.json")
    assert line.endswith("nope.json: manifest not found")


def test_paths_resolve_against_the_manifest_folder(v2_dir: Path) -> None:
    cfg = resolve(load_manifest(v2_dir / "manifest.json"), cpu_environment())
    # "models/base" could be a hub id (owner/name) until that folder exists
    assert (cfg.base_model, cfg.base_model_kind) == ("models/base", "hub")
    (v2_dir / "models" / "base").mkdir(parents=True)
    cfg = resolve(load_manifest(v2_dir / "manifest.json"), cpu_environment())
    assert cfg.base_model == str(v2_dir / "models" / "base")
    assert cfg.base_model_kind == "local"
    assert [s.location for s in cfg.train_sources] == [str(v2_dir / "datasets" / "train.jsonl")]
    assert cfg.validation_sources[0].location == str(v2_dir / "datasets" / "validation.jsonl")
    assert cfg.pretokenized_cache == str(v2_dir / ".cache" / "pretokenized")


def test_hub_ids_and_split_specs(tmp_path: Path) -> None:
    def edit(d: dict) -> None:
        d["base_models"][0]["name"] = "Qwen/Qwen3-0.6B"
        d["training"]["dataset"] = {
            "path": "neo4j/text2cypher-2024v1::train::default",
            "format": "huggingface",
            "revision": "abc",
        }

    cfg = resolve(load_manifest(_mutate(tmp_path, edit)), cpu_environment())
    assert (cfg.base_model, cfg.base_model_kind) == ("Qwen/Qwen3-0.6B", "hub")
    [src] = cfg.train_sources
    assert (src.kind, src.location, src.split, src.config, src.revision) == (
        "hub",
        "neo4j/text2cypher-2024v1",
        "train",
        "default",
        "abc",
    )
    assert split_hub_spec("a/b") == ("a/b", None, None)


def test_multi_task_sources_and_weights(tmp_path: Path) -> None:
    def edit(d: dict) -> None:
        d["training"]["dataset"] = {
            "type": "multi_task",
            "tasks": {
                "gen": {
                    "train": "gen.jsonl",
                    "valid": "gen_valid.jsonl",
                    "weight": 0.5,
                    "format": "jsonl",
                },
                "fix": {"train": "fix.jsonl", "weight": 2.0, "format": "jsonl"},
            },
        }

    cfg = resolve(load_manifest(_mutate(tmp_path, edit)), cpu_environment())
    assert [(s.task, s.weight) for s in cfg.train_sources] == [("gen", 0.5), ("fix", 2.0)]
    assert [s.task for s in cfg.validation_sources] == ["gen"]
    # fix has no valid file, and nothing of it is held out: the eval loss leaves it out
    assert (
        "training.dataset.tasks: fix has no valid file, and none of its examples is held out "
        "when another task has one: the eval loss measures only gen"
    ) in cfg.notes


def test_multi_task_fields_it_does_not_read_are_refused_or_noted(tmp_path: Path) -> None:
    """A task's unknown `format` was taken for the block's, a `validation_path` beside tasks
    was never read (2% of the training data held out instead), and `path` or `tasks` that the
    `type` leaves unread were dropped in silence."""
    tasks = {"gen": {"train": "gen.jsonl"}}

    def dataset(**block) -> Path:
        return _mutate(tmp_path, lambda d: d["training"].__setitem__("dataset", block))

    errors = _errors(dataset(type="multi_task", tasks={"gen": {"train": "g.jsonl", "format": "x"}}))
    assert errors[0].startswith(
        "manifest.json: training.dataset.tasks.gen.format: Input should be 'jsonl'"
    ), errors
    errors = _errors(dataset(type="multi_task", tasks=tasks, validation_path="valid.jsonl"))
    assert "validation_path is not read with type multi_task" in errors[0], errors
    cfg = resolve(load_manifest(dataset(type="multi_task", tasks=tasks, path="all.jsonl")), H100)
    assert [s.task for s in cfg.train_sources] == ["gen"]
    assert any(
        n.startswith("training.dataset.path: not read with type multi_task") for n in cfg.notes
    )
    cfg = resolve(load_manifest(dataset(type="single", tasks=tasks, path="all.jsonl")), H100)
    assert [s.location.rsplit("/", 1)[-1] for s in cfg.train_sources] == ["all.jsonl"]
    assert any(n.startswith("training.dataset.tasks: not read with type single") for n in cfg.notes)
    (tmp_path / "g.data").write_text("a,b\n")
    cfg = resolve(
        load_manifest(
            dataset(type="multi_task", tasks={"gen": {"train": "g.data", "format": "csv"}})
        ),
        H100,
    )
    assert cfg.train_sources[0].format == "csv"


def test_a_format_the_files_name_contradicts_is_refused_naming_the_field(tmp_path: Path) -> None:
    """The demo's `"format": "jsonl"` kept beside a path changed to a .parquet or .csv file
    read it as JSON lines ("not UTF-8 text", "invalid JSON"), and `huggingface` beside a
    local file looked for it on the hub ("no file of that name"): exit 2 naming the format
    field and the file's own format. A format of the same family (json for .jsonl) and one
    for a name that says none (.data) are read as before."""
    for name in ("t.parquet", "t.csv", "t.jsonl", "g.data"):
        (tmp_path / name).write_text("x")

    def resolved(**block):
        block = {"path": "t.parquet", **block}
        manifest = _mutate(tmp_path, lambda d: d["training"].__setitem__("dataset", block))
        return resolve(load_manifest(manifest), H100)

    for path, fmt, named in (("t.parquet", "jsonl", "parquet"), ("t.csv", "jsonl", "csv"),
                             ("t.jsonl", "csv", "jsonl")):  # fmt: skip
        with pytest.raises(UserError) as info:
            resolved(path=path, format=fmt)
        assert info.value.lines[0].startswith(
            f"training.dataset.format: {fmt}, and {tmp_path / path} is a {named} file by its "
            "name: remove format"
        ), info.value.lines
    with pytest.raises(UserError, match="training.dataset.format: huggingface reads training"):
        resolved(path="t.jsonl", format="huggingface")
    tasks = {"gen": {"train": "t.csv", "format": "parquet"}}
    with pytest.raises(UserError, match="training.dataset.tasks.gen.format: parquet, and"):
        resolved(type="multi_task", tasks=tasks)
    tasks = {"gen": {"train": "t.csv"}}  # the block's format, named as the block's field
    with pytest.raises(UserError, match="^training.dataset.format: parquet, and .*t.csv is a"):
        resolved(type="multi_task", tasks=tasks, format="parquet")
    assert resolved(path="t.jsonl", format="json").train_sources[0].format == "json"
    assert resolved(path="g.data", format="csv").train_sources[0].format == "csv"


def test_evaluation_with_nothing_to_evaluate_is_refused_by_check(tmp_path: Path) -> None:
    """evaluation_strategy steps beside no validation file and eval_fraction 0 passed check,
    then train built the cache and stopped: refused as the manifest is read."""
    (tmp_path / "t.jsonl").write_text("x")
    for held, said in (
        ("eval_fraction", "an eval_fraction"),
        ("validation_split", "a validation_split"),
    ):
        block = {"path": "t.jsonl", held: 0}
        manifest = _mutate(tmp_path, lambda d, b=block: d["training"].__setitem__("dataset", b))
        with pytest.raises(UserError) as info:
            resolve(load_manifest(manifest), H100)
        assert info.value.lines[0].startswith(
            "manifest.json: training.config.evaluation_strategy: steps, and the run has "
            f"nothing to evaluate (no validation file, and {said} of 0 holds none out)"
        ), info.value.lines
    data = json.loads(manifest.read_text())
    for key in ("load_best_model_at_end", "early_stopping_patience", "eval_on_start"):
        data["training"]["config"].pop(key, None)  # they read evaluations
    data["training"]["config"]["evaluation_strategy"] = "no"
    assert resolve(load_manifest(_write(tmp_path, data)), H100).evaluation_strategy == "no"
    del data["training"]["config"]["evaluation_strategy"]  # unset: no evaluation, no error
    assert resolve(load_manifest(_write(tmp_path, data)), H100).evaluation_strategy == "no"


def test_data_named_and_not_read_is_noted(tmp_path: Path) -> None:
    """A `test_path` naming no file (read by `evaluate` alone, after training) and a data
    folder's files of another format than the block's `format` (a parquet folder's .jsonl
    files) were left out in silence."""

    def dataset(**block) -> Path:
        return _mutate(tmp_path, lambda d: d["training"].__setitem__("dataset", block))

    (tmp_path / "all.jsonl").write_text('{"text": "a"}\n')
    cfg = resolve(load_manifest(dataset(path="all.jsonl", test_path="data/tset.jsonl")), H100)
    assert (
        "training.dataset.test_path: data/tset.jsonl is not there (evaluate --split test "
        "reads it; check the path)"
    ) in cfg.notes
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tset.jsonl").write_text("")
    cfg = resolve(load_manifest(dataset(path="all.jsonl", test_path="data/tset.jsonl")), H100)
    assert not [n for n in cfg.notes if "test_path" in n]
    assert [Path(r.location).name for r in cfg.test_sources] == ["tset.jsonl"]
    assert cfg.test_sources[0].field == "training.dataset.test_path"
    cfg = resolve(load_manifest(dataset(path="all.jsonl", test_path="::test")), H100)
    assert cfg.test_sources == []  # read by evaluate alone: said, training goes on
    assert (
        "training.dataset.test_path: names no dataset before its '::'; expected a local file or "
        "folder, or a hub id, e.g. data/train.jsonl or org/name::train (evaluate reads it; "
        "training does not)"
    ) in cfg.notes
    tasks = {"a": {"train": "all.jsonl", "test": "data/nope.jsonl"}}
    cfg = resolve(load_manifest(dataset(type="multi_task", tasks=tasks)), H100)
    assert (
        "training.dataset.tasks.a.test: data/nope.jsonl is not there (evaluate --split test "
        "reads it; check the path)"
    ) in cfg.notes

    folder = tmp_path / "mixed"
    folder.mkdir()
    for name in ("a.parquet", "b.jsonl", "c.jsonl.gz"):
        (folder / name).write_bytes(b"")
    cfg = resolve(load_manifest(dataset(path="mixed", format="parquet")), H100)
    assert (
        f"training.dataset.path: 2 data file(s) in {folder} are not read (b.jsonl, "
        "c.jsonl.gz): format parquet reads its own files only (split them into folders of one "
        "format each to train on both)"
    ) in cfg.notes
    cfg = resolve(load_manifest(dataset(path="mixed")), H100)
    assert not [n for n in cfg.notes if "data file(s)" in n]


def test_a_second_schemas_base_or_adapters_beside_the_first_is_refused(tmp_path: Path) -> None:
    """A 2.0 manifest with 1.0's top-level `adapters` beside base_models[0].adapters trained
    the latter and shipped the former; a 1.0 manifest with 2.0's `base_models` beside
    `base_model` trained base_models[0] without a word."""

    def top_adapters(d: dict) -> None:
        d["adapters"] = [{"type": "dora", "r": 4}]

    errors = _errors(_mutate(tmp_path, top_adapters))
    assert (
        "the top-level `adapters` (1.0's) beside it would be shipped but never trained"
        in (errors[0])
    ), errors

    def both_bases(d: dict) -> None:
        d["schema_version"] = "1.0"
        d["base_model"] = dict(d["base_models"][0])

    errors = _errors(_mutate(tmp_path, both_bases))
    assert "schema 1.0 uses `base_model`, not `base_models` (2.0's)" in errors[0], errors


def test_a_validation_file_with_evaluation_off_is_noted(tmp_path: Path) -> None:
    """evaluation_strategy "no" beside a validation_path: the file was tokenized and never
    evaluated, and the only note said validation_path gave the validation examples."""

    def no_eval(d: dict) -> None:
        d["training"]["config"]["evaluation_strategy"] = "no"
        d["training"]["config"]["load_best_model_at_end"] = False

    cfg = resolve(load_manifest(_mutate(tmp_path, no_eval)), H100)
    assert cfg.evaluation_strategy == "no"
    assert 'validation examples: never evaluated, as evaluation_strategy is "no"' in cfg.notes
    cfg = resolve(load_manifest(_mutate(tmp_path, lambda d: None)), H100)
    assert not any(n.startswith("validation examples: never") for n in cfg.notes)


def test_interval_and_length_settings_their_strategy_leaves_unread_are_noted(
    tmp_path: Path,
) -> None:
    """save_steps under save_strategy "no" or "epoch", eval_steps under evaluation "no",
    epochs beside max_steps, a compile mode with compile off: each was taken in silence."""

    def unread(d: dict) -> None:
        d["training"]["config"].update(
            save_strategy="no",
            save_steps=7,
            save_total_limit=2,
            evaluation_strategy="no",
            eval_steps=5,
            load_best_model_at_end=False,
            epochs=2,
            max_steps=5,
            torch_compile=False,
            torch_compile_mode="max-autotune",
        )

    notes = resolve(load_manifest(_mutate(tmp_path, unread)), H100).notes
    for said in (
        "save_steps: not applicable, save_strategy is no",
        "save_total_limit: not applicable, save_strategy is no",
        "eval_steps: not applicable, evaluation_strategy is no",
        "epochs: not applied; max_steps 5 sets the run's length",
        "torch_compile_backend/mode: not applicable, torch_compile is off",
    ):
        assert said in notes, (said, notes)


def test_resolved_config_round_trips_through_json(v2_dir: Path) -> None:
    cfg = resolve(load_manifest(v2_dir / "manifest.json"), H100)
    again = ResolvedConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg
    data = json.loads(cfg.model_dump_json())
    for key in (
        "rank",
        "alpha",
        "adapter_type",
        "learning_rate",
        "batch_size",
        "gradient_accumulation_steps",
        "max_seq_length",
        "epochs",
        "packing",
    ):
        assert key in data


def test_cpu_resolution_reports_what_does_not_apply(v2_dir: Path) -> None:
    cfg = resolve(load_manifest(v2_dir / "manifest.json"), cpu_environment())
    assert (cfg.bf16, cfg.fp16, cfg.use_tf32) == (True, False, False)
    assert cfg.optim == "adamw_torch"
    assert cfg.warmup_ratio == 0.1 and cfg.warmup_steps == 0
    assert cfg.save_total_limit is None  # null in the manifest means keep all
    fields = {note.split(":")[0] for note in cfg.notes}
    assert {
        "use_unsloth",
        "use_tf32",
        "optim",
        "activation_checkpointing",
        "cuda_graph_warmup_steps",
        "memory_clear_every",
    } <= fields


def test_gpu_resolution_picks_fast_settings(tmp_path: Path) -> None:
    def edit(d: dict) -> None:
        cfg = d["training"]["config"]
        for key in (
            "bf16",
            "fp16",
            "use_tf32",
            "optim",
            "dataloader_num_workers",
            "dataloader_pin_memory",
            "dataloader_prefetch_factor",
            "dataloader_persistent_workers",
            "flash_attention_2",
        ):
            cfg.pop(key)

    cfg = resolve(load_manifest(_mutate(tmp_path, edit)), H100)
    assert (cfg.bf16, cfg.fp16, cfg.use_tf32) == (True, False, True)
    assert cfg.optim == "adamw_torch_fused"
    assert cfg.attn_implementation == "sdpa"  # flash-attn not installed in H100 above
    assert (
        cfg.dataloader_num_workers,
        cfg.dataloader_pin_memory,
        cfg.dataloader_persistent_workers,
        cfg.dataloader_prefetch_factor,
    ) == (4, True, True, 4)
    flash = resolve(
        load_manifest(tmp_path / "manifest.json"),
        Environment(**{**H100.__dict__, "flash_attn": "2.7.4"}),
    )
    assert flash.attn_implementation == "flash_attention_2"
    t4 = resolve(load_manifest(tmp_path / "manifest.json"), T4)
    assert (t4.bf16, t4.fp16, t4.use_tf32) == (False, True, False)


def test_explicit_bf16_on_a_gpu_without_it_is_a_visible_decision(v2_dir: Path) -> None:
    cfg = resolve(load_manifest(v2_dir / "manifest.json"), T4)
    assert (cfg.bf16, cfg.fp16) == (False, True)
    assert any(n.startswith("bf16: Tesla T4 has no bf16") for n in cfg.notes)


def test_overrides_apply_before_validation(v2_dir: Path) -> None:
    loaded = load_manifest(
        v2_dir / "manifest.json",
        [
            "learning_rate=1e-4",
            "training.dataset.path=other.jsonl",
            "base_models.0.adapters.0.r=8",
            "packing=false",
        ],
    )
    cfg = loaded.manifest.training.config
    assert cfg.learning_rate == 1e-4 and cfg.packing is False
    assert loaded.manifest.training.dataset.path == "other.jsonl"
    assert loaded.manifest.primary_adapter.r == 8
    with pytest.raises(UserError, match="did you mean learning_rate"):
        load_manifest(v2_dir / "manifest.json", ["learing_rate=1"])
    with pytest.raises(UserError, match="expected key=value"):
        load_manifest(v2_dir / "manifest.json", ["learning_rate"])


def test_a_set_that_would_add_an_unknown_block_is_refused(v2_dir: Path) -> None:
    """The manifest keeps unknown top-level keys, so a misspelt block was kept and the value
    never reached training."""
    manifest = v2_dir / "manifest.json"
    with pytest.raises(UserError) as caught:
        load_manifest(manifest, ["trainng.config.rank=4"])
    assert caught.value.lines == [
        "--set trainng.config.rank=4: trainng is not a block of the manifest; did you mean "
        "training? (a bare key such as rank=4 sets training.config.rank)"
    ]
    with pytest.raises(UserError, match="zzz is not a block of the manifest \\("):
        load_manifest(manifest, ["zzz.q=1"])
    # a bare key is training.config's, but for the manifest's own top-level fields, which
    # no --set could reach (a bare `version` was training.config.version: unknown)
    loaded = load_manifest(manifest, ["version=0.2.0", "description=new", "rank=4"])
    assert (loaded.manifest.version, loaded.manifest.description) == ("0.2.0", "new")
    assert loaded.manifest.training.config.rank == 4
    for key in (".rank", "rank.", "training..rank", "training. .rank"):  # was " is not a block"
        with pytest.raises(UserError, match="the key has an empty name between its dots"):
            load_manifest(manifest, [f"{key}=4"])
    loaded = load_manifest(manifest, ["training.distributed.strategy=ddp", "routing.x=1"])
    assert loaded.manifest.training.distributed.strategy == "ddp"  # known blocks may be added


def test_set_values_that_validate_badly_are_blamed_on_the_set_with_a_hint(v2_dir: Path) -> None:
    """`--set base_models=[]` was blamed on manifest.json (its line is about the manifest as a
    whole), and `--set version=1.0` (read as JSON: a number) was refused without a word on
    quoting."""
    manifest = v2_dir / "manifest.json"
    for item, said in (
        ("base_models=[]", "needs `base_models`"),
        ('base_model={"name": "x"}', "uses `base_models`, not `base_model`"),
    ):
        with pytest.raises(UserError) as caught:
            load_manifest(manifest, [item])
        assert [line.startswith(f"--set {item}: (top level): ") for line in caught.value.lines] == [
            True
        ], caught.value.lines
        assert said in caught.value.lines[0]
    # a field of text only takes the text (`schema_version=2.0` was the number 2.0, refused)
    loaded = load_manifest(manifest, ["version=1.0", "schema_version=2.0", "description=7"])
    assert (loaded.manifest.version, loaded.manifest.schema_version) == ("1.0", "2.0")
    assert loaded.manifest.description == "7"
    for given in ('version="1.10"', "version=1.10"):  # as written, not the number 1.1
        assert load_manifest(manifest, [given]).manifest.version == "1.10"
    with pytest.raises(UserError) as caught:  # elsewhere a number stays one, with a hint
        load_manifest(manifest, ["tags.0=5", "rank=8"])
    assert caught.value.lines == [
        "--set tags.0=5: tags[0]: Input should be a valid string (got a whole number); a --set "
        "value is read as JSON where it parses: quote it, --set 'tags.0=\"5\"'"
    ]
    with pytest.raises(UserError) as caught:  # a string given where a number goes: no hint
        load_manifest(manifest, ["rank=x"])
    assert caught.value.lines[0].endswith("(got a string of 1 character)")
    with pytest.raises(UserError) as caught:  # a long key is named by its length, once cut
        load_manifest(manifest, ["k" * 300 + "=1"])
    assert caught.value.lines[0].endswith(
        ": training.config.<a 300-character key>: unknown field"
    ), caught.value.lines
    with pytest.raises(UserError) as caught:  # an item past a list's end ("cannot set 0 there")
        load_manifest(manifest, ["tags.9=x"])
    assert caught.value.lines[0].startswith("--set tags.9=x: item 9 is past the end of the list")


def test_a_whole_number_in_exponent_form_on_the_command_line_is_that_number(
    v2_dir: Path,
) -> None:
    """`--set max_seq_length=1e3` was refused as a decimal number; it is 1000. A decimal
    point stays a decimal (the manifest is JSON HiveLLM's typed loader reads), said plainly."""
    manifest = v2_dir / "manifest.json"
    loaded = load_manifest(manifest, ["max_seq_length=1e3", "max_steps=2E+1", "warmup_steps=-0e0"])
    config = loaded.manifest.training.config
    assert (config.max_seq_length, config.max_steps) == (1000, 20)
    assert type(config.max_seq_length) is int and type(config.warmup_steps) is int
    assert (
        load_manifest(manifest, ["learning_rate=2e-4"]).manifest.training.config.learning_rate
        == 2e-4
    )
    for item in ("max_seq_length=1000.0", "max_seq_length=1.0e3"):
        with pytest.raises(UserError) as caught:
            load_manifest(manifest, [item])
        assert caught.value.lines == [
            f"--set {item}: training.config.max_seq_length: expected a whole number, written "
            "without a decimal point (got a decimal number)"
        ]
    with pytest.raises(UserError) as caught:
        load_manifest(manifest, ["warmup_steps=1e-1"])
    assert caught.value.lines[0].endswith("Input should be a valid integer (got a decimal number)")


def test_load_best_model_needs_matching_steps(tmp_path: Path) -> None:
    path = _mutate(tmp_path, lambda d: d["training"]["config"].__setitem__("eval_steps", 100))
    with pytest.raises(UserError, match="save_steps: 250 must be a multiple of eval_steps"):
        resolve(load_manifest(path), cpu_environment())


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        # the Trainer refused these at its start: a ValueError traceback after the model loaded
        (
            ["load_best_model_at_end=true", "save_strategy=no"],
            "save_strategy: no with load_best_model_at_end: checkpoints must be saved when the "
            "evaluations run (save_strategy steps, or best)",
        ),
        (["load_best_model_at_end=true", "save_strategy=epoch"], "save_strategy: epoch with"),
        # it saved no checkpoint at all, and said nothing
        (
            ["save_strategy=best", "evaluation_strategy=no", "load_best_model_at_end=false"],
            "save_strategy: best saves at each new best evaluation, and evaluation is off",
        ),
    ],
)
def test_checkpoint_settings_the_trainer_refuses_are_named(
    v2_dir: Path, sets: list[str], expected: str
) -> None:
    with pytest.raises(UserError) as caught:
        resolve(load_manifest(v2_dir / "manifest.json", sets), cpu_environment())
    assert caught.value.lines[0].startswith(f"manifest.json: training.config.{expected}")
    best = ["load_best_model_at_end=true", "save_strategy=best"]
    assert resolve(load_manifest(v2_dir / "manifest.json", best), cpu_environment())


def test_a_torch_compile_backend_or_mode_torch_lacks_is_named(v2_dir: Path) -> None:
    """A backend name dynamo does not know was its InvalidBackend traceback at the first step."""
    from expert_cli.train.speed import compile_problem

    def problem(*sets: str) -> str | None:
        loaded = load_manifest(v2_dir / "manifest.json", ["torch_compile=true", *sets])
        return compile_problem(resolve(loaded, cpu_environment()))

    assert problem("torch_compile_backend=foo").startswith(
        "training.config.torch_compile_backend: not a torch.compile backend of torch "
    )
    assert problem("torch_compile_mode=bogus").startswith(
        "training.config.torch_compile_mode: expected one of default,"
    )
    assert problem("torch_compile_backend=aot_eager", "torch_compile_mode=max-autotune") is None


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        # the evaluation measures the loss only: another metric was a KeyError traceback from
        # the Trainer at the first evaluation, after the model had loaded and a run folder begun
        (
            "metric_for_best_model",
            "eval_accuracy",
            "training.config.metric_for_best_model: expected eval_loss, loss, or a task's "
            "eval_<task>_loss",
        ),
        # the checkpoint of the highest loss would be kept as the best and shipped
        (
            "greater_is_better",
            True,
            "training.config: greater_is_better: true would call the checkpoint of the highest "
            "loss the best; a loss is better lower: false, or leave it unset",
        ),
    ],
)
def test_the_best_checkpoint_is_the_one_of_lowest_loss(
    tmp_path: Path, key: str, value: object, expected: str
) -> None:
    path = _mutate(tmp_path, lambda d: d["training"]["config"].__setitem__(key, value))
    with pytest.raises(UserError) as caught:
        load_manifest(path)
    assert any(expected in line for line in caught.value.lines), caught.value.lines
    for fine in ("loss", "eval_loss"):
        path = _mutate(
            tmp_path, lambda d, f=fine: d["training"]["config"].update(metric_for_best_model=f)
        )
        assert load_manifest(path).manifest.training.config.metric_for_best_model == fine


def test_eval_fraction_defaults_only_without_validation(tmp_path: Path) -> None:
    path = _mutate(tmp_path, lambda d: d["training"]["dataset"].pop("validation_path"))
    cfg = resolve(load_manifest(path), cpu_environment())
    assert cfg.eval_fraction == 0.02 and cfg.evaluation_strategy == "steps"
    path = _mutate(
        tmp_path,
        lambda d: (
            d["training"]["dataset"].pop("validation_path"),
            d["training"]["config"].update(evaluation_strategy="no", load_best_model_at_end=False),
        ),
    )
    cfg = resolve(load_manifest(path), cpu_environment())
    assert (cfg.eval_fraction, cfg.evaluation_strategy) == (0.0, "no")


def test_a_validation_source_also_read_for_training_is_noted(v2_dir: Path) -> None:
    """A validation file that is also the training file (or a task's valid that is its train)
    passed check and trained without a word: its eval loss measures the training data."""
    manifest = load_manifest(v2_dir / "manifest.json")
    assert not [n for n in resolve(manifest, cpu_environment()).notes if "also read" in n]
    same = ["training.dataset.validation_path=datasets/train.jsonl"]
    notes = resolve(load_manifest(v2_dir / "manifest.json", same), cpu_environment()).notes
    assert any(
        n.startswith(
            f"training.dataset.validation_path: {v2_dir / 'datasets' / 'train.jsonl'} is also "
            "read for training; the eval loss then measures examples the run trains on"
        )
        for n in notes
    )
    tasks = {
        "sql": {"train": "a.jsonl", "valid": "./a.jsonl"},
        "json": {"train": "b.jsonl", "valid": "c.jsonl"},
    }
    path = _mutate(
        v2_dir,
        lambda d: d["training"].__setitem__("dataset", {"type": "multi_task", "tasks": tasks}),
    )
    notes = resolve(load_manifest(path), cpu_environment()).notes
    (said,) = [n for n in notes if "also read for training" in n]
    assert said.startswith(
        f"training.dataset.tasks.sql.valid: {v2_dir / 'a.jsonl'} is also read for training; the "
        "eval loss then measures examples the run trains on"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "[]",
            "training.config.target_modules: List should have at least 1 item after validation, "
            "not 0; or Input should be 'all-linear'",
        ),
        (
            '[""]',
            "training.config.target_modules: String should have at least 1 character (at [0]); "
            "or Input should be 'all-linear'",
        ),
        (
            "5",
            "training.config.target_modules: Input should be a valid list (got a whole number); "
            "or Input should be 'all-linear'",
        ),
    ],
)
def test_target_modules_that_name_nothing_are_refused(
    v2_dir: Path, value: str, expected: str
) -> None:
    """An empty list reached peft, whose message named its own arguments (`target_parameters`).
    What each branch of the union expects is one line, not one line per branch."""
    with pytest.raises(UserError) as caught:
        load_manifest(v2_dir / "manifest.json", [f"target_modules={value}"])
    assert [line.split(": ", 1)[1] for line in caught.value.lines] == [expected]


def test_a_value_no_branch_of_a_union_takes_is_one_line(v2_dir: Path) -> None:
    """`rope_scaling` is a name or an object: a number is refused in one line naming the
    field, not one per branch with pydantic's branch name (`rope_scaling.str`) in the path."""
    manifest = json.loads((v2_dir / "manifest.json").read_text())
    manifest["base_models"][0]["rope_scaling"] = 5
    (v2_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError) as caught:
        load_manifest(v2_dir / "manifest.json")
    assert caught.value.lines == [
        "manifest.json: base_models[0].rope_scaling: Input should be a valid string (got a "
        "whole number); or Input should be a valid dictionary (got a whole number)"
    ]


def test_keys_named_like_types_stay_in_the_path(v2_dir: Path) -> None:
    """Tasks named `str` and `int` were taken for pydantic's union branch names: their four
    errors read as one line about the tasks block, each a bogus alternative ("; or")."""
    manifest = json.loads((v2_dir / "manifest.json").read_text())
    tasks = {"str": {"train": 5}, "int": {"train": "a.jsonl", "weight": "x"}}
    manifest["training"]["dataset"] = {"type": "multi_task", "tasks": tasks}
    (v2_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError) as caught:
        load_manifest(v2_dir / "manifest.json")
    assert caught.value.lines == [
        "manifest.json: training.dataset.tasks.str.train: Input should be a valid string (got a "
        "whole number)",
        "manifest.json: training.dataset.tasks.int.weight: Input should be a valid number (got "
        "a string of 1 character)",
    ]


def test_errors_within_one_branch_of_a_union_are_joined_with_and(v2_dir: Path) -> None:
    with pytest.raises(UserError) as caught:
        load_manifest(v2_dir / "manifest.json", ['target_modules=["", ""]'])
    assert [line.split(": ", 1)[1] for line in caught.value.lines] == [
        "training.config.target_modules: String should have at least 1 character (at [0]) and "
        "String should have at least 1 character (at [1]); or Input should be 'all-linear'"
    ]


def _adapter_notes(tmp_path: Path, edit) -> list[str]:
    cfg = resolve(load_manifest(_mutate(tmp_path, edit)), cpu_environment())
    return [n for n in cfg.notes if n.startswith(("adapter_type", "use_dora", "base_models"))]


def test_adapter_values_not_acted_on_are_noted(tmp_path: Path) -> None:
    """A conflicting type, DoRA asked of IA3, a second adapter entry and a second base model
    were dropped without a word (a conflicting rank already had its note)."""

    def conflict(data: dict) -> None:
        data["training"]["config"]["adapter_type"] = "lora"

    assert _adapter_notes(tmp_path, conflict) == [
        "adapter_type: training.config.adapter_type=lora is used; the adapter entry says type=dora"
    ]

    def lora_with_dora(data: dict) -> None:  # plain LoRA by name, DoRA by the entry
        data["training"]["config"]["adapter_type"] = "lora"
        data["base_models"][0]["adapters"][0].update(type="lora", use_dora=True)

    cfg = resolve(load_manifest(_mutate(tmp_path, lora_with_dora)), cpu_environment())
    assert cfg.use_dora and _adapter_notes(tmp_path, lora_with_dora) == [
        "adapter_type: lora with the adapter entry's use_dora true trains DoRA (LoRA with "
        "weight decomposition); set use_dora false on the entry for plain LoRA"
    ]

    def ia3_with_dora(data: dict) -> None:
        data["training"]["config"]["adapter_type"] = "ia3"
        data["base_models"][0]["adapters"][0].update(type="ia3", use_dora=True)

    assert _adapter_notes(tmp_path, ia3_with_dora) == [
        "use_dora: DoRA decomposes LoRA weights; not applied to ia3"
    ]
    # IA3 learns a scaling vector: a rank, alpha and dropout were said to be "used"
    cfg = resolve(load_manifest(_mutate(tmp_path, ia3_with_dora)), cpu_environment())
    entry = load_manifest(_mutate(tmp_path, ia3_with_dora)).manifest.primary_adapter
    assert entry.r is not None and entry.alpha is not None  # the fixture gives both
    unread = [n for n in cfg.notes if "not applicable to ia3, so not applied" in n]
    assert unread and unread[0].startswith("rank, alpha"), cfg.notes
    said_used = ("rank: training.config", "alpha: training.config", "dropout: training.config")
    assert not any(n.startswith(said_used) for n in cfg.notes)

    def feedforward_on_lora(data: dict) -> None:
        data["training"]["config"]["feedforward_modules"] = ["down_proj"]

    cfg = resolve(load_manifest(_mutate(tmp_path, feedforward_on_lora)), cpu_environment())
    assert "feedforward_modules: not applicable to dora, so not applied" in cfg.notes

    def more(data: dict) -> None:
        entry = data["base_models"][0]["adapters"][0]
        data["base_models"][0]["adapters"].append({**entry, "r": 4})
        data["base_models"].append({**data["base_models"][0], "name": "models/other"})

    assert _adapter_notes(tmp_path, more) == [
        "base_models[0].adapters: the first entry is the adapter trained; 1 more entry is kept "
        "as written, not trained",
        "base_models: the adapter is trained on base_models[0] only; 1 more entry is kept as "
        "written (the package lists them too), with no adapter trained for them",
    ]

    def adalora(data: dict) -> None:
        data["training"]["config"]["adapter_type"] = "adalora"
        data["base_models"][0]["adapters"][0]["type"] = "adalora"

    assert _adapter_notes(tmp_path, adalora) == [
        "adapter_type: adalora trains with peft's orthogonal regulariser (orth_reg_weight "
        "0.5) added to its loss; the loss logged and eval_loss are the language-model loss "
        "alone, as for the other adapter types"
    ]
    assert _adapter_notes(tmp_path, lambda data: None) == []

    def overridden(data: dict) -> None:
        data["training"]["config"].update(alpha=64, target_modules=["q_proj"])

    cfg = resolve(load_manifest(_mutate(tmp_path, overridden)), cpu_environment())
    assert "alpha: training.config.alpha=64.0 is used; the adapter entry says alpha=28.0" in (
        cfg.notes
    )
    assert (
        "target_modules: training.config.target_modules is used; the adapter entry gives other "
        "target_modules"
    ) in cfg.notes


@pytest.mark.parametrize(
    ("given", "on_h100", "on_t4"),
    [
        ({}, (True, False), (False, True)),
        ({"fp16": False}, (True, False), (False, False)),
        ({"bf16": False}, (False, False), (False, True)),
        ({"fp16": True}, (False, True), (False, True)),
        ({"bf16": False, "fp16": False}, (False, False), (False, False)),
    ],
)
def test_an_unset_precision_flag_takes_the_machines(
    tmp_path: Path, given: dict, on_h100: tuple, on_t4: tuple
) -> None:
    """One flag given `false`, the other unset: the unset one is the machine's own choice (a
    lone `fp16: false` had trained in fp32 on an H100; `bf16: false` there is fp32, as the
    H100's choice of fp16 is no); fp32 on a GPU is said."""

    def edit(m: dict) -> None:
        config = m["training"]["config"]
        config.pop("bf16", None), config.pop("fp16", None)
        config.update(given)

    manifest = _mutate(tmp_path, edit)
    for env, want in ((H100, on_h100), (T4, on_t4)):
        cfg = resolve(load_manifest(manifest), env)
        assert (cfg.bf16, cfg.fp16) == want, env.gpu_name
        said = any(n.startswith("bf16, fp16: mixed precision off") for n in cfg.notes)
        assert said == (want == (False, False))


def test_a_set_warmup_steps_takes_the_place_of_the_manifests_ratio() -> None:
    """The demo writes warmup_ratio, which wins over warmup_steps beside it: `--set
    warmup_steps=500` was noted as losing and not applied. It now replaces the ratio, unless
    a `--set` gives the ratio as well."""
    from train_helpers import ROOT

    demo = ROOT / "experts" / "demo" / "manifest.json"
    assert load_manifest(demo).manifest.training.config.warmup_ratio == 0.05
    given = load_manifest(demo, ["warmup_steps=500"])
    config = given.manifest.training.config
    assert (config.warmup_steps, config.warmup_ratio) == (500, None)
    cfg = resolve(given, cpu_environment())
    assert (cfg.warmup_steps, cfg.warmup_ratio) == (500, 0.0)
    assert not any(n.startswith("warmup_steps: warmup_ratio is set") for n in cfg.notes)
    both = load_manifest(demo, ["warmup_steps=500", "warmup_ratio=0.1"]).manifest.training
    assert (both.config.warmup_steps, both.config.warmup_ratio) == (500, 0.1)


def test_a_field_and_its_alias_are_one_field(tmp_path: Path) -> None:
    """`--set eval_strategy=no` on a manifest writing evaluation_strategy (the demo) was
    "evaluation_strategy: unknown field; did you mean evaluation_strategy?", as was the reverse,
    and a manifest giving both; a --set now replaces either spelling, and both in a file are
    one line naming the two."""
    from train_helpers import ROOT

    demo = ROOT / "experts" / "demo" / "manifest.json"
    assert load_manifest(demo).manifest.training.config.evaluation_strategy == "steps"
    for key in ("eval_strategy", "evaluation_strategy"):
        given = load_manifest(demo, [f"{key}=no"]).manifest.training.config
        assert given.evaluation_strategy == "no"
    data = json.loads(demo.read_text())
    config = data["training"]["config"]
    config["eval_strategy"] = config.pop("evaluation_strategy")
    aliased = tmp_path / "manifest.json"
    aliased.write_text(json.dumps(data))
    shutil.copytree(demo.parent / "data", tmp_path / "data")
    assert load_manifest(aliased).manifest.training.config.evaluation_strategy == "steps"
    given = load_manifest(aliased, ["evaluation_strategy=no"]).manifest.training.config
    assert given.evaluation_strategy == "no"
    config["evaluation_strategy"] = "no"
    aliased.write_text(json.dumps(data))
    with pytest.raises(UserError) as err:
        load_manifest(aliased)
    assert err.value.lines == [
        "manifest.json: training.config: evaluation_strategy and eval_strategy are one field "
        "(one is the other's alias); give one of them"
    ]


def test_dora_with_dropout_says_what_the_dropout_costs(tmp_path: Path) -> None:
    """DoRA with dropout runs the frozen weight on the input and on the dropped input (the
    reference's definition): a note says so; without dropout, or for LoRA, none."""

    def notes(edit) -> list[str]:
        cfg = resolve(load_manifest(_mutate(tmp_path, edit)), cpu_environment())
        return [n for n in cfg.notes if n.startswith("dropout:")]

    said = notes(lambda data: None)  # the fixture: DoRA, dropout 0.1
    assert said == [
        "dropout: 0.1 with DoRA runs each adapted projection's frozen matmul twice, forward and "
        "backward (on the input and on the dropped input, as DoRA's reference code and peft "
        "define it): 1.5x to 1.6x the step's matmul FLOPs of dropout 0 for Qwen3-0.6B with every "
        "projection adapted (examples of 2,048 to 500 tokens; counted, not timed); dropout 0 "
        "runs it once"
    ]

    def no_dropout(data: dict) -> None:
        data["training"]["config"]["dropout"] = 0.0
        data["base_models"][0]["adapters"][0]["dropout"] = 0.0

    def lora(data: dict) -> None:
        data["training"]["config"]["adapter_type"] = "lora"
        data["base_models"][0]["adapters"][0]["type"] = "lora"

    assert notes(no_dropout) == [] and notes(lora) == []


def test_packaging_checkpoint_best_without_evaluation_is_noted(v2_dir: Path) -> None:
    """`packaging_checkpoint: best` in a run that never evaluates passed check; package then
    had no loss to compare and refused."""
    manifest = v2_dir / "manifest.json"
    best = ["training.packaging_checkpoint=best"]

    def noted(*sets: str) -> list[str]:
        cfg = resolve(load_manifest(manifest, [*best, *sets]), cpu_environment())
        return [n for n in cfg.notes if n.startswith("training.packaging_checkpoint")]

    assert noted() == []
    (note,) = noted("evaluation_strategy=no", "load_best_model_at_end=false")
    assert note.startswith("training.packaging_checkpoint: best ships the adapter of lowest")


def test_the_steps_a_run_takes_are_said_before_it_starts() -> None:
    """Tokens and optimizer steps were known only once train started: pretokenize says the
    steps, on a GPU (batch_size auto unless given) and on a CPU where they differ."""
    from expert_cli.config.batching import optimizer_steps, steps_before_training
    from expert_cli.config.training_config import TrainingConfig

    cpu = {"batch_size": 2, "gradient_accumulation_steps": 1}
    unset = TrainingConfig(max_seq_length=2048)
    assert steps_before_training(unset, 100, cpu) == (
        "7 optimizer steps on a GPU (16 rows a step), 50 optimizer steps on a CPU (2 rows a "
        "step) for 1 epoch on one device"
    )
    given = TrainingConfig(batch_size=4, gradient_accumulation_steps=2, epochs=3)
    same = {"batch_size": 4, "gradient_accumulation_steps": 2}
    assert steps_before_training(given, 100, same) == (
        "39 optimizer steps (8 rows a step) for 3 epochs on one device"
    )
    assert steps_before_training(TrainingConfig(max_steps=500), 100, cpu) == "max_steps 500"
    # as the Trainer counts: micro-batches rounded up, then steps, then epochs
    assert optimizer_steps(9, 2, 2, 1) == 3 and optimizer_steps(9, 2, 2, 1.5) == 5
    assert optimizer_steps(1, 16, 1, 1) == 1 and optimizer_steps(9, 2, 1, 1, world=2) == 3


def test_pretokenize_says_the_steps_train_then_takes(tmp_path: Path, tiny_model_dir: Path) -> None:
    from train_helpers import run_here, write_expert

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=24, config={"epochs": 2})
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0, built.stdout + built.stderr
    (line,) = [ln.strip() for ln in built.stdout.splitlines() if ln.strip().startswith("steps:")]
    trained = run_here("train", "--manifest", str(manifest), "--output", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stdout + trained.stderr
    steps = json.loads((tmp_path / "run" / "metrics.json").read_text())["summary"]["steps"]
    assert line == f"steps: {steps} optimizer steps (2 rows a step) for 2 epochs on one device"
