"""`expert-cli check` end to end: exit codes, JSON report, messages without tracebacks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import run_cli, write_expert

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
REAL_EXPERTS = ["expert-json", "expert-typescript", "expert-neo4j", "expert-sql"]


def test_help_is_instant_and_imports_no_torch() -> None:
    start = time.perf_counter()
    out = run_cli("--help")
    assert out.returncode == 0 and "check" in out.stdout
    assert time.perf_counter() - start < 5  # generous for CI; locally ~0.3 s
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, expert_cli.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "[]"


def test_demo_manifest_is_usable(cli) -> None:
    out = cli("check", "--manifest", str(ROOT / "experts/demo/manifest.json"), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["manifest"] == {
        "path": str(ROOT / "experts/demo/manifest.json"),
        "name": "expert-demo",
        "version": "0.1.0",
        "schema_version": "2.0",
    }
    assert report["problems"] == [] and report["downloads"] == []
    cfg = report["config"]
    assert (cfg["init"], cfg["adapter_type"], cfg["packing"]) == ("random", "lora", True)
    assert report["environment"]["torch"]
    # the examples read, said before the verdict; a --quick count that reached it is a least
    for extra, train in (([], "400"), (["--quick", "100"], "100+")):
        shown = cli("check", "--manifest", str(ROOT / "experts/demo/manifest.json"), *extra)
        text = " ".join(shown.stdout.split())
        assert f"data: examples read: {train} in " in text and "train.jsonl, 40 in " in text


@pytest.mark.parametrize("expert", REAL_EXPERTS)
def test_real_experts_offline_name_what_is_missing(
    cli, monkeypatch, expert: str, tmp_path: Path
) -> None:
    """HF_HUB_OFFLINE with an empty cache: not usable, naming the model and the dataset and
    how to point at a local folder (the rest of the manifest is fine)."""
    manifest = ROOT / "experts" / expert / "manifest.json"
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    out = cli("check", "--manifest", str(manifest), "--json")
    assert out.returncode == 2, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["config"]["base_model"] == "Qwen/Qwen3-0.6B" and report["downloads"] == []
    dataset = report["config"]["train_sources"][0]["location"]
    assert len(report["problems"]) == 2
    model_line, data_line = report["problems"]
    assert model_line.startswith(
        "base_models[0].name: model Qwen/Qwen3-0.6B (no folder of that name beside the manifest, "
        "so it is read as a hub id) is not in the local"
    )
    assert "HF_HUB_OFFLINE" in model_line and "set base_models[0].name to that folder" in model_line
    assert data_line.startswith(
        f"training.dataset.path: dataset {dataset} (no file or folder of that name beside the "
        "manifest, so it is read as a hub id) is not in the local cache"
    )  # a mistyped local folder (`mydata/train`) reads as a hub id: say so


def _hivellm_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    data = json.loads((FIXTURES / "hivellm_v2.json").read_text())
    data["base_models"][0]["name"] = str(tiny_model_dir)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    (tmp_path / "datasets").mkdir()
    row = {"text": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSELECT 1;<|im_end|>\n"}
    for name in ("train", "validation", "test"):
        (tmp_path / "datasets" / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    return tmp_path


def test_hivellm_manifest_checks_once_files_exist(
    cli, tmp_path: Path, tiny_model_dir: Path
) -> None:
    folder = _hivellm_dir(tmp_path, tiny_model_dir)
    out = cli("check", "--manifest", str(folder / "manifest.json"), "--json")
    assert out.returncode == 0, out.stdout
    report = json.loads(out.stdout)
    assert report["config"]["rank"] == 14 and report["config"]["gradient_accumulation_steps"] == 45
    assert any(n.startswith("use_unsloth:") for n in report["notes"])


def test_bad_data_and_model_are_problems(cli, tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = _hivellm_dir(tmp_path, tiny_model_dir)
    (folder / "datasets" / "train.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    (folder / "datasets" / "validation.jsonl").write_text('{"prompt": "no text here"}\n')
    (folder / "datasets" / "test.jsonl").unlink()
    out = cli("check", "--manifest", str(folder / "manifest.json"), "--json")
    assert out.returncode == 2
    problems = json.loads(out.stdout)["problems"]
    assert problems[0] == f"{folder}/datasets/train.jsonl:2: invalid JSON (Expecting value)"
    assert problems[1] == (
        f"{folder}/datasets/validation.jsonl:1: field 'text' missing "
        "(field_mapping.text); this row has 'prompt'"
    )


def test_test_data_evaluate_would_refuse_is_a_note(
    cli, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """check read no test file: a bad row there passed check and train, and stopped
    evaluate; a test file that is the training file was said by evaluate alone. Both are
    notes now (training does not read test data: the manifest stays usable)."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["test_path"] = "data/test.jsonl"
    manifest.write_text(json.dumps(data))
    (tmp_path / "e" / "data" / "test.jsonl").write_text('{"text": "fine"}\n{"text": 5}\n')
    out = cli("check", "--manifest", str(manifest), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    notes = json.loads(out.stdout)["notes"]
    test_file = tmp_path / "e" / "data" / "test.jsonl"
    assert (
        f"{test_file}:2: field 'text' (field_mapping.text) is a number, expected a string "
        "(evaluate reads it; training does not)" in notes
    ), notes
    data["training"]["dataset"]["test_path"] = "data/train.jsonl"
    manifest.write_text(json.dumps(data))
    out = cli("check", "--manifest", str(manifest), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    notes = json.loads(out.stdout)["notes"]
    assert (
        f"training.dataset.test_path: {tmp_path / 'e' / 'data' / 'train.jsonl'} is also read "
        "for training; evaluate then scores examples the run trained on"
    ) in notes, notes


def test_missing_model_folder_and_empty_data(cli, tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = _hivellm_dir(tmp_path, tiny_model_dir)
    data = json.loads((folder / "manifest.json").read_text())
    data["base_models"][0]["name"] = "F:/models/Qwen3-0.6B"
    (folder / "manifest.json").write_text(json.dumps(data))
    (folder / "datasets" / "train.jsonl").write_text("")
    out = cli("check", "--manifest", str(folder / "manifest.json"))
    assert out.returncode == 2
    assert "F:/models/Qwen3-0.6B is not a folder" in out.stdout
    assert "train.jsonl: no examples (the file has no rows)" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_weights_missing_without_random_init(cli, tmp_path: Path, tiny_model_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    folder = _hivellm_dir(tmp_path / "expert", model)
    out = cli("check", "--manifest", str(folder / "manifest.json"), "--json")
    assert out.returncode == 2
    assert any("has no weights" in p for p in json.loads(out.stdout)["problems"])


def test_misspelt_key_exits_2_naming_the_path(cli, tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "hivellm_v2.json").read_text())
    data["training"]["config"]["gradient_acumulation_steps"] = 4
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    out = cli("check", "--manifest", str(tmp_path / "manifest.json"))
    assert out.returncode == 2
    assert (
        "training.config.gradient_acumulation_steps: unknown field; did you mean "
        "gradient_accumulation_steps?"
    ) in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_adapter_targets_missing_from_the_model_are_a_problem(cli) -> None:
    """Found as a run would find it (the architecture built without weights): a module name
    the model does not have, alone or beside real ones (peft would adapt the others and say
    nothing)."""
    demo = str(ROOT / "experts/demo/manifest.json")
    for targets in ('["nope_proj"]', '["q_proj", "nope_proj", "v_prj"]'):
        out = cli("check", "--manifest", demo, "--json", "--set", f"target_modules={targets}")
        assert out.returncode == 2, out.stdout + out.stderr
        (problem,) = json.loads(out.stdout)["problems"]
        assert problem.startswith("adapter (lora): target_modules[")
        first = json.loads(targets).index("nope_proj")
        assert f"target_modules[{first}] names no layer of the model" in problem
        has_typo = "v_prj" in targets
        assert (
            "target_modules[2] names no layer of the model; did you mean v_proj?" in problem
        ) == has_typo
        assert "nope_proj" not in problem and "v_prj" not in problem
    good = '["q_proj", "v_proj"]'
    out = cli("check", "--manifest", demo, "--json", "--set", f"target_modules={good}")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "m.json", "--package", "p.expert"], "--manifest and --package: give one of them"),
        (["-m", "m.json", "--list-settings"], "--manifest and --list-settings: give one of them"),
        (["--package", "p.expert", "--set", "rank=4"], "--package: --set and --quick apply to"),
    ],
)
def test_one_kind_of_check_at_a_time(capsys, monkeypatch, args, message) -> None:
    """`check -m M --package P` checked the package alone and said nothing of M."""
    from train_helpers import run_main

    code, _, err = run_main(capsys, monkeypatch, "check", *args)
    assert code == 2
    assert message in " ".join(err.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["package", "--adapter", "no-such-run"], "no-such-run: does not exist"),
        (["generate", "--adapter", "no-such-run", "-p", "hi"], "no-such-run: does not exist"),
        (["check", "-m", "m.json", "--package", "p.expert"], "--manifest and --package: give"),
        (["find-datasets", "--cache-dir", "no-such-cache"], "no-such-cache"),
        # refused by click before --json's own callback ran (or any, for an unknown option)
        (["check", "-m", "m.json", "--quick", "0"], "Invalid value for '--quick'"),
        (["generate", "--adapter", "r", "-p", "hi", "--max-new-tokens", "0"], "'--max-new-tokens'"),
        (["package", "--adapter", "r", "--bogus"], "No such option: --bogus"),
    ],
)
def test_json_asked_gets_json_on_an_error_too(capsys, monkeypatch, args, message) -> None:
    """`package --json` and `generate --json` printed nothing on stdout on an error: a script
    parsing stdout met an empty string. The error is a JSON object there too, and stays on
    stderr; without --json stdout stays empty."""
    from train_helpers import run_main

    code, out, err = run_main(capsys, monkeypatch, *args, "--json")
    said = json.loads(out)["error"]
    assert code == 2 and said["exit_code"] == 2 and said["kind"] == "error", (code, out, err)
    assert message in " ".join(said["lines"]) and message in " ".join(err.split())
    code, out, err = run_main(capsys, monkeypatch, *args)
    assert (code, out) == (2, "") and message in " ".join(err.split())


