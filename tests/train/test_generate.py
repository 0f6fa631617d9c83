"""`expert-cli generate`: prompts rendered as in training, the manifest's decoding settings,
validation examples split into prompt and reference exactly as they were trained, the base
model for comparison, and clear errors."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import write_jsonl
from train_helpers import run_here, run_main, signal_once

from expert_cli.errors import UserError
from expert_cli.train.generate import decoding_settings

QUESTION, ANSWER = "Count the orders.", "SELECT COUNT(*) FROM orders;"
# a tiny model learns one example by heart in 60 steps at this rate, without warmup or decay
MEMORISING = {
    "rank": 16,
    "alpha": 32,
    "dropout": 0.0,
    "learning_rate": 1e-2,
    "batch_size": 4,
    "packing": False,
    "warmup_steps": 0,
    "lr_scheduler": "constant",
    "save_steps": 1000,
    "evaluation_strategy": "no",
}


@pytest.fixture(scope="module")
def memorised(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A run that has learned one instruction example by heart (greedy decoding repeats its
    answer with a logit margin of about 4 standard deviations at every token)."""
    folder = tmp_path_factory.mktemp("memorised")
    rows = [{"q": QUESTION, "a": ANSWER}] * 32
    write_jsonl(folder / "data" / "train.jsonl", rows)
    write_jsonl(folder / "data" / "valid.jsonl", rows[:2])
    manifest = {
        "name": "expert-memorised",
        "version": "0.0.1",
        "schema_version": "2.0",
        "base_models": [
            {
                "name": str(tiny_model_dir),
                "prompt_template": "chatml",
                "adapters": [{"type": "lora", "target_modules": "all-linear"}],
            }
        ],
        "training": {
            "dataset": {
                "path": "data/train.jsonl",
                "validation_path": "data/valid.jsonl",
                "field_mapping": {"instruction": "q", "response": "a"},
            },
            "config": {**MEMORISING, "max_seq_length": 64},
            "decoding": {"temperature": 0.0, "top_p": 0.8, "max_tokens": 24, "grammar": "x"},
        },
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    out = folder / "out"
    done = run_here(
        "train", "-m", str(folder / "manifest.json"), "--output", str(out), "--max-steps", "60"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _json(capsys, monkeypatch, *args: str) -> dict:
    """`generate ARGS --json` in this process (the CLI's output path is tested by run_here)."""
    code, out, err = run_main(capsys, monkeypatch, "generate", *args, "--json")
    assert code == 0, out + err
    return json.loads(out)


@pytest.mark.slow
def test_eval_splits_validation_examples_as_trained(capsys, monkeypatch, memorised: Path) -> None:
    report = _json(capsys, monkeypatch, "--adapter", str(memorised), "--eval", "2")
    assert len(report["generations"]) == 2
    for g in report["generations"]:
        assert g["reference"] == ANSWER and QUESTION in g["prompt"]
        assert g["output"] == ANSWER and g["exact_match"] is True
    assert report["exact_match_rate"] == 1.0
    # the manifest's decoding: temperature 0 is greedy, max_tokens is the budget
    assert report["settings"]["do_sample"] is False and report["settings"]["max_new_tokens"] == 24
    assert "training.decoding.grammar: not used by generate" in report["notes"]


@pytest.mark.slow
def test_eval_reads_the_token_cache_the_run_trained_with(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """--eval tokenized the data files again: moved since the run, it failed; edited, it
    answered other examples than the run held out. It reads the run's own cache now, and says
    so when that cache is gone and the files are read again."""
    import shutil

    valid = memorised.parent / "data" / "valid.jsonl"
    original = valid.read_bytes()
    record = json.loads((memorised / "manifest.resolved.json").read_text())["runtime"]["data"]
    cache, away = Path(record["cache_dir"]), tmp_path / "away"
    again = (
        "--eval: the token cache the run trained with is gone or damaged; the data files were "
        "tokenized again, as they are now"
    )
    try:
        valid.unlink()
        report = _json(capsys, monkeypatch, "--adapter", str(memorised), "--eval", "1")
        assert report["generations"][0]["reference"] == ANSWER and again not in report["notes"]
        write_jsonl(valid, [{"q": "Name a table.", "a": "SELECT 1;"}] * 2)
        shutil.move(cache, away)
        report = _json(capsys, monkeypatch, "--adapter", str(memorised), "--eval", "1")
        assert report["generations"][0]["reference"] == "SELECT 1;" and again in report["notes"]
    finally:
        valid.write_bytes(original)
        if away.exists():
            shutil.move(away, cache)


@pytest.mark.slow
def test_a_prompt_is_rendered_as_in_training(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{QUESTION}\n\nList every table.\n")
    report = _json(
        capsys,
        monkeypatch,
        "--adapter",
        str(memorised),
        "--prompts",
        str(prompts),
        "--compare-base",
    )
    outputs = [(g["prompt"], g["output"]) for g in report["generations"]]
    assert outputs[0] == (QUESTION, ANSWER)  # the memorised answer: same template as training
    assert [p for p, _ in outputs] == [QUESTION, "List every table."]
    first = report["generations"][0]
    assert first["base_output"] is not None and first["base_output"] != ANSWER
    text = run_here("generate", "--adapter", str(memorised), "-p", QUESTION, "-p", "Hi.")
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("expert: ") == 2 and "prompt 2" in text.stdout
    assert f"expert: {ANSWER}" in text.stdout


@pytest.mark.slow
def test_generate_errors_are_exit_2(capsys, monkeypatch, memorised: Path, tmp_path: Path) -> None:
    def exit_2(*args: str) -> str:
        code, out, err = run_main(capsys, monkeypatch, "generate", *args)
        assert code == 2, out + err
        return " ".join(err.split())

    long = exit_2("--adapter", str(memorised), "-p", "Hi.", "-p", "orders " * 3000)
    assert "prompt 2: 3,0" in long and "tokens, over the model's context of 2,048" in long
    assert "orders" not in long  # named by number: a prompt may be a file's contents
    nothing = exit_2("--adapter", str(memorised))
    assert "give --prompt TEXT, --prompts FILE or --eval N" in nothing
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    assert f"--prompts {blank}: holds no prompt; expected one prompt per line" in exit_2(
        "--adapter", str(memorised), "--prompts", str(blank)
    )
    too_long = tmp_path / "long.txt"
    for tail in ("", "\n", "\nlast\n"):  # one over: the read holds it with its newline
        too_long.write_text("\n\nfirst\n\n" + "x" * 200_001 + tail)
        assert f"--prompts {too_long}:5: a line over 200,000 characters" in exit_2(
            "--adapter", str(memorised), "--prompts", str(too_long)
        )
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("adapter_config.json", "manifest.resolved.json", "tokenizer.json"):
        (broken / name).write_bytes((memorised / name).read_bytes())
    (broken / "tokenizer_config.json").write_bytes(
        (memorised / "tokenizer_config.json").read_bytes()
    )
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    assert f"--adapter {broken}: adapter_model.safetensors is damaged" in exit_2(
        "--adapter", str(broken), "-p", "x"
    )
    assert "no adapter_config.json" in exit_2("--adapter", str(tmp_path), "-p", "x")
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"fine\n\xff\xfe bad\n")
    assert f"--prompts {prompts}: byte 5: not UTF-8 text" in exit_2(
        "--adapter", str(memorised), "--prompts", str(prompts)
    )
    assert "--system: empty" in exit_2("--adapter", str(memorised), "-p", "x", "--system", " ")
    alone = exit_2("--adapter", str(memorised), "--eval", "1", "--system", "Be brief.")
    assert "--system: goes with --prompt or --prompts" in alone


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        # was "cannot load its tokenizer (JSONDecodeError)", naming no file
        ({"tokenizer_config.json": b'{"a":'}, "tokenizer_config.json: not readable JSON; copy"),
        ({"tokenizer.json": b'{"version": "1.0"}'}, "tokenizer.json: not a tokenizer the"),
        ({"tokenizer.json": None}, ": tokenizer.json: missing beside tokenizer_config.json"),
        (
            {"tokenizer.json": None, "tokenizer_config.json": None},
            "no tokenizer files (tokenizer.json, tokenizer_config.json) in it or its run folder",
        ),
    ],
)
def test_a_tokenizer_that_cannot_load_is_named(
    capsys, monkeypatch, memorised: Path, tmp_path: Path, damage: dict, expected: str
) -> None:
    """generate and merge said `cannot load its tokenizer (JSONDecodeError)`: the file and
    what is wrong with it are named, before the model loads, and merge writes nothing."""
    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    for name, data in damage.items():
        (run / name).unlink() if data is None else (run / name).write_bytes(data)
    for command in (["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "merged")]):
        code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(run))
        said = " ".join(err.split())
        assert code == 2 and expected in said and "Traceback" not in said, out + err
    assert not (tmp_path / "merged").exists()


def test_a_checkpoint_without_its_marker_is_not_loaded(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """A checkpoint the run was stopped while writing (no `_COMPLETE`) was loaded by generate
    and merge, while package refused it as incomplete; it is refused alike, naming those kept."""
    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    for step in (1, 2):
        folder = run / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
            shutil.copy(run / name, folder / name)
    (run / "checkpoints" / "checkpoint-1" / "_COMPLETE").write_text('{"step": 1}')
    half = run / "checkpoints" / "checkpoint-2"
    weights = half / "adapter_model.safetensors"  # cut short by the stop, as it would be
    weights.write_bytes(weights.read_bytes()[:-100])
    for command in (["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "merged")]):
        code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(half))
        said = " ".join(err.split())
        assert code == 2, out + err
        assert f"--adapter {half}: no _COMPLETE marker: the run was stopped while writing" in said
        assert "(the run keeps: checkpoint-1)" in said
    assert not (tmp_path / "merged").exists()
    whole = run / "checkpoints" / "checkpoint-1"
    code, out, err = run_main(
        capsys, monkeypatch, "generate", "-p", "x", "--max-new-tokens", "2", "--adapter", str(whole)
    )
    assert code == 0, out + err


def test_a_run_stopped_before_its_final_adapter_points_at_its_checkpoints(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """A run interrupted before its final adapter keeps complete checkpoints: generate and
    merge said the folder was "not the output folder of expert-cli train"; they name the
    latest checkpoint with sound weights and how to finish the run, and a run being trained
    now is said to be."""
    from filelock import FileLock
    from safetensors.torch import load_file, save_file

    from expert_cli.train.outputs import LOCK_NAME

    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    folder = run / "checkpoints" / "checkpoint-3"
    folder.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json"):
        shutil.move(run / name, folder / name)  # the final adapter was never written
    (folder / "trainer_state.json").write_text('{"global_step": 3}')
    (folder / "_COMPLETE").write_text('{"step": 3}')
    diverged = run / "checkpoints" / "checkpoint-4"  # saved as the run diverged: NaN
    shutil.copytree(folder, diverged)
    weights = diverged / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors[sorted(tensors)[0]].view(-1)[0] = float("nan")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    for command in (["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "merged")]):
        code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(run))
        said = " ".join(err.split())
        assert code == 2, out + err
        assert f"--adapter {run}: the run stopped before writing its final adapter" in said
        assert f"--adapter {folder}; sound: checkpoint-3" in said and "--resume" in said
    assert not (tmp_path / "merged").exists()
    # a run `train` is writing now: said so, not "stopped"
    with FileLock(str(run / LOCK_NAME)):
        code, out, err = run_main(capsys, monkeypatch, "generate", "-p", "x", "--adapter", str(run))
        said = " ".join(err.split())
        assert (
            code == 2 and f"--adapter {run}: an `expert-cli train` is writing this run now" in said
        )
        # package said it had stopped, finish it with --resume (which the lock refuses)
        code, out, err = run_main(capsys, monkeypatch, "package", "--adapter", str(run))
        said = " ".join(err.split())
        assert (
            code == 2 and f"--adapter {run}: an `expert-cli train` is writing this run now" in said
        )
        assert "--resume" not in said
        code, out, err = run_main(capsys, monkeypatch, "report", str(run))
        assert "which the run writes at its end (it is training now)" in " ".join(out.split())


def test_a_run_being_trained_before_its_first_checkpoint_is_said_to_be(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """A run folder a live `train` holds, before any checkpoint: `package` (and generate,
    merge) said "no adapter_config.json (expected the output folder of expert-cli train)"."""
    from filelock import FileLock

    from expert_cli.train.outputs import LOCK_NAME

    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    (run / "adapter_config.json").unlink()
    commands = (["package"], ["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "m")])
    with FileLock(str(run / LOCK_NAME)):
        for command in commands:
            code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(run))
            said = " ".join(err.split())
            assert code == 2, (command, out + err)
            assert f"--adapter {run}: an `expert-cli train` is writing this run now" in said
    code, out, err = run_main(capsys, monkeypatch, "package", "--adapter", str(run))
    assert code == 2 and "no adapter_config.json" in " ".join(err.split())
    assert not (tmp_path / "m").exists()


def test_a_base_config_edited_since_the_run_is_named(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """A base whose config.json no longer makes a model (transformers' strict configuration
    check: 1 layer, 2 layer types) was a traceback from generate and merge; it is named as
    `check` names it, exit 2."""
    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    base = tmp_path / "base"
    shutil.copytree(
        json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"], base
    )
    adapter = json.loads((run / "adapter_config.json").read_text())
    adapter["base_model_name_or_path"] = str(base)
    (run / "adapter_config.json").write_text(json.dumps(adapter))
    config = json.loads((base / "config.json").read_text())
    config["num_hidden_layers"] = 1
    config["layer_types"] = ["full_attention"] * 2
    (base / "config.json").write_text(json.dumps(config))
    for command in (["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "merged")]):
        code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(run))
        said = " ".join(err.split())
        assert code == 2, out + err
        assert "Traceback" not in err
        assert "config.json cannot be read as a model configuration" in said
        assert f"base model {base}" in said
    assert not (tmp_path / "merged").exists()
    # a consistent config of fewer layers: the adapter's weights for the others matched no
    # layer, and peft answered with the rest of the adapter, exit 0
    config["layer_types"] = ["full_attention"]
    (base / "config.json").write_text(json.dumps(config))
    for command in (["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "merged")]):
        code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(run))
        said = " ".join(err.split())
        assert code == 2, out + err
        # one layer's 7 projections, A and B each
        want = f"{run}/adapter_model.safetensors: 14 adapter weights match no layer of base model"
        assert f"{want} {base}" in said
    assert not (tmp_path / "merged").exists()
    # more layers than the files hold (they would start random), another size of a layer:
    # named, where generate answered from a partly random model and merge was a traceback
    for edit, expected in [
        ({"num_hidden_layers": 3, "layer_types": ["full_attention"] * 3}, "would start random"),
        ({"intermediate_size": 96}, "have another shape in its weights files"),
        # values no layer can be built with: an AssertionError, a ZeroDivisionError traceback
        ({"pad_token_id": 99999}, "its config.json holds values no model can be built from"),
        ({"head_dim": 0}, "its config.json holds values no model can be built from"),
    ]:
        (base / "config.json").write_text(json.dumps({**config, **edit}))
        for command in (["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "merged")]):
            code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(run))
            said = " ".join(err.split())
            assert code == 2 and "Traceback" not in err, out + err
            assert f"base model {base}: " in said and expected in said
    assert not (tmp_path / "merged").exists()


def _manifest_of_its_own(run: Path, manifest: dict) -> Path:
    """The run trained from a manifest file of its own (a copy the test may edit), holding
    `manifest`: the fixture's file is shared by every test."""
    path = run.parent / "manifest.json"
    path.write_text(json.dumps(manifest))
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    (run / "manifest.resolved.json").write_text(
        json.dumps({**resolved, "manifest_path": str(path)})
    )
    return path


def test_a_damaged_copy_of_the_manifest_is_named(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """generate read the decoding settings from a damaged manifest.source.json as none at all,
    without a word, and named a bad value there as if it were in the manifest."""
    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    source = run / "manifest.source.json"
    good = json.loads(source.read_text())
    own = _manifest_of_its_own(run, good)
    for text, expected in [
        ('{"training": ', "manifest.source.json:1:14: invalid JSON"),
        (
            json.dumps({**good, "training": {**good["training"], "decoding": {"top_k": 0}}}),
            "manifest.source.json: training.decoding.top_k: Input should be greater than",
        ),
    ]:
        source.write_text(text)
        if text.endswith("}"):  # the run trained from it: the file says the same
            own.write_text(text)
        code, out, err = run_main(capsys, monkeypatch, "generate", "-p", "x", "--adapter", str(run))
        assert code == 2 and expected in " ".join(err.split()), out + err
    # a bad value the manifest file was given since the run: named in the file
    source.write_text(json.dumps(good))
    own.write_text(json.dumps({**good, "training": {**good["training"], "decoding": {"top_k": 0}}}))
    code, out, err = run_main(capsys, monkeypatch, "generate", "-p", "x", "--adapter", str(run))
    said = " ".join(err.split())
    assert code == 2 and f"{own}: training.decoding.top_k: Input should be greater" in said, said
    own.write_text(json.dumps({**good, "training": {**good["training"], "decoding": "x"}}))
    code, out, err = run_main(capsys, monkeypatch, "generate", "-p", "x", "--adapter", str(run))
    said = " ".join(err.split())  # it decoded with none, said to be the file's
    assert code == 2 and f"{own}: training.decoding: expected an object" in said, said


def test_decoding_values_given_to_train_by_set_apply(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """`train --set training.decoding.max_tokens=5` trained a run that generate answered with
    the manifest's 24-token budget: the recorded --set values apply, as package ships them."""
    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved.setdefault("runtime", {})["overrides"] = ["training.decoding.max_tokens=5"]
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    report = _json(capsys, monkeypatch, "--adapter", str(run), "-p", "x")
    assert report["settings"]["max_new_tokens"] == 5
    assert (
        _json(capsys, monkeypatch, "--adapter", str(memorised), "-p", "x")["settings"][
            "max_new_tokens"
        ]
        == 24
    )


def test_a_run_folder_whose_path_is_not_utf8(capsys, monkeypatch, memorised: Path) -> None:
    """The tokenizers library opens files by UTF-8 paths: a folder named in other bytes was
    `cannot load its tokenizer (UnicodeEncodeError)`."""
    parent = Path(os.fsdecode(bytes(memorised.parent) + b"/\xff"))
    run = parent / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    try:
        code, out, err = run_main(capsys, monkeypatch, "generate", "-p", "x", "--adapter", str(run))
    finally:
        shutil.rmtree(parent)
    said = " ".join(err.split())
    assert code == 2 and "its path holds bytes that are not UTF-8, which the tokenizers" in said


@pytest.mark.slow
def test_an_answer_the_context_cuts_short_is_noted(capsys, monkeypatch, memorised: Path) -> None:
    """A prompt that leaves less room than the budget (24 new tokens here) was answered short
    with no word; and transformers' own too-long warning no longer reaches the terminal."""
    from transformers import AutoTokenizer

    from expert_cli.config.resolve import ResolvedConfig
    from expert_cli.train.prompt_format import PromptFormat

    data = json.loads((memorised / "manifest.resolved.json").read_text())
    data.pop("runtime")
    resolved = ResolvedConfig.model_validate(data)
    tokenizer = AutoTokenizer.from_pretrained(memorised)
    layout = PromptFormat("instruction", resolved.prompt_template)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("transformers").addHandler(handler)
    words = next(
        n
        for n in range(2040, 1500, -1)
        if 0 < 2048 - len(layout.render(tokenizer, "orders " * n)) < 24
    )
    room = 2048 - len(layout.render(tokenizer, "orders " * words))
    logging.getLogger("transformers").removeHandler(handler)
    assert not [line for line in said if "Token indices sequence length" in line]
    code, out, err = run_main(
        capsys,
        monkeypatch,
        "generate",
        "--adapter",
        str(memorised),
        "-p",
        "orders " * words,
        "--json",
    )
    assert code == 0, out + err
    report = json.loads(out)
    assert (
        f"prompt 1: room for {room} new tokens of 24 in the model's context of 2,048"
        in (report["notes"])
    )
    assert report["generations"][0]["new_tokens"] <= room


@pytest.mark.slow
def test_logits_that_overflow_are_one_line(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """Finite adapter weights so large the logits overflow: sampling met NaN probabilities
    and torch's RuntimeError was a traceback."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints"))
    weights = run / "adapter_model.safetensors"
    save_file({k: torch.full_like(v, 1e30) for k, v in load_file(weights).items()}, weights)
    source = json.loads((run / "manifest.source.json").read_text())
    source["training"]["decoding"] = {"temperature": 0.7}
    (run / "manifest.source.json").write_text(json.dumps(source))
    _manifest_of_its_own(run, source)  # the run trained with it
    code, out, err = run_main(capsys, monkeypatch, "generate", "--adapter", str(run), "-p", "x")
    assert code == 1, out + err
    assert "sampling met probabilities that are NaN or infinite" in " ".join(err.split())
    assert "Traceback" not in err


def test_prompts_are_text(tmp_path: Path) -> None:
    """A prompt of bytes that are not UTF-8 (argv keeps them as lone surrogates) was a
    TypeError traceback from the tokenizer; a BOM stayed in the first prompt of a file."""
    from expert_cli.errors import UserError
    from expert_cli.train.prompts import prompt_texts

    with pytest.raises(UserError, match="prompt 2: holds bytes that are not UTF-8 text"):
        prompt_texts(["fine", "ab\udcffcd"], None)
    file = tmp_path / "prompts.txt"
    file.write_text("\ufefffirst\nsecond\n", encoding="utf-8")
    assert prompt_texts([], file) == ["first", "second"]
    # a missing file was "not a file", as if a folder or a device were there
    with pytest.raises(UserError) as err:
        prompt_texts([], tmp_path / "nope.txt")
    assert err.value.lines == [
        f"--prompts {tmp_path / 'nope.txt'}: does not exist (- reads standard input)"
    ]
    with pytest.raises(UserError, match=r": not a file \(- reads standard input\)"):
        prompt_texts([], tmp_path)


def test_prompts_from_standard_input_and_no_empty_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--prompts -` said "not a file"; `-p ""` generated from an empty user turn."""
    import io
    import sys

    from expert_cli.train.prompts import prompt_texts

    stdin = io.TextIOWrapper(io.BytesIO("\ufefffirst\n\n a\\nb \n".encode()), encoding="ascii")
    monkeypatch.setattr(sys, "stdin", stdin)
    got = prompt_texts([], Path("-"))
    assert got == ["first", " a\nb "]
    assert not stdin.closed  # standard input is not the command's to close
    monkeypatch.setattr(sys, "stdin", None)  # `--prompts - <&-`: was an AttributeError
    with pytest.raises(UserError, match="--prompts -: standard input is closed"):
        prompt_texts([], Path("-"))
    for empty in ("", "  \n "):
        with pytest.raises(UserError, match="prompt 2: empty; give the text to answer"):
            prompt_texts(["fine", empty], None)
    with pytest.raises(UserError, match=r"--prompts .*nope.txt: does not exist \(- reads standard"):
        prompt_texts([], tmp_path / "nope.txt")


@pytest.mark.slow
def test_a_chat_template_that_refuses_the_prompt(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """A messages run whose template raises on a generation prompt was a jinja traceback."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved["field_mapping"] = {"messages": "messages"}
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    (run / "chat_template.jinja").write_text(
        "{% if add_generation_prompt %}{{ raise_exception('SECRET no prompts') }}{% endif %}"
    )
    code, out, err = run_main(capsys, monkeypatch, "generate", "--adapter", str(run), "-p", "x")
    said = " ".join(err.split())
    assert code == 2, out + err
    assert "chat_template.jinja: raises on a prompt of one user turn, with or without a " in said
    assert "(TemplateError)" in said and "SECRET" not in said + out
    assert "fix the chat template the run was given" in said
    # one that renders nothing for a lone user turn: generate ran on no tokens (a traceback)
    (run / "chat_template.jinja").write_text(
        "{% if messages|length > 1 %}{% for m in messages %}{{ m.content }}{% endfor %}{% endif %}"
    )
    code, out, err = run_main(capsys, monkeypatch, "generate", "--adapter", str(run), "-p", "x")
    said = " ".join(err.split())
    assert code == 2 and "renders nothing for a prompt of one user turn" in said, out + err
    (run / "chat_template.jinja").unlink()  # said to refuse the conversation (ValueError)
    code, out, err = run_main(capsys, monkeypatch, "generate", "--adapter", str(run), "-p", "x")
    said = " ".join(err.split())
    assert code == 2 and "hold no chat template (its chat_template.jinja is missing?)" in said, said


def test_a_run_that_ended_before_saving_anything_is_said_so(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """A run that failed before its first checkpoint read as a folder train never wrote; so
    did one killed then (its metrics say running)."""
    for status, ended in (("failed", "ended failed"), ("running", "ended without a word")):
        (tmp_path / "metrics.json").write_text(json.dumps({"summary": {"status": status}}))
        for command in (["generate", "-p", "x"], ["merge", "--output", str(tmp_path / "m")]):
            code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(tmp_path))
            said = " ".join(err.split())
            assert code == 2 and f"its run {ended}" in said, said
            assert "before it saved an adapter or a checkpoint" in said, said


def test_decoding_settings_from_the_manifest() -> None:
    sampled, notes = decoding_settings({"temperature": 0.7, "top_p": 0.8, "top_k": 20}, False, None)
    assert sampled == {
        "max_new_tokens": 256,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
    }
    assert notes == []
    greedy, _ = decoding_settings({"temperature": 0.7, "top_p": 0.8}, True, 12)
    assert greedy == {"max_new_tokens": 12, "do_sample": False}
    default, notes = decoding_settings({}, False, None)
    assert default == {"max_new_tokens": 256, "do_sample": False} and notes == []
    penalised, _ = decoding_settings({"repetition_penalty": 1.1, "max_new_tokens": 40}, False, None)
    assert penalised == {"max_new_tokens": 40, "do_sample": False, "repetition_penalty": 1.1}
    both, notes = decoding_settings({"max_tokens": 3, "max_new_tokens": 7}, False, None)
    assert both["max_new_tokens"] == 7  # the one transformers names wins, and the other is noted
    assert notes == ["training.decoding.max_tokens: not used; max_new_tokens is"]
    _, notes = decoding_settings({"max_tokens": 3, "max_new_tokens": 7}, False, 5)
    assert notes == []  # --max-new-tokens given: neither is read
    for bad in (
        {"temperature": -1},
        {"top_p": float("nan")},
        {"top_k": True},
        {"max_tokens": 10**9},
        {"max_new_tokens": 10**12},
        {"temperature": 2.5},  # HiveLLM's format: 0 to 2
        {"top_k": 0},  # the format's minimum is 1
        {"repetition_penalty": 0},  # transformers needs it above 0
        {"repetition_penalty": 1e-300},  # its inverse overflows the logits: a traceback
        {"temperature": 1e-300},  # the logits divided by it overflow: a traceback
        {"stop_sequences": ";"},
    ):
        where = f"manifest.source.json: training.decoding.{next(iter(bad))}"
        with pytest.raises(UserError, match=where):
            decoding_settings(bad, False, None)


def test_the_smallest_sampling_settings_are_taken() -> None:
    settings, _ = decoding_settings({"temperature": 0.01, "repetition_penalty": 0.01}, False, 5)
    assert settings == {
        "max_new_tokens": 5,
        "do_sample": True,
        "temperature": 0.01,
        "repetition_penalty": 0.01,
    }


def test_eval_leaves_out_examples_cut_in_training(demo_expert_dir: Path) -> None:
    """The demo's validation file has 4 examples over max_seq_length=512: their references
    stopped mid-answer, so no answer could match them. They are left out and counted, and
    asking for more examples than remain says so."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.train.eval_cases import eval_cases
    from expert_cli.train.eval_split import validation_split

    resolved = resolve(load_manifest(demo_expert_dir / "manifest.json"), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    notes: list[str] = []
    cases = eval_cases(validation_split(resolved, tokenizer, None), resolved, tokenizer, 100, notes)
    assert notes == [
        "--eval: 4 validation examples were cut at max_seq_length=512 in training and left out "
        "(a reference that stops mid-answer matches no answer)",
        "--eval 100: the validation split has 36 whole examples",
    ]
    assert len(cases) == 36 and all(case.reference for case in cases)
    assert all(case.reference.rstrip().endswith(";") for case in cases)  # whole SQL statements
    notes = []
    assert (
        len(eval_cases(validation_split(resolved, tokenizer, None), resolved, tokenizer, 3, notes))
        == 3
    )
    assert notes == [  # only those met before the third whole one
        "--eval: 1 validation example was cut at max_seq_length=512 in training and left out "
        "(a reference that stops mid-answer matches no answer)"
    ]


def test_eval_leaves_out_the_pieces_of_split_examples(demo_expert_dir: Path) -> None:
    """With overlong: split, the last piece of a long example ends with EOS like a whole one:
    it was a case whose prompt was a token from the middle of an answer."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.train.eval_cases import eval_cases
    from expert_cli.train.eval_split import validation_split

    manifest = demo_expert_dir / "manifest.json"
    split = ["training.dataset.overlong=split"]
    resolved = resolve(load_manifest(manifest, split), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    notes: list[str] = []
    cases = eval_cases(validation_split(resolved, tokenizer, None), resolved, tokenizer, 100, notes)
    assert notes == [
        "--eval 100: the validation split has 36 examples",  # a piece may pass for whole
        "--eval: 4 validation examples were split into pieces of max_seq_length=512 (overlong: "
        "split); pieces are left out where they fill it or begin inside an answer, and one "
        "that begins inside a prompt cannot be told from a whole example",
    ]
    assert len(cases) == 36 and all(c.prompt.startswith("system") for c in cases), cases[0]
    assert all(case.reference.rstrip().endswith(";") for case in cases)


def _one_validation_example(expert: Path) -> tuple:
    """The demo's validation file cut to its first example: (the tokenizer, its ids)."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.formatting import Formatter
    from expert_cli.data.tokenizer import load_tokenizer

    valid = expert / "data" / "valid.jsonl"
    row = json.loads(valid.read_text().splitlines()[0])
    valid.write_text(json.dumps(row) + "\n")
    resolved = resolve(load_manifest(expert / "manifest.json"), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    formatter = Formatter(tokenizer=tokenizer, kind="text", max_seq_length=4096, overlong="drop")
    return tokenizer, formatter({"text": [row["text"]]}).to_pylist()[0]["input_ids"]


def _eval_cases(expert: Path, tokenizer, sets: list[str], notes: list[str]) -> list:
    """`generate --eval 5`'s cases of the expert with `sets` applied."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.eval_cases import eval_cases
    from expert_cli.train.eval_split import validation_split

    resolved = resolve(load_manifest(expert / "manifest.json", sets), cpu_environment())
    return eval_cases(validation_split(resolved, tokenizer, None), resolved, tokenizer, 5, notes)


def test_eval_leaves_out_a_piece_of_end_of_turn_tokens(demo_expert_dir: Path) -> None:
    """A split example whose last piece is its answer's `<|im_end|>`, a line end and EOS was
    a case of an empty prompt and an empty reference, counted in the exact-match score."""
    tokenizer, ids = _one_validation_example(demo_expert_dir)
    assert tokenizer.decode(ids[-3:]) == "<|im_end|>\n<|endoftext|>"
    sets = [f"max_seq_length={len(ids) - 3}", "training.dataset.overlong=split"]
    notes: list[str] = []
    assert _eval_cases(demo_expert_dir, tokenizer, sets, notes) == []
    assert notes[0] == "--eval 5: the validation split has 0 examples"


def test_eval_keeps_an_example_exactly_as_long_as_the_limit(demo_expert_dir: Path) -> None:
    """An example of exactly max_seq_length tokens (its EOS the last) is whole, not cut."""
    tokenizer, ids = _one_validation_example(demo_expert_dir)
    notes: list[str] = []
    assert len(_eval_cases(demo_expert_dir, tokenizer, [f"max_seq_length={len(ids)}"], notes)) == 1
    assert notes == ["--eval 5: the validation split has 1 whole example"]


def test_out_of_memory_is_one_line_not_a_traceback(
    memorised: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any command that runs out of memory (here generate, in the model's own generate) exits
    1 with one message; torch's allocation details stay out of it."""
    import torch
    from transformers import GenerationMixin

    def no_memory(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    monkeypatch.setattr(GenerationMixin, "generate", no_memory)
    proc = run_here("generate", "--adapter", str(memorised), "-p", "Hi.")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "out of memory: this command needs more memory than the GPU" in text
    assert "Traceback" not in text and "Tried to allocate" not in text


def test_merge_out_of_memory_is_a_run_failure_not_bad_input(
    memorised: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """merge maps a base that does not load to exit 2 (the user's input); an allocation that
    fails while loading it is not the user's input: exit 1, one line, nothing written."""
    import torch
    import transformers

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_memory)
    proc = run_here("merge", "--adapter", str(memorised), "--output", str(tmp_path / "merged"))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "out of memory: this command needs more memory" in text and "Traceback" not in text
    assert not (tmp_path / "merged").exists()


def test_sampling_values_the_base_model_sets_are_said() -> None:
    """Qwen3's generation_config.json sets top_k 20 and top_p 0.95; transformers applies
    them where the manifest's decoding leaves them unset, and generate's settings hid them."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from expert_cli.train.base_decoding import inherited_settings

    base = SimpleNamespace(
        generation_config=GenerationConfig(top_k=20, top_p=0.95, repetition_penalty=1.3)
    )
    sampling = {"do_sample": True, "temperature": 0.7, "max_new_tokens": 8}
    assert inherited_settings(base, sampling) == {
        "top_k": 20,
        "top_p": 0.95,
        "repetition_penalty": 1.3,
    }
    greedy = {"do_sample": False, "max_new_tokens": 8}  # sampling values do nothing then
    assert inherited_settings(base, greedy) == {"repetition_penalty": 1.3}
    assert inherited_settings(base, {**sampling, "top_k": 5, "repetition_penalty": 1.0}) == {
        "top_p": 0.95
    }
    plain = SimpleNamespace(generation_config=GenerationConfig(top_k=50, temperature=1.0))
    assert inherited_settings(plain, sampling) == {}


def test_greedy_decoding_of_a_base_that_samples_is_said() -> None:
    """Qwen3's generation_config.json samples (0.6, 0.95, 20); generate decodes greedily
    where training.decoding names no temperature, which its authors warn can repeat without
    end: a note names the base's values. A temperature written (0 too) is the user's choice."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from expert_cli.train.base_decoding import sampled_base_note

    qwen = SimpleNamespace(
        generation_config=GenerationConfig(do_sample=True, temperature=0.6, top_p=0.95, top_k=20)
    )
    greedy = {"do_sample": False, "max_new_tokens": 8}
    note = sampled_base_note(qwen, {"top_p": 0.9}, greedy)
    assert note is not None and "(temperature 0.6, top_p 0.95, top_k 20)" in note
    assert "set training.decoding.temperature to sample" in note
    assert sampled_base_note(qwen, {"temperature": 0}, greedy) is None
    assert sampled_base_note(qwen, {"temperature": None}, greedy) is not None  # null: unset
    assert sampled_base_note(qwen, {}, {**greedy, "do_sample": True}) is None
    plain = SimpleNamespace(generation_config=GenerationConfig(do_sample=False))
    assert sampled_base_note(plain, {}, greedy) is None


def test_a_reference_longer_than_the_budget_gets_room_or_a_note(demo_expert_dir: Path) -> None:
    """A reference longer than the new-token budget could never be matched: without
    --max-new-tokens its case may run to the reference's length; with it, a note says how
    many references the user's budget cuts."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.train.eval_cases import eval_budgets, eval_cases
    from expert_cli.train.eval_split import validation_split

    resolved = resolve(load_manifest(demo_expert_dir / "manifest.json"), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    cases = eval_cases(validation_split(resolved, tokenizer, None), resolved, tokenizer, 3, [])
    for case in cases:  # the answer's tokens, its end-of-turn tokens not counted
        answer = tokenizer(case.reference, add_special_tokens=False)["input_ids"]
        assert abs(case.reference_tokens - len(answer)) <= 1 and len(answer) > 5
    lengths = sorted(c.reference_tokens for c in cases)
    budget = lengths[1] - 1  # two of the three are longer
    assert eval_budgets(cases, budget, chosen=True) == [
        f"--eval: 2 references are longer than --max-new-tokens {budget} (the longest "
        f"{lengths[2]} tokens): their answers stop before matching"
    ]
    assert all(c.budget is None for c in cases)
    notes = eval_budgets(cases, budget, chosen=False)
    assert notes[0].startswith(f"--eval: 2 references are longer than the {budget}-token budget")
    assert sorted(c.budget or 0 for c in cases) == [0, *lengths[1:]]
    assert eval_budgets(cases, lengths[2], chosen=False) == []


@pytest.mark.slow
def test_eval_decodes_greedily_whatever_the_manifest_samples(
    capsys, monkeypatch, memorised: Path, tmp_path: Path
) -> None:
    """A manifest that samples (temperature 0.7) made --eval's exact match change from call to
    call; --eval is greedy and says so, while a prompt alone still samples."""
    run = tmp_path / "run"
    shutil.copytree(memorised, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    source = json.loads((run / "manifest.source.json").read_text())
    source["training"]["decoding"] = {"temperature": 0.7, "max_tokens": 24}
    (run / "manifest.source.json").write_text(json.dumps(source))
    _manifest_of_its_own(run, source)
    report = _json(capsys, monkeypatch, "--adapter", str(run), "--eval", "2")
    assert report["settings"]["do_sample"] is False and report["exact_match_rate"] == 1.0
    assert any(n.startswith("--eval: this call decodes greedily") for n in report["notes"])
    report = _json(capsys, monkeypatch, "--adapter", str(run), "-p", QUESTION)
    assert report["settings"]["do_sample"] is True and report["settings"]["temperature"] == 0.7
    report = _json(
        capsys, monkeypatch, "--adapter", str(run), "--eval", "1", "--max-new-tokens", "2"
    )
    assert report["generations"][0]["exact_match"] is False
    assert any("longer than --max-new-tokens 2" in n for n in report["notes"])


@pytest.mark.slow
def test_an_answer_stops_at_a_turn_end_the_tokenizer_has_no_token_for(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Text data in `<|user|>`/`<|assistant|>` turns ended by `<|end|>`, on a tokenizer with no
    `<|end|>` token: the model learns the marker as six tokens and goes on to the next turn.
    generate answered "A<|end|>\\n<|user|>\\n..." up to its budget; it stops at the marker."""
    first, second = "SELECT 1;", "SELECT 2;"
    text = (
        f"<|user|>\n{QUESTION}<|end|>\n<|assistant|>\n{first}<|end|>\n"
        f"<|user|>\nAnd again.<|end|>\n<|assistant|>\n{second}<|end|>\n"
    )
    write_jsonl(tmp_path / "train.jsonl", [{"text": text}] * 32)
    write_jsonl(tmp_path / "valid.jsonl", [{"text": text}] * 2)
    manifest = {
        "name": "expert-markers",
        "version": "0.0.1",
        "schema_version": "2.0",
        "base_models": [{"name": str(tiny_model_dir), "adapters": [{"type": "lora"}]}],
        "training": {
            "dataset": {
                "path": "train.jsonl",
                "validation_path": "valid.jsonl",
                "field_mapping": {"text": "text"},
            },
            "config": {**MEMORISING, "max_seq_length": 96},
            "decoding": {"temperature": 0.0, "max_tokens": 40},
        },
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    done = run_here(
        "train", "-m", str(tmp_path / "manifest.json"), "--output", str(out), "--max-steps", "60"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = _json(capsys, monkeypatch, "--adapter", str(out), "-p", QUESTION)
    answer = report["generations"][0]
    assert report["settings"]["stop_texts"] == ["<|end|>", "<|user|>"]
    assert answer["output"] == first
    # stopped as "<|end|>" was complete: the answer's tokens and the marker's six, no more
    assert answer["new_tokens"] <= len(first) + 6 < 40
    # --eval: the reference holds the turn end as trained, the answer stops before it
    (scored,) = _json(capsys, monkeypatch, "--adapter", str(out), "--eval", "1")["generations"]
    assert scored["output"] == scored["reference"] == first and scored["exact_match"] is True
    # merge cannot write a text stop into generation_config.json: it says where to stop
    merged = run_here("merge", "--adapter", str(out), "--output", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    said = " ".join(merged.stdout.split())
    assert "answers end at <|end|>, <|user|>" in said and "stop_strings=['<|end|>'" in said
    streamed = run_here("generate", "--adapter", str(out), "-p", QUESTION)
    assert streamed.returncode == 0, streamed.stderr
    assert (
        f"expert: {first}\n" in streamed.stdout and "<|" not in streamed.stdout.split("expert: ")[1]
    )


def test_a_garbled_run_configuration_is_not_called_missing(capsys, monkeypatch, tmp_path) -> None:
    """manifest.resolved.json holding `x {` was "no manifest.resolved.json": the user looked
    for a file that is there."""
    from train_helpers import hand_built_run, run_main

    run = hand_built_run(tmp_path)
    for garbled in ("x {", "{}"):  # `{}` was "not a JSON object"
        (run / "manifest.resolved.json").write_text(garbled)
        code, _, err = run_main(capsys, monkeypatch, "generate", "--adapter", str(run), "-p", "hi")
        said = " ".join(err.split())
        assert code == 2 and "its manifest.resolved.json holds no run's configuration" in said
    (run / "manifest.resolved.json").unlink()
    code, _, err = run_main(capsys, monkeypatch, "generate", "--adapter", str(run), "-p", "hi")
    assert code == 2 and "its manifest.resolved.json is missing" in err, err


def test_an_eval_answer_is_matched_after_its_reasoning() -> None:
    """`--eval` compared the whole text: under Qwen3's template a reference holds its
    reasoning (or the empty block the template writes), which an answer seldom repeats word
    for word; the answer after the last </think> is what is matched."""
    from expert_cli.train.eval_cases import final_answer

    reference = "<think>\n3 < 5, so 5.\n</think>\n\n5"
    assert final_answer(reference) == "5"
    assert final_answer("<think>\nfive beats three\n</think>\n\n5 ") == final_answer(reference)
    assert final_answer("<think>\n\n</think>\n\n5") == "5"  # Qwen3's empty block
    assert final_answer("<think>\nstill thinking") != "5"  # no answer: no match
    assert final_answer("6") != final_answer(reference)
    assert final_answer(" plain answer \n") == "plain answer"  # no reasoning: the whole


def test_a_random_base_keeps_its_folders_generation_config(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """init: random built the model from config.json alone, so the folder's
    generation_config.json (a base's stops and sampling values) was not in the run's
    base_model/, and generate decoded without it; one that is not JSON, passed over in
    silence (as transformers does), is refused naming it."""
    from train_helpers import write_expert

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    own = {"eos_token_id": [0, 1], "do_sample": True, "temperature": 0.6, "top_k": 20}
    (folder / "generation_config.json").write_text(json.dumps(own))
    manifest = write_expert(tmp_path / "e", folder, rows=8, base={"init": "random"})
    run = tmp_path / "run"
    code, _, err = run_main(capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(run))
    assert code == 0, err
    saved = json.loads((run / "base_model" / "generation_config.json").read_text())
    assert {key: saved.get(key) for key in own} == own
    done = run_here("generate", "--adapter", str(run), "-p", "hi", "--max-new-tokens", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "samples (temperature 0.6, top_k 20)" in " ".join(done.stdout.split())

    (folder / "generation_config.json").write_text("{not json")
    again = tmp_path / "again"
    code, _, err = run_main(
        capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(again)
    )
    assert code == 2 and not again.exists()
    assert f"base model {folder}: generation_config.json is not JSON" in err


def test_an_answer_cut_mid_character_ends_before_it(tiny_tokenizer) -> None:
    """A byte-level tokenizer writes 日 in three tokens: a budget that ends after the first of
    本's showed a U+FFFD at the answer's end, streamed and in the text."""
    import torch

    from expert_cli.train.generate import _Streamer
    from expert_cli.train.tokenizer_files import layout_stops

    ids = tiny_tokenizer.encode("日本", add_special_tokens=False)
    assert tiny_tokenizer.decode(ids[:4]) == "日\ufffd"  # 日, and 本's first byte

    class Shown:
        def __init__(self) -> None:
            self.pieces: list[str] = []

        def text(self, piece: str) -> None:
            self.pieces.append(piece)

    shown = Shown()
    streamer = _Streamer(tiny_tokenizer, shown, layout_stops(tiny_tokenizer, []))
    streamer.put(torch.tensor([[ids[0]]]))  # the prompt, which the streamer skips
    for token in ids[:4]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    assert "".join(shown.pieces) == "日"
    from expert_cli.train.generate import uncut

    assert uncut("\ufffd\ufffd\ufffd") == "\ufffd\ufffd"  # a random model's bytes stay shown


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_while_generating_is_said_in_json(
    capsys, monkeypatch, memorised: Path, signum: int, code: int
) -> None:
    """SIGTERM or SIGHUP ended generate where it stood: exit -15 or -1, nothing on stdout
    or stderr, so `--json` got no object at all (Ctrl-C was said)."""
    import expert_cli.train.generate as generate

    signal_once(monkeypatch, generate, "load_run", signum)
    got, out, err = run_main(
        capsys, monkeypatch, "generate", "--adapter", str(memorised), "-p", "x", "--json"
    )
    assert got == code, out + err
    assert json.loads(out)["error"] == {
        "kind": "interrupted",
        "exit_code": code,
        "lines": ["stopped before the answers were all given (generate writes no file)"],
    }
