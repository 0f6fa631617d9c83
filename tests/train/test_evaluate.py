"""`expert-cli evaluate`: a trained adapter's loss, perplexity and token accuracy on the test
split (each task's), or the validation split, laid out as training laid out its data; the
base's beside them; and clear errors."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import write_jsonl
from train_helpers import multi_task_expert, read_metrics, run_here, text_rows, write_expert

from expert_cli.train.eval_split import example_count


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A multi_task run of 4 steps (evaluations at steps 0, 2 and 4; checkpoint-2 kept)."""
    folder = tmp_path_factory.mktemp("multi")
    manifest = multi_task_expert(folder / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    data["training"]["config"]["save_steps"] = 2  # checkpoint-2 kept
    manifest.write_text(json.dumps(data))
    out = folder / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _evaluate(*args: str) -> dict:
    done = run_here("evaluate", *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _same(got: dict, want: dict) -> None:
    """An evaluation's figures against training's record of one (metrics.json)."""
    assert got["loss"] == pytest.approx(want["eval_loss"], rel=1e-5)
    assert got["token_accuracy"] == pytest.approx(want["token_accuracy"], abs=1e-6)
    assert got["perplexity"] == pytest.approx(math.exp(got["loss"]), rel=1e-5)


def test_the_validation_split_scores_as_training_evaluated_it(multi: Path) -> None:
    """The final adapter's figures are training's last evaluation (step 4), task by task; the
    base's (the adapter off) are the evaluation before the first step, when lora_B was 0. The
    rows pack several examples each: a KV cache in the forward pass (the model's default
    outside training) made transformers leave out the block-diagonal mask, and each example
    attended to the ones before it."""
    evals = {e["step"]: e for e in read_metrics(multi)["evals"]}
    result = _evaluate("--adapter", str(multi), "--split", "validation", "--compare-base")
    assert result["split"] == "validation"
    _same(result["total"]["expert"], evals[4])
    _same(result["total"]["base"], evals[0])
    assert result["total"]["expert"]["loss"] < result["total"]["base"]["loss"]
    tasks = {t["task"]: t for t in result["tasks"]}
    assert sorted(tasks) == ["chat", "sql"]
    for name in tasks:
        _same(tasks[name]["expert"], evals[4]["tasks"][name])
        _same(tasks[name]["base"], evals[0]["tasks"][name])
    assert tasks["sql"]["examples"] == 8 and tasks["chat"]["examples"] == 5
    assert result["total"]["examples"] == 13
    assert result["total"]["trained_tokens"] == sum(t["trained_tokens"] for t in tasks.values())
    (stats_file,) = (multi.parent / "e" / ".cache").glob("pretokenized/expert-test-*/stats.json")
    stats = json.loads(stats_file.read_text())["eval"]
    assert stats["rows"] < 13  # packed: several examples a row
    assert result["total"]["trained_tokens"] == stats["trained_tokens"]


def test_the_test_split_is_the_default_and_scored_task_by_task(multi: Path) -> None:
    """Each task's `test` file (here its validation examples again) is tokenized and packed as
    training's data was, apart: the same figures as the validation split's; a cache of its
    own in the cache root's evaluate/ folder, that leaves the expert's training cache its
    latest; `pretokenize --prune` removes them."""
    cache_root = multi.parent / "e" / ".cache" / "pretokenized"
    latest = (cache_root / "expert-test.latest.json").read_text()
    test = _evaluate("--adapter", str(multi))
    valid = _evaluate("--adapter", str(multi), "--split", "validation")
    assert test["split"] == "test"
    for got, want in zip(test["tasks"], valid["tasks"], strict=True):
        assert got["task"] == want["task"]
        assert got["source"] == f"training.dataset.tasks.{got['task']}.test"
        assert got["expert"]["loss"] == pytest.approx(want["expert"]["loss"], rel=1e-5)
        assert got["trained_tokens"] == want["trained_tokens"]
        assert got["examples"] == want["examples"]
    assert [t["shared_with_training"] for t in test["tasks"]] == [0, 0]
    assert (cache_root / "expert-test.latest.json").read_text() == latest
    assert len(list(cache_root.glob("evaluate/expert-test-*/stats.json"))) == 2  # a task each
    manifest = str(multi.parent / "e" / "manifest.json")
    again = run_here("pretokenize", "-m", manifest)
    assert again.returncode == 0 and "earlier" not in again.stdout, again.stdout
    pruned = run_here("pretokenize", "-m", manifest, "--prune")  # evaluate builds them again
    assert pruned.returncode == 0 and "pruned 2 earlier caches" in pruned.stdout, pruned.stdout
    assert not list(cache_root.glob("evaluate/expert-test-*/stats.json"))
    assert (cache_root / "expert-test.latest.json").read_text() == latest
    assert _evaluate("--adapter", str(multi))["tasks"] == test["tasks"]


def test_a_checkpoint_scores_as_its_evaluation(multi: Path) -> None:
    result = _evaluate(
        "--adapter", str(multi / "checkpoints" / "checkpoint-2"), "--split", "validation"
    )
    _same(result["total"]["expert"], {e["step"]: e for e in read_metrics(multi)["evals"]}[2])


def test_the_console_shows_each_task_and_the_change(multi: Path) -> None:
    done = run_here("evaluate", "--adapter", str(multi), "--compare-base")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("test split: 13 examples, ")
    assert "(training.dataset.tasks.sql.test, training.dataset.tasks.chat.test)" in lines[0]
    labels = [line.split()[0] for line in lines[2:] if line.strip()]
    assert labels[:9] == [
        "sql",
        "base",
        "change",
        "chat",
        "base",
        "change",
        "all",
        "base",
        "change",
    ]
    result = _evaluate("--adapter", str(multi), "--compare-base")
    change = result["total"]["expert"]["loss"] - result["total"]["base"]["loss"]
    (shown,) = [line for line in lines if line.split()[:1] == ["change"]][-1:]
    assert shown.split()[1] == f"{change:+.4f}"


@pytest.fixture
def single(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, Path]:
    """A run of 2 steps of one task with a validation file; (manifest, run folder)."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, valid_rows=6)
    out = tmp_path / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    return manifest, out


def _set_test(manifest: Path, value: str) -> None:
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["test_path"] = value
    manifest.write_text(json.dumps(data))


def test_errors_name_the_field_and_leave_nothing(single: tuple[Path, Path]) -> None:
    manifest, out = single
    cache_root = manifest.parent / ".cache" / "pretokenized"
    before = sorted(p.name for p in cache_root.iterdir())
    done = run_here("evaluate", "--adapter", str(out), "--split", "test")
    assert done.returncode == 2
    assert "--split test: the manifest names no test data (training.dataset.test_path" in (
        done.stderr
    )
    _set_test(manifest, "data/gone.jsonl")
    done = run_here("evaluate", "--adapter", str(out))
    assert done.returncode == 2 and "training.dataset.test_path" in done.stderr, done.stderr
    write_jsonl(manifest.parent / "data" / "test.jsonl", [{"text": ""}] * 3)
    _set_test(manifest, "data/test.jsonl")
    done = run_here("evaluate", "--adapter", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "training.dataset.test_path: no test example is left after formatting (3 read" in (
        done.stderr.replace("\n  ", " ")
    )
    assert "Traceback" not in done.stderr
    after = sorted(p.name for p in cache_root.iterdir())
    assert [name for name in after if name not in before and not name.endswith(".lock")] == []
    done = run_here("evaluate", "--adapter", str(manifest.parent))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    done = run_here("evaluate", "--adapter", str(out), "--batch-rows", "0")
    assert done.returncode == 2
    # a test split on the hub, not in the cache: said before the hub client's retries
    _set_test(manifest, "someone/their-test-set")
    done = run_here("evaluate", "--adapter", str(out))  # the tests' hub is switched off
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, said
    assert "training.dataset.test_path: dataset someone/their-test-set (no file or folder" in said
    assert "is not in the local cache and the hub is switched off (HF_HUB_OFFLINE)" in said
    closed = {"HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}
    closed["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens
    done = run_here("evaluate", "--adapter", str(out), env=closed)
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, said  # a run-time condition, not bad input
    assert "the hub cannot be reached at http://127.0.0.1:9" in said, said
    assert "thrown while requesting" not in said and "Traceback" not in said


def test_a_run_without_validation_says_so(tmp_path: Path, tiny_model_dir: Path) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16)
    out = tmp_path / "run"
    assert (
        run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "1").returncode
        == 0
    )
    done = run_here("evaluate", "--adapter", str(out))
    assert done.returncode == 2
    assert (
        "evaluate: nothing to score: the manifest names no test data (training.dataset."
        "test_path, or a multi_task expert's tasks.<name>.test), and the run has no "
        "validation split"
    ) in done.stderr.replace("\n  ", " ")


def test_a_test_file_added_after_training_is_read_and_counted(single: tuple[Path, Path]) -> None:
    """The test file is named after the run (the manifest file as it is now): its examples
    are counted as the build counted them, packed several a row; cut ones are said."""
    manifest, out = single
    shutil.copy(manifest.parent / "data" / "valid.jsonl", manifest.parent / "data" / "test.jsonl")
    _set_test(manifest, "data/test.jsonl")
    test = _evaluate("--adapter", str(out))
    valid = _evaluate("--adapter", str(out), "--split", "validation")
    assert test["split"] == "test" and test["tasks"] == []
    assert test["total"]["source"] == "training.dataset.test_path"
    assert test["total"]["examples"] == valid["total"]["examples"] == 6
    assert test["total"]["expert"]["loss"] == pytest.approx(
        valid["total"]["expert"]["loss"], rel=1e-5
    )
    assert test["settings"]["device"] == "cpu" and test["settings"]["batch_rows"] >= 1
    # write_expert's validation rows are its first training rows: found token for token
    assert test["total"]["shared_with_training"] == 6
    assert valid["total"]["shared_with_training"] is None  # the build's note says it of these
    assert (
        "training.dataset.test_path: 6 of its 6 examples are training examples too (the same "
        "tokens): their scores measure what the adapter memorized"
    ) in test["notes"]
    write_jsonl(
        manifest.parent / "data" / "test.jsonl", text_rows(23)[20:]
    )  # rows 0-15 are trained
    assert _evaluate("--adapter", str(out))["total"]["shared_with_training"] == 0


def test_an_expert_folder_that_cannot_be_written_is_scored_all_the_same(
    single: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An installed expert's folder (a read-only disk) could not take the test split's token
    cache, and evaluate has no option to put it elsewhere: it was exit 2 until the cache was
    built once where it could be written. It is built in a temporary folder, then removed."""
    import os
    import tempfile

    manifest, out = single
    shutil.copy(manifest.parent / "data" / "valid.jsonl", manifest.parent / "data" / "test.jsonl")
    _set_test(manifest, "data/test.jsonl")
    cache_root = manifest.parent / ".cache" / "pretokenized"
    writable = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path) != cache_root and writable(path, mode)
    )
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    got = _evaluate("--adapter", str(out))
    assert not (cache_root / "evaluate").exists() and list((tmp_path / "tmp").iterdir()) == []
    assert (
        f"{cache_root / 'evaluate'} cannot be written: the test split was tokenized in a "
        "temporary folder for this call alone (its token cache is not kept)"
    ) in got["notes"]
    monkeypatch.setattr(os, "access", writable)
    kept = _evaluate("--adapter", str(out))
    assert (cache_root / "evaluate").is_dir() and kept["total"] == got["total"]