def test_evaluation_with_no_row_to_hold_out_fails_in_check_as_in_train(
    cli, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Evaluation on (the default) and one row: nothing can be held out for it. `check` used
    to call this usable, and `train` then stopped after tokenizing."""
    auto = {"evaluation_strategy": None}
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=1, config=auto)
    out = cli("check", "-m", str(manifest), "--json")
    assert out.returncode == 2
    (problem,) = json.loads(out.stdout)["problems"]
    assert problem.startswith("training.config.evaluation_strategy: evaluation is on but the")
    done = cli("train", "-m", str(manifest), "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and problem in " ".join(done.stderr.split())
    assert cli("check", "-m", str(manifest), "--quick", "1").returncode == 0  # 1 row at least
    off = write_expert(tmp_path / "f", tiny_model_dir, rows=1)  # evaluation_strategy "no"
    assert cli("check", "-m", str(off)).returncode == 0
    two = write_expert(tmp_path / "g", tiny_model_dir, rows=2, config=auto)
    assert cli("check", "-m", str(two)).returncode == 0


def test_examples_with_nothing_to_train_on(demo_expert_dir: Path) -> None:
    """A validation file of empty texts passed check, then train stopped on it (before the
    fix, a traceback); some empty training examples are a note: train drops them."""
    from expert_cli.data.checks import check_manifest

    data = demo_expert_dir / "data"
    (data / "valid.jsonl").write_text('{"text": ""}\n{"text": " "}\n')
    with (data / "train.jsonl").open("a") as f:
        f.write('{"text": ""}\n' * 2)
    report = check_manifest(demo_expert_dir / "manifest.json")
    assert report.problems == [
        "training.dataset.validation_path: no evaluation example is left after formatting "
        "(2 read, every one dropped: 2 with no completion tokens)"
    ]
    assert (
        "training.dataset: 2 of 402 training examples read have an empty text, response or "
        "assistant turn; train drops them (no completion tokens)"
    ) in report.notes
    # an assistant turn with nothing in it: the build drops it too, check said usable
    empty_turn = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n <|im_end|>\n"
    (data / "valid.jsonl").write_text(json.dumps({"text": empty_turn}) + "\n")
    report = check_manifest(demo_expert_dir / "manifest.json")
    assert report.problems == [
        "training.dataset.validation_path: no evaluation example is left after formatting "
        "(1 read, every one dropped: 1 with no completion tokens)"
    ]


def test_texts_answered_by_the_eos_alone_count_as_empty(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A text whose answer is only the tokenizer's EOS (here one no end-of-turn list names):
    the build drops it; check's count of a source too large to format said it trained."""
    from transformers import AutoTokenizer

    from expert_cli.data.checks import check_manifest

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.add_special_tokens({"eos_token": "<|eot|>"})
    tokenizer.save_pretrained(model)
    manifest = write_expert(tmp_path / "e", model, rows=1)
    answered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n"
    eos_only = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|eot|>\n"
    rows = [answered] * 4000 + [eos_only] * 200
    (manifest.parent / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in rows)
    )
    report = check_manifest(manifest)
    assert report.problems == []
    assert (
        "training.dataset: 200 of 4,200 training examples read have an empty text, response or "
        "assistant turn; train drops them (no completion tokens)"
    ) in report.notes


