"""Fields HiveLLM's newer manifests use (expert-tools, expert-sql, late 2025) and its reference
CLI defines: `lr_scheduler_kwargs`, `gradient_checkpointing` as a name, its kwargs, and the
dataset's `validation_split`, `use_pretokenized`, `max_in_memory_samples`, `generation` and
`error_injection_ratio`. Each acts or is reported; a wrong one is a UserError naming it. Also
paths written on Windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import get_scheduler

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.config.schedules import SCHEDULER_ARGUMENTS, SCHEDULER_NEEDS, Scheduler
from expert_cli.errors import UserError
from expert_cli.train.args import training_args_kwargs

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _manifest(folder: Path, edit=None) -> Path:
    data = json.loads((FIXTURES / "hivellm_tools.json").read_text())
    if edit is not None:
        edit(data)
    (folder / "datasets").mkdir(exist_ok=True)
    for name in ("train.jsonl", "validation.jsonl"):
        (folder / "datasets" / name).write_text('{"text": "x"}\n')
    path = folder / "manifest.json"
    path.write_text(json.dumps(data))
    return path


def _config(**fields):
    def edit(data: dict) -> None:
        data["training"]["config"].update(fields)

    return edit


def _errors(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(UserError) as err:
        resolve(load_manifest(path, overrides), cpu_environment())
    return " ".join(" ".join(err.value.lines).split())


def test_the_tools_manifest_loads_and_each_field_acts_or_is_reported(tmp_path: Path) -> None:
    resolved = resolve(load_manifest(_manifest(tmp_path)), cpu_environment())
    assert resolved.lr_scheduler == "cosine_with_restarts"
    assert resolved.lr_scheduler_kwargs == {"num_cycles": 3}
    assert resolved.gradient_checkpointing is True
    assert resolved.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert resolved.eval_fraction == 0.0  # validation_path gives the validation set
    assert any(n.startswith("validation_split/eval_fraction: not applied") for n in resolved.notes)
    kwargs = training_args_kwargs(resolved, tmp_path / "c")
    assert kwargs["lr_scheduler_kwargs"] == {"num_cycles": 3}
    # kept as written for the package
    raw = json.loads(resolved.model_dump_json())
    assert raw["lr_scheduler_kwargs"] == {"num_cycles": 3}


def test_the_restart_schedule_restarts_as_many_times_as_asked(tmp_path: Path) -> None:
    """The resolved kwargs, as the Trainer hands them to transformers: 3 hard restarts over 12
    steps put the peak learning rate back at steps 4 and 8."""
    resolved = resolve(load_manifest(_manifest(tmp_path)), cpu_environment())
    kwargs = training_args_kwargs(resolved, tmp_path / "c")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = get_scheduler(
        kwargs["lr_scheduler_type"],
        optimizer,
        num_warmup_steps=0,
        num_training_steps=12,
        scheduler_specific_kwargs=kwargs["lr_scheduler_kwargs"],
    )
    rates = []
    for _ in range(12):
        rates.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert [i for i, r in enumerate(rates) if r == 1.0] == [0, 4, 8]
    assert min(rates[:4]) < 0.2


@pytest.mark.parametrize("schedule", Scheduler.__args__)
def test_every_schedule_runs_with_what_the_manifest_allows(schedule: str) -> None:
    """Each schedule the manifest accepts builds in transformers with the arguments our table
    names (its needed ones from the example the error gives), and the table names no argument
    the installed transformers would not take: cosine_with_min_lr and warmup_stable_decay
    used to stop the run with a traceback after the model had loaded."""
    import inspect

    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, SchedulerType

    taken = set(inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(schedule)]).parameters)
    assert set(SCHEDULER_ARGUMENTS[schedule]) <= taken
    kwargs = json.loads(SCHEDULER_NEEDS[schedule][1]) if schedule in SCHEDULER_NEEDS else {}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    built = get_scheduler(
        schedule,
        optimizer,
        num_warmup_steps=2,
        num_training_steps=400,
        scheduler_specific_kwargs=kwargs,
    )
    for _ in range(400):
        optimizer.step()
        built.step()
    assert 0.0 <= built.get_last_lr()[0] <= 1.0


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"lr_scheduler_kwargs": {"num_cycle": 3}},
            "lr_scheduler_kwargs: num_cycle: not an argument of the cosine_with_restarts "
            "schedule (it takes: num_cycles)",
        ),
        ({"lr_scheduler_kwargs": {"num_cycles": 2.5}}, "num_cycles: expected a whole number"),
        ({"lr_scheduler_kwargs": {"num_cycles": 0}}, "num_cycles: 0 is out of range"),
        ({"lr_scheduler_kwargs": {"num_cycles": True}}, "num_cycles: expected a whole number"),
        ({"lr_scheduler_kwargs": [3]}, "lr_scheduler_kwargs: Input should be a valid dict"),
        (
            {"lr_scheduler": "linear", "lr_scheduler_kwargs": {"num_cycles": 3}},
            "not an argument of the linear schedule (it takes: none)",
        ),
        (
            {"lr_scheduler": "cosine_with_min_lr", "lr_scheduler_kwargs": None},
            "training.config.lr_scheduler_kwargs: lr_scheduler cosine_with_min_lr needs "
            'min_lr or min_lr_rate here, e.g. {"min_lr_rate": 0.1}',
        ),
        (
            {
                "lr_scheduler": "cosine_with_min_lr",
                "lr_scheduler_kwargs": {"min_lr": 1e-6, "min_lr_rate": 0.1},
            },
            "give one of min_lr or min_lr_rate, not both",
        ),
        (
            {"lr_scheduler": "warmup_stable_decay", "lr_scheduler_kwargs": {}},
            "training.config.lr_scheduler_kwargs: lr_scheduler warmup_stable_decay needs "
            "num_decay_steps here",
        ),
        (
            {
                "lr_scheduler": "warmup_stable_decay",
                "lr_scheduler_kwargs": {"num_decay_steps": 9, "decay_type": "exp"},
            },
            "decay_type: expected one of linear, cosine, 1-sqrt",
        ),
        (
            {"lr_scheduler": "polynomial", "lr_scheduler_kwargs": {"lr_end": 0.001}},
            "training.config.lr_scheduler_kwargs.lr_end: 0.001 is the final learning rate and "
            "must be below the peak learning_rate (0.00045)",
        ),
        (
            {"lr_scheduler_kwargs": {"QQsecretQQ with spaces": 1}},
            "a key: not an argument of the cosine_with_restarts schedule",
        ),
        (
            {"gradient_checkpointing": "fully"},
            'training.config.gradient_checkpointing: expected true, false or one of "full", '
            '"selective", "unsloth", "none"',
        ),
        ({"gradient_checkpointing": []}, "training.config.gradient_checkpointing: expected true"),
        ({"gradient_checkpointing": {}}, "training.config.gradient_checkpointing: expected true"),
        (
            {"gradient_checkpointing_kwargs": {"use_reentrent": False}},
            "training.config.gradient_checkpointing_kwargs.use_reentrent: unknown field; did "
            "you mean use_reentrant?",
        ),
    ],
)
def test_a_wrong_value_names_the_field_and_what_is_expected(
    tmp_path: Path, fields: dict, expected: str
) -> None:
    text = _errors(_manifest(tmp_path, _config(**fields)))
    assert expected in text, text
    assert "QQsecretQQ" not in text


def test_a_schedule_changed_from_the_command_line_is_checked_too(tmp_path: Path) -> None:
    """`--set lr_scheduler=...` meets the manifest's kwargs: the pair is checked, and the error
    says how to match them; an error in a value `--set` gave is blamed on that `--set`."""
    path = _manifest(tmp_path)
    text = _errors(path, ["lr_scheduler=polynomial"])  # the --set that made them mismatch
    assert text.startswith(
        "--set lr_scheduler=polynomial: training.config.lr_scheduler_kwargs: num_cycles: not an "
        "argument of the polynomial schedule"
    ), text
    assert "set lr_scheduler_kwargs to null" in text
    text = _errors(path, ["lr_scheduler=warmup_stable_decay", "lr_scheduler_kwargs=null"])
    assert (
        "--set lr_scheduler_kwargs=null: training.config.lr_scheduler_kwargs: lr_scheduler "
        "warmup_stable_decay needs num_decay_steps here" in text
    )
    text = _errors(path, ["training.config.lr_scheduler_kwargs.num_cycles=2.5"])
    assert text.startswith(
        "--set training.config.lr_scheduler_kwargs.num_cycles=2.5: "
        "training.config.lr_scheduler_kwargs: num_cycles: expected a whole number"
    ), text
    text = _errors(path, ["training.dataset.eval_fraction=0.1"])
    assert text.startswith("--set training.dataset.eval_fraction=0.1: training.dataset."), text
    resolved = resolve(
        load_manifest(
            path,
            ["lr_scheduler=warmup_stable_decay", 'lr_scheduler_kwargs={"num_decay_steps": 50}'],
        ),
        cpu_environment(),
    )
    assert resolved.lr_scheduler_kwargs == {"num_decay_steps": 50}


def test_the_final_rate_of_the_polynomial_is_checked_at_its_default(tmp_path: Path) -> None:
    """transformers' polynomial ends at 1e-7 unless told: a peak at or below it would stop the
    run after the model loaded."""
    low = _config(lr_scheduler="polynomial", lr_scheduler_kwargs=None, learning_rate=1e-7)
    text = _errors(_manifest(tmp_path, low))
    assert "lr_end: 1e-07 (transformers' default) is the final learning rate" in text
    usual = _config(lr_scheduler="polynomial", lr_scheduler_kwargs=None, learning_rate=1e-4)
    assert (
        resolve(load_manifest(_manifest(tmp_path, usual)), cpu_environment()).lr_scheduler_kwargs
        == {}
    )


@pytest.mark.parametrize(
    ("value", "on", "note"),
    [
        (True, True, None),
        ("full", True, None),
        ("selective", True, "gradient_checkpointing: selective recomputation is not built"),
        ("unsloth", True, "gradient_checkpointing: unsloth recomputation is not built"),
        ("none", False, None),
        (False, False, None),
    ],
)
def test_checkpointing_names(tmp_path: Path, value, on: bool, note: str | None) -> None:
    path = _manifest(tmp_path, _config(gradient_checkpointing=value))
    resolved = resolve(load_manifest(path), cpu_environment())
    assert resolved.gradient_checkpointing is on
    noted = [n for n in resolved.notes if n.startswith("gradient_checkpointing:")]
    assert noted == ([] if note is None else [n for n in noted if n.startswith(note)])
    assert bool(noted) is (note is not None)
    kwargs = training_args_kwargs(resolved, tmp_path / "c")
    key = (
        "activation_checkpointing"
        if "activation_checkpointing" in kwargs
        else "gradient_checkpointing"
    )
    assert kwargs[key] is on


def test_checkpointing_options(tmp_path: Path) -> None:
    replay = {"use_reentrant": True, "preserve_rng_state": False}
    path = _manifest(tmp_path, _config(gradient_checkpointing_kwargs=replay, dropout=0.0))
    resolved = resolve(load_manifest(path), cpu_environment())
    assert resolved.gradient_checkpointing_kwargs == {
        "use_reentrant": False,
        "preserve_rng_state": False,
    }
    assert any(
        n.startswith("gradient_checkpointing_kwargs.use_reentrant: true is not applied")
        for n in resolved.notes
    )
    kwargs = training_args_kwargs(resolved, tmp_path / "c")
    key = next(k for k in kwargs if k.endswith("checkpointing_kwargs"))
    assert kwargs[key] == {"use_reentrant": False, "preserve_rng_state": False}


def test_recomputation_without_the_random_state_is_refused_with_dropout(tmp_path: Path) -> None:
    """preserve_rng_state false recomputes each layer with other dropout masks than its
    forward drew: gradients of another function than the loss, without a word."""
    replay = {"preserve_rng_state": False}
    assert _errors(_manifest(tmp_path, _config(gradient_checkpointing_kwargs=replay))) == (
        "training.config.gradient_checkpointing_kwargs.preserve_rng_state: false recomputes "
        "each layer with other adapter dropout masks (dropout 0.05) than its forward drew, so "
        "the gradients are not those of the loss: set it true (the default), or dropout to 0"
    )
    off = _config(gradient_checkpointing=False, gradient_checkpointing_kwargs=replay)
    (tmp_path / "off").mkdir()
    resolve(load_manifest(_manifest(tmp_path / "off", off)), cpu_environment())  # nothing replays
    ia3 = _config(gradient_checkpointing_kwargs=replay, adapter_type="ia3")  # no dropout
    (tmp_path / "ia3").mkdir()
    resolve(load_manifest(_manifest(tmp_path / "ia3", ia3)), cpu_environment())


def test_checkpointing_options_without_checkpointing_are_reported(tmp_path: Path) -> None:
    off = _config(
        gradient_checkpointing=False, gradient_checkpointing_kwargs={"use_reentrant": True}
    )
    notes = resolve(load_manifest(_manifest(tmp_path, off)), cpu_environment()).notes
    assert "gradient_checkpointing_kwargs: not applicable, gradient_checkpointing is off" in notes
    assert not [n for n in notes if "use_reentrant" in n]


def test_validation_split_holds_out_without_a_validation_file(tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        data["training"]["dataset"].pop("validation_path")

    resolved = resolve(load_manifest(_manifest(tmp_path, edit)), cpu_environment())
    assert resolved.eval_fraction == 0.15
    assert not [n for n in resolved.notes if n.startswith("validation_split")]


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [
        (
            {"validation_split": 0.7},
            "training.dataset.validation_split: Input should be less than 0.5",
        ),
        (
            {"validation_split": "15%"},
            "training.dataset.validation_split: Input should be a valid number",
        ),
        (
            {"validation_split": 0.1, "eval_fraction": 0.2},
            "training.dataset.eval_fraction: 0.2 differs from validation_split (0.1), which "
            "means the same; give one of them",
        ),
        (
            {"error_injection_ratio": 1.5},
            "training.dataset.error_injection_ratio: Input should be less than or equal to 1",
        ),
        (
            {"max_in_memory_samples": -1},
            "training.dataset.max_in_memory_samples: Input should be greater than or equal to 0",
        ),
        (
            {"use_pretokenized": "yes"},
            "training.dataset.use_pretokenized: Input should be a valid boolean",
        ),
    ],
)
def test_dataset_field_errors(tmp_path: Path, dataset: dict, expected: str) -> None:
    def edit(data: dict) -> None:
        data["training"]["dataset"].update(dataset)

    assert expected in _errors(_manifest(tmp_path, edit))


def test_dataset_hints_are_reported(tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        data["training"]["dataset"].update(use_pretokenized=False, max_in_memory_samples=1000)

    notes = resolve(load_manifest(_manifest(tmp_path, edit)), cpu_environment()).notes
    assert any(n.startswith("error_injection_ratio: not applied") for n in notes)
    assert any(n.startswith("use_pretokenized: false is not applied") for n in notes)
    assert any(n.startswith("streaming, max_in_memory_samples: the token cache") for n in notes)


@pytest.mark.parametrize(
    "name",
    [
        "F:/Node/hivellm/expert/models/Qwen3-0.6B",
        "C:\\models\\qwen",
        "C:models\\qwen",
        "\\\\server\\share\\qwen",
    ],
)
def test_a_windows_drive_path_is_named_as_one(tmp_path: Path, name: str) -> None:
    """HiveLLM's published manifests name the base model by a Windows drive path: `check`
    says so beside the other problems (the data's too), and `train`'s data step names it."""
    from expert_cli.data.checks import check_manifest
    from expert_cli.data.tokenizer import load_tokenizer

    def edit(data: dict) -> None:
        data["base_models"][0]["name"] = name
        data["training"]["dataset"]["path"] = "D:/data/train.jsonl"

    report = check_manifest(_manifest(tmp_path, edit))
    shown = " ".join(" ".join(report.problems).split())
    kind = "network path" if name.startswith("\\\\") else f"path, drive {name[0]}:"
    assert f"base model: {name} is not a folder (a Windows {kind}, which" in shown
    assert (
        "D:/data/train.jsonl: not found (training.dataset.path) (a Windows path, drive D:" in shown
    )
    assert str(tmp_path / "F:") not in shown  # not glued to the manifest's folder
    resolved = resolve(load_manifest(tmp_path / "manifest.json"), cpu_environment())
    with pytest.raises(UserError, match=r"is not a folder \(a Windows (path|network)"):
        load_tokenizer(resolved)  # where `train` first needs the model's folder


@pytest.mark.parametrize("value", ["F:/cache", "\\\\nas\\cache"])
def test_a_windows_path_where_expert_cli_writes_is_refused(tmp_path: Path, value: str) -> None:
    """The token cache would be made under the current folder, in a folder named `F:`."""
    text = _errors(_manifest(tmp_path, _config(pretokenized_cache=value)))
    assert f"training.config.pretokenized_cache {value}: a Windows" in text
    assert not (Path.cwd() / "F:").exists() and not list(tmp_path.glob("F:*"))


def test_a_relative_path_written_with_backslashes_is_found(tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        data["training"]["dataset"]["path"] = "datasets\\train.jsonl"

    resolved = resolve(load_manifest(_manifest(tmp_path, edit)), cpu_environment())
    assert resolved.train_sources[0].location == str(tmp_path / "datasets" / "train.jsonl")


def test_adapters_a_quantized_base_cannot_train_are_refused(tmp_path: Path) -> None:
    """LoKr on a 4-bit base and DoRA on an 8-bit one on a CPU passed `check` and failed in a
    step with a traceback from peft (a reshape to the packed weight's shape) or bitsandbytes
    (its 8-bit backward). They are exit 2 naming the quantization; on a GPU int8 DoRA is
    left to run, and LoKr on int8 trains."""
    from train_helpers import h100_environment

    def quantized(quantization: str):
        def edit(data: dict) -> None:
            data["base_models"][0]["quantization"] = quantization

        return edit

    lokr = _manifest(tmp_path, quantized("int4"))
    said = _errors(lokr, ["training.config.adapter_type=lokr"])
    assert "base_models[0].quantization: int4 cannot carry adapter_type lokr" in said
    int8 = _manifest(tmp_path, quantized("int8"))
    said = _errors(int8, ["training.config.adapter_type=dora"])
    assert "base_models[0].quantization: int8 with DoRA fails on a CPU" in said
    on_gpu = resolve(load_manifest(int8, ["training.config.adapter_type=dora"]), h100_environment())
    assert on_gpu.use_dora and on_gpu.quantization == "int8"
    lokr8 = resolve(load_manifest(int8, ["training.config.adapter_type=lokr"]), cpu_environment())
    assert lokr8.adapter_type == "lokr"