def test_examples_shared_compares_whole_packed_examples() -> None:
    import datasets

    from expert_cli.data.overlap import example_keys, shared_with

    def examples_shared(train: datasets.Dataset, held: datasets.Dataset) -> int:
        return shared_with(example_keys(train), held)

    def rows(*examples: list[int]) -> datasets.Dataset:
        ids = [x for e in examples for x in e]
        pos = [p for e in examples for p in range(len(e))]
        return datasets.Dataset.from_dict({"input_ids": [ids], "position_ids": [pos]})

    train = rows([5, 6, 7], [1, 2], [9, 9])
    assert examples_shared(train, rows([1, 2], [5, 6, 7, 8], [6, 5, 7], [9])) == 1
    assert examples_shared(train, rows([9, 9], [5, 6, 7], [1, 2])) == 3
    assert examples_shared(train, rows([2, 1], [5, 6])) == 0  # order and prefixes differ
    assert examples_shared(rows(), rows([1, 2])) == 0


def test_example_count_reads_position_restarts() -> None:
    import datasets

    rows = datasets.Dataset.from_dict({"position_ids": [[0, 1, 2, 0, 1], [0, 1, 0, 0, 1, 2]]})
    assert example_count(rows) == 5
    assert example_count(rows.select([])) == 0


def test_the_model_s_own_forward_scores_as_the_sliced_loss(multi: Path) -> None:
    """A model the sliced loss cannot take (a softcap, a bias on the head, an adapted head) is
    scored by its own forward, logits and all: the same sums on the same rows."""
    from expert_cli.data.collate import PackedCollator
    from expert_cli.train.eval_split import validation_split
    from expert_cli.train.evaluate import _batch_sums
    from expert_cli.train.generate import load_run
    from expert_cli.train.loss import install_fused_loss

    run = load_run(multi)
    rows = validation_split(run.resolved, run.tokenizer, run.data_record).parts[0].rows
    features = [rows[i] for i in range(len(rows))]
    own = _batch_sums(run.model, PackedCollator(0)(features))
    install_fused_loss(run.model.get_base_model(), "chunked")
    sliced = _batch_sums(run.model, PackedCollator(0, loss_positions=True)(features))
    assert own.tokens == sliced.tokens > 0
    assert own.loss == pytest.approx(sliced.loss, rel=1e-5)
    assert own.hits == sliced.hits