def test_texts_without_the_response_template_fail_in_check_as_in_train(
    demo_expert_dir: Path,
) -> None:
    """A response_template no text holds: check said usable, then pretokenize and train
    dropped every example (exit 2). Some texts without it are a note."""
    from expert_cli.data.checks import check_manifest

    manifest = demo_expert_dir / "manifest.json"
    report = check_manifest(manifest, overrides=["training.dataset.response_template=### A:"])
    assert report.problems == [
        "training.dataset: no training example is left after formatting (400 read, every one "
        "dropped: 400 without response_template)",
        "training.dataset.validation_path: no evaluation example is left after formatting (40 "
        "read, every one dropped: 40 without response_template)",
    ]
    with (demo_expert_dir / "data" / "train.jsonl").open("a") as f:
        f.write(json.dumps({"text": "Q\n### A: yes"}) + "\n")
    (demo_expert_dir / "data" / "valid.jsonl").write_text(json.dumps({"text": "### A: ok"}))
    report = check_manifest(manifest, overrides=["training.dataset.response_template=### A:"])
    assert report.problems == []
    assert (
        "training.dataset: 400 of 401 training texts read hold no response_template; train "
        "drops them"
    ) in report.notes


def test_conversations_with_nothing_to_train_on(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A conversation whose assistant turn is empty or blank: the build drops it, and check
    counted none of them (it said usable, then train stopped on the validation split)."""
    from train_helpers import run_main

    from expert_cli.data.checks import check_manifest

    def chat(answer: str) -> str:
        turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer}]
        return json.dumps({"messages": turns}) + "\n"

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=1, valid_rows=1)
    data = manifest.parent / "data"
    (data / "train.jsonl").write_text(chat("a") * 6 + chat(" ") + chat(""))
    (data / "valid.jsonl").write_text(chat("\n") + chat(""))
    config = json.loads(manifest.read_text())
    config["training"]["dataset"]["field_mapping"] = {"messages": "messages"}
    manifest.write_text(json.dumps(config))
    problem = (
        "training.dataset.validation_path: no evaluation example is left after formatting "
        "(2 read, every one dropped: 2 with no completion tokens)"
    )
    report = check_manifest(manifest)
    assert report.problems == [problem]
    assert (
        "training.dataset: 2 of 8 training examples read have an empty text, response or "
        "assistant turn; train drops them (no completion tokens)"
    ) in report.notes
    out = tmp_path / "out"
    code, _, err = run_main(capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out))
    assert code == 2 and problem in " ".join(err.split())
    # every answer of "weight": 0: nothing to train, as the build finds it (check said usable)
    weighed = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a", "weight": 0},
    ]
    (data / "train.jsonl").write_text(
        chat("a") * 6 + (json.dumps({"messages": weighed}) + "\n") * 2
    )
    report = check_manifest(manifest)
    assert "training.dataset: 2 of 8 training examples read have an empty text, response or " in (
        " ".join(report.notes)
    ), report.notes
    # a row refused after an empty one: the rows read up to it are counted ("1 of 0")
    (data / "train.jsonl").write_text(chat("") + chat("a") + '{"messages": 5}\n')
    report = check_manifest(manifest)
    assert "training.dataset: 1 of 2 training examples read have an empty text, response or " in (
        " ".join(report.notes)
    )


def test_conversations_without_the_response_template_fail_in_check_as_in_train(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`messages` whose rendered text holds no response_template: the build drops every one
    (exit 2), and check called the manifest usable."""
    from expert_cli.data.checks import check_manifest

    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=1)
    (manifest.parent / "data" / "train.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    config = json.loads(manifest.read_text())
    config["training"]["dataset"]["field_mapping"] = {"messages": "messages"}
    config["training"]["dataset"]["response_template"] = "<|im_start|>assistant\n"
    manifest.write_text(json.dumps(config))
    assert check_manifest(manifest).problems == []  # the template renders it: trained
    asked = [{"role": "user", "content": "hi"}]  # no reply: the build drops it, as no marker
    with (manifest.parent / "data" / "train.jsonl").open("a") as f:
        f.write(json.dumps({"messages": asked}) + "\n")
    report = check_manifest(manifest)
    assert report.problems == [] and any(
        "train.jsonl:2: this conversation is dropped by train (no response_template in the "
        "rendered text)" in n
        for n in report.notes
    ), report.notes
    config["training"]["dataset"]["response_template"] = "### Answer:"
    manifest.write_text(json.dumps(config))
    (problem,) = check_manifest(manifest).problems  # it said to set what was set
    assert problem.startswith(
        "training.dataset.response_template: the chat template does not write it"
    )


def test_a_mapping_problem_is_listed_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`text` beside `response` in field_mapping is found in the training file and again in
    the validation file: check listed the same line twice."""
    from expert_cli.data.checks import check_manifest

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=4, valid_rows=2)
    config = json.loads(manifest.read_text())
    config["training"]["dataset"]["field_mapping"] = {"text": "text", "response": "answer"}
    manifest.write_text(json.dumps(config))
    report = check_manifest(manifest)
    assert report.problems == [
        "training.dataset.field_mapping: `text` holds the whole example, so `response` would "
        "not be used; remove it, or map `instruction` + `response` without `text`"
    ]


def test_check_says_which_columns_a_detected_mapping_reads(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """With no field_mapping, which column became which role was seen only in the cache's
    stats.json after a build (a dataset with a conversation column and a pair both); the
    columns left unread are named too (s1K's reasoning beside its question and solution was
    dropped without a word)."""
    from expert_cli.data.checks import check_manifest

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=1)
    rows = [
        {"id": i, "question": f"q{i}", "response": f"a{i}", "system_prompt": "s"} for i in range(8)
    ]
    (manifest.parent / "data" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    config = json.loads(manifest.read_text())
    config["training"]["dataset"].pop("field_mapping", None)
    manifest.write_text(json.dumps(config))
    report = check_manifest(manifest)
    assert (
        'training.dataset.field_mapping: none given; read as {"instruction": "question", '
        "\"response\": \"response\"}; input from 'input' and system from 'system_prompt' where a "
        "row has it; not read: 'id' (set it to read other columns)"
    ) in report.notes, report.notes


def test_check_says_texts_without_an_assistant_marker_are_trained_whole(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`train` said `loss on whole text N (... the prompt is trained too)`; check, on the same
    data, said nothing (tatsu-lab/alpaca's rendered text, OpenAssistant's messages)."""
    from expert_cli.data.checks import check_manifest

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=1)
    chat = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
    lines = [json.dumps({"text": "a plain document"})] * 3 + [json.dumps({"text": chat})] * 5
    (manifest.parent / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    report = check_manifest(manifest)
    assert (
        "training.dataset: 3 of 8 training texts read hold no assistant marker: each is trained "
        "whole, its prompt too"
    ) in " ".join(report.notes), report.notes


def test_a_split_every_example_of_which_is_too_long_fails_in_check_as_in_the_build(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The one example held out for evaluation had its answer past max_seq_length; a
    validation file of two such; training examples all over it with overlong: drop: check
    said usable, then the build stopped on a split of none (exit 2, after tokenizing)."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.checks import check_manifest
    from expert_cli.data.splits import held_rows
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.errors import UserError

    def expert(folder: Path, rows: list[dict], valid: list[dict] | None) -> Path:
        manifest = write_expert(folder, tiny_model_dir, config={"evaluation_strategy": "steps"})
        data = json.loads(manifest.read_text())
        data["training"]["dataset"] = {"path": "data/train.jsonl"}
        (folder / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if valid is not None:
            data["training"]["dataset"]["validation_path"] = "data/valid.jsonl"
            lines = "".join(json.dumps(r) + "\n" for r in valid)
            (folder / "data" / "valid.jsonl").write_text(lines)
        manifest.write_text(json.dumps(data))
        return manifest

    def agree(manifest: Path, *sets: str) -> str:
        (problem,) = check_manifest(manifest, overrides=list(sets)).problems
        resolved = resolve(load_manifest(manifest, list(sets)), cpu_environment())
        with pytest.raises(UserError) as built:
            prepare_data(resolved, load_tokenizer(resolved), num_proc=1)
        assert str(built.value) == problem
        return problem

    long = {"instruction": "word " * 300, "output": "yes"}
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(10)]
    (held,) = held_rows(10, 0.1, 42)  # the defaults' one held-out example
    rows[held] = long
    problem = agree(expert(tmp_path / "a", rows, None))
    assert problem == (
        "training.dataset.eval_fraction (the held-out examples): no evaluation example is left "
        "after formatting (1 read, every one dropped: 1 with the answer past "
        "max_seq_length=128)"
    )
    rows[held] = {"instruction": "q", "output": "a"}
    assert check_manifest(expert(tmp_path / "b", rows, None)).problems == []
    assert agree(expert(tmp_path / "c", rows, [long, long])).startswith(
        "training.dataset.validation_path: no evaluation example is left after formatting (2 "
        "read, every one dropped: 2 with the answer past max_seq_length=128)"
    )
    answers = [{"instruction": "q", "output": "word " * 300}] * 4
    drop = "training.dataset.overlong=drop"
    assert agree(expert(tmp_path / "d", answers, [{"instruction": "q", "output": "a"}]), drop) == (
        "training.dataset: no training example is left after formatting (4 read, every one "
        "dropped: 4 over max_seq_length=128 with overlong: drop)"
    )


def test_a_task_weights_sample_is_formatted_as_the_build_trains_it(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A task of weight 0.3 trains a seeded sample of its rows: check formatted all of them
    (one short one was enough to say usable), the build the sample (every one too long)."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.checks import check_manifest
    from expert_cli.data.splits import weighted_rows
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.errors import UserError

    folder = tmp_path / "e"
    manifest = write_expert(folder, tiny_model_dir)
    data = json.loads(manifest.read_text())
    tasks = {"a": {"train": "data/a.jsonl", "valid": "data/v.jsonl", "weight": 0.3}}
    data["training"]["dataset"] = {"type": "multi_task", "tasks": tasks, "overlong": "drop"}
    manifest.write_text(json.dumps(data))
    resolved = resolve(load_manifest(manifest), cpu_environment())
    sample = set(weighted_rows(10, 0.3, resolved.seed).tolist())
    long = {"instruction": "word " * 300, "output": "yes"}
    rows = [long if i in sample else {"instruction": f"q{i}", "output": "a"} for i in range(10)]
    (folder / "data" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "data" / "v.jsonl").write_text(json.dumps({"instruction": "q", "output": "a"}))
    (problem,) = check_manifest(manifest).problems
    assert problem == (
        f"training.dataset: no training example is left after formatting ({len(sample)} read, "
        f"every one dropped: {len(sample)} over max_seq_length=128 with overlong: drop)"
    )
    with pytest.raises(UserError) as built:
        prepare_data(resolved, load_tokenizer(resolved), num_proc=1)
    assert str(built.value) == problem


def test_sources_of_one_hub_dataset_are_counted_apart() -> None:
    """Found by a review: the train and test splits of one hub dataset were counted under
    its id alone, the second count replacing the first (check said "10 in acme/sqlmini"
    for 40 training rows, and judged the held-out split by the validation's count)."""
    from expert_cli.config.resolve import SourceRef
    from expert_cli.data.row_checks import source_key

    def hub(split: str | None, config: str | None = None, task: str | None = None) -> str:
        return source_key(SourceRef(kind="hub", location="acme/sqlmini", split=split,
                                    config=config, task=task))  # fmt: skip

    assert hub("train") == "acme/sqlmini::train" != hub("test")
    assert hub("train", "v2") == "acme/sqlmini::train::v2"
    assert hub("train", task="sql") == "acme/sqlmini::train (sql)" != hub("train", task="json")
    assert source_key(SourceRef(kind="local", location="/d/train.jsonl")) == "/d/train.jsonl"


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        # peft's rank budget prunes to half the rank: a traceback at its first rank update
        (
            ["adapter_type=adalora", "rank=1"],
            "training.config.rank: 1 with adapter_type adalora: AdaLoRA prunes",
        ),
        # the run completed and wrote an adapter_config.json of r 400 beside weights of 256
        (
            ["init_lora_weights=pissa", "rank=200"],
            "training.config.rank: 200 with init_lora_weights pissa: model.layers.0.self_attn.",
        ),
        # peft's own words, no field named
        (
            ["adapter_type=ia3", 'target_modules=["q_proj"]', 'feedforward_modules=["down_proj"]'],
            "training.config.feedforward_modules[0]: not among target_modules",
        ),
        # check said usable, and train refused it: trained on layers this run does not adapt
        (
            ["init_adapter=start", 'target_modules=["q_proj"]'],
            "its adapter differs from this run's (target_modules down_proj there, not here)",
        ),
    ],
)
def test_combinations_train_would_fail_on_are_found_by_check(
    tmp_path: Path, sets: list[str], said: str
) -> None:
    from train_helpers import run_here

    expert = tmp_path / "demo"
    shutil.copytree(ROOT / "experts" / "demo", expert, ignore=shutil.ignore_patterns(".cache"))
    (expert / "start").mkdir()  # an adapter to start from, of the demo's rank and alpha
    config = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}
    config["target_modules"].append("down_proj")
    (expert / "start" / "adapter_config.json").write_text(json.dumps(config))
    (expert / "start" / "adapter_model.safetensors").write_bytes(b"")
    args = [arg for value in sets for arg in ("--set", value)]
    done = run_here("check", "-m", str(expert / "manifest.json"), "--json", *args)
    problems = json.loads(done.stdout)["problems"]
    assert done.returncode == 2 and any(said in p for p in problems), problems