def test_generate_eval_takes_the_test_split_when_asked(multi: Path) -> None:
    """`generate --eval N --split test` answers the test split's examples (here the
    validation examples again, packed in another order: the same references); --split alone
    is refused."""

    def references(*extra: str) -> list[str]:
        args = ("--eval", "20", "--max-new-tokens", "2", "--json", *extra)
        done = run_here("generate", "--adapter", str(multi), *args)
        assert done.returncode == 0, done.stdout + done.stderr
        return sorted(g["reference"] for g in json.loads(done.stdout)["generations"])

    test = references("--split", "test")
    assert len(test) == 13 and all(test)
    assert test == references() == references("--split", "validation")
    done = run_here("generate", "--adapter", str(multi), "--split", "test", "-p", "hi")
    assert done.returncode == 2
    assert "--split test: chooses --eval's examples; give --eval N too" in done.stderr


def test_the_validation_split_does_not_read_the_manifest_file(single: tuple[Path, Path]) -> None:
    """The validation split is the run's own token cache: a manifest file broken since the run
    stops only what reads it (the test data it names), named, never quoted."""
    manifest, out = single
    manifest.write_text('{"name": "secret-value", ')
    assert _evaluate("--adapter", str(out), "--split", "validation")["total"]["examples"] == 6
    done = run_here("generate", "--adapter", str(out), "--eval", "1", "--max-new-tokens", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    done = run_here("evaluate", "--adapter", str(out))
    assert done.returncode == 2 and "manifest.json" in done.stderr, done.stderr
    assert "secret-value" not in done.stderr and "Traceback" not in done.stderr


def test_a_test_folder_reads_its_test_files(single: tuple[Path, Path]) -> None:
    """test_path naming the data folder (train.jsonl, valid.jsonl, test.jsonl in it) read its
    training file, as a training source reads a folder: the test split's files are read."""
    manifest, out = single
    write_jsonl(manifest.parent / "data" / "test.jsonl", text_rows(23)[20:])
    _set_test(manifest, "data")
    result = _evaluate("--adapter", str(out))
    assert result["total"]["examples"] == 3 and result["total"]["shared_with_training"] == 0
    (manifest.parent / "data" / "test.jsonl").unlink()
    done = run_here("evaluate", "--adapter", str(out))
    assert done.returncode == 2 and "no data file in it is named for the test split" in (
        done.stderr.replace("\n  ", " ")
    ), done.stderr


def test_what_the_formatting_did_is_said(single: tuple[Path, Path]) -> None:
    """Examples cut at max_seq_length, left out, or scored on their whole text are counted in
    the notes (only --json had the counts); an example counts once however it is packed."""
    manifest, out = single
    rows = text_rows(23)[20:] + [
        {"text": "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n" + "select " * 300},
        {"text": ""},
        {"text": "a plain document without turns"},
    ]
    write_jsonl(manifest.parent / "data" / "test.jsonl", rows)
    _set_test(manifest, "data/test.jsonl")
    result = _evaluate("--adapter", str(out))
    total, notes = result["total"], result["notes"]
    assert (total["examples"], total["dropped"]) == (5, 1)
    assert any(
        n.startswith("training.dataset.test_path: 1 of its 6 examples left out (") for n in notes
    )
    assert any(": 2 examples cut at max_seq_length 128 (as in training)" in n for n in notes)
    assert any(
        n.startswith("training.dataset.test_path: scored on ") and "whole text 1" in n
        for n in notes
    )


def test_a_missing_test_file_of_a_later_task_builds_nothing(multi: Path) -> None:
    """Every test file is looked for before any is built: a refused call leaves no cache of
    the tasks before it. A task the run did not train, and one with no test file, are said."""
    manifest = multi.parent / "e" / "manifest.json"
    kept = manifest.read_text()
    cache = multi.parent / "e" / ".cache" / "pretokenized" / "evaluate"
    before = sorted(p.name for p in cache.glob("expert-test-*")) if cache.is_dir() else []
    data = json.loads(kept)
    tasks = data["training"]["dataset"]["tasks"]
    try:
        tasks["sql"]["test"] = "data/sql-valid.jsonl"  # another file: a cache of its own
        tasks["chat"]["test"] = "data/nope.jsonl"
        manifest.write_text(json.dumps(data))
        done = run_here("evaluate", "--adapter", str(multi))
        assert done.returncode == 2
        assert (
            "training.dataset.tasks.chat.test: data/nope.jsonl is not there"
            in done.stderr.replace(str(multi.parent / "e") + "/", "")
        ), done.stderr
        assert sorted(p.name for p in cache.glob("expert-test-*")) == before
        del tasks["chat"]["test"]
        tasks["extra"] = {"train": "data/chat.jsonl", "test": "data/chat-valid.jsonl"}
        manifest.write_text(json.dumps(data))
        result = _evaluate("--adapter", str(multi))
        assert [t["task"] for t in result["tasks"]] == ["sql", "extra"]
        assert "task chat: no test data named (tasks.<name>.test): not scored" in result["notes"]
        assert (
            "task extra: not a task the run trained (it trained sql, chat); scored as named"
        ) in result["notes"]
        tasks["sql"]["test"] = "data/chat-valid.jsonl"  # the same file as extra's
        manifest.write_text(json.dumps(data))
        result = _evaluate("--adapter", str(multi))
        assert (
            "training.dataset.tasks.sql.test, training.dataset.tasks.extra.test: the same test "
            "data: its examples count 2 times in the whole"
        ) in result["notes"]
        assert result["total"]["examples"] == 10
    finally:
        manifest.write_text(kept)


def test_a_held_out_fraction_and_the_default_generate_notes(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A validation split held out by eval_fraction counts its examples (it said 0: the
    build counts what it reads from validation files); `generate --eval` keeps its own words
    for cut examples, none of evaluate's."""
    manifest = write_expert(
        tmp_path / "e",
        tiny_model_dir,
        rows=40,
        config={"max_seq_length": 64, "evaluation_strategy": "steps", "eval_steps": 1},
    )
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["eval_fraction"] = 0.2
    manifest.write_text(json.dumps(data))
    out = tmp_path / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    result = _evaluate("--adapter", str(out))
    total = result["total"]
    assert (
        total["examples"] == 8 and total["source"] == "held out by training.dataset.eval_fraction"
    )
    _same(total["expert"], read_metrics(out)["evals"][-1])
    assert total["truncated"] > 0  # examples of up to 3 turns over 64 tokens
    assert any(
        ": " + f"{total['truncated']} examples cut at max_seq_length 64" in n
        for n in result["notes"]
    )
    done = run_here(
        "generate", "--adapter", str(out), "--eval", "8", "--max-new-tokens", "1", "--json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    notes = json.loads(done.stdout)["notes"]
    assert not [n for n in notes if "scored" in n], notes
    assert any("cut at max_seq_length=64 in training and left out" in n for n in notes), notes


def test_the_run_s_copy_of_a_gone_manifest_is_said(single: tuple[Path, Path]) -> None:
    manifest, out = single
    shutil.copy(manifest.parent / "data" / "valid.jsonl", manifest.parent / "data" / "test.jsonl")
    _set_test(manifest, "data/test.jsonl")
    assert _evaluate("--adapter", str(out))["split"] == "test"
    manifest.unlink()  # the run's copy names no test data: it was trained without
    result = _evaluate("--adapter", str(out))
    assert result["split"] == "validation"
    (gone,) = [n for n in result["notes"] if n.startswith("the manifest the run was trained")]
    assert (
        "is gone, and its copy in the run folder (manifest.source.json) names no test data" in gone
    )
    done = run_here("evaluate", "--adapter", str(out), "--split", "test")
    assert done.returncode == 2 and "names no test data" in done.stderr.replace("\n  ", " ")
    copy = json.loads((out / "manifest.source.json").read_text())
    copy["training"]["dataset"]["test_path"] = "data/test.jsonl"
    (out / "manifest.source.json").write_text(json.dumps(copy))
    result = _evaluate("--adapter", str(out))
    assert result["split"] == "test" and result["total"]["examples"] == 6
    assert any(
        "is gone: the test data its copy in the run folder (manifest.source.json) names is read"
        in n
        for n in result["notes"]
    )
    (out / "manifest.source.json").unlink()
    done = run_here("evaluate", "--adapter", str(out), "--split", "test")
    assert done.returncode == 2
    assert "is gone and the run kept no copy (manifest.source.json)" in done.stderr.replace(
        "\n  ", " "
    )


@pytest.mark.parametrize(("sent", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_while_scoring_says_nothing_was_written(
    multi: Path, monkeypatch: pytest.MonkeyPatch, sent: str, code: int
) -> None:
    """SIGTERM ended evaluate where it stood: exit 143, no line, and with --json no JSON; both
    signals now say nothing was written, in the JSON error too."""
    import signal

    from expert_cli.train import evaluate as module

    def signalled(model: object, batch: object) -> None:
        signal.raise_signal(getattr(signal, sent))

    monkeypatch.setattr(module, "_batch_sums", signalled)
    done = run_here("evaluate", "--adapter", str(multi), "--split", "validation", "--json")
    assert done.returncode == code, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "interrupted" and error["exit_code"] == code
    assert "stopped before the scores: nothing was written" in error["lines"][0]
