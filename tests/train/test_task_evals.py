"""A multi_task expert's evaluation, task by task: one eval_loss hid a task getting worse
while another got better. Each task's rows are evaluated in batches of its own, its loss and
token accuracy counted over its trained tokens; the split's figures stay what they were."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from conftest import write_jsonl
from peft import LoraConfig, get_peft_model
from train_helpers import (
    echoing_rows,
    eval_args,
    multi_task_expert,
    read_metrics,
    run_here,
)
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from expert_cli.train.trainer import build_trainer

DEMO_MODEL = Path(__file__).parents[2] / "experts" / "demo" / "model"


def _by_hand(model: torch.nn.Module, rows: list[dict]) -> tuple[float, float]:
    """(loss per trained token, share of trained tokens the argmax predicts), a row at a time."""
    summed = hits = count = 0.0
    with torch.no_grad():
        for row in rows:
            logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0, :-1].float()
            targets = torch.tensor(row["labels"][1:])
            kept = targets != -100
            losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            summed += losses[kept].sum().item()
            hits += (logits.argmax(-1) == targets)[kept].sum().item()
            count += kept.sum().item()
    return summed / count, hits / count


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(DEMO_MODEL), attn_implementation="sdpa"
    )
    with torch.no_grad():  # the head reads back the embedding: it predicts the token it reads
        model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight * 8)
    return model.eval()


@pytest.mark.parametrize(
    ("loss", "batch", "grouped"),
    [(loss, batch, False) for loss in ("standard", "chunked") for batch in (1, 2, 4)]
    + [("standard", 2, True)],
)
def test_each_task_is_evaluated_over_its_own_tokens(
    tmp_path: Path, batch: int, loss: str, grouped: bool
) -> None:
    """Three rows of task `sql`, then two of `chat`: in batches of 2 or 4 a batch would hold
    both tasks' rows, where its one loss could not be told apart. group_by_length's
    evaluation sampler mixed them (and the tasks' figures went unsaid)."""
    from expert_cli.train.loss import install_fused_loss

    model, rows = _model(), echoing_rows()
    split, sql, chat = _by_hand(model, rows), _by_hand(model, rows[:3]), _by_hand(model, rows[3:])
    assert abs(sql[0] - chat[0]) > 0.02 and abs(sql[1] - chat[1]) > 0.005  # told apart
    if loss == "chunked":
        install_fused_loss(model, "chunked")
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    args = eval_args(tmp_path / "out", batch)
    if grouped:
        args.train_sampling_strategy = "group_by_length"
    tasks = [{"task": "sql", "rows": 3}, {"task": "chat", "rows": 2}]
    data = types.SimpleNamespace(
        train=None, eval=datasets.Dataset.from_list(rows), stats={"eval": {"tasks": tasks}}
    )
    trainer, _ = build_trainer(model, args, data, AutoTokenizer.from_pretrained(DEMO_MODEL), "sdpa")
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(split[0], rel=1e-4)
    assert metrics["eval_token_accuracy"] == pytest.approx(split[1], abs=1e-12)
    for name, (task_loss, accuracy) in (("sql", sql), ("chat", chat)):
        assert metrics[f"eval_{name}_loss"] == pytest.approx(task_loss, rel=1e-4)
        assert metrics[f"eval_{name}_token_accuracy"] == pytest.approx(accuracy, abs=1e-12)


def test_a_cache_without_tasks_evaluates_the_split_alone(tmp_path: Path) -> None:
    """An earlier cache (no task rows recorded) or rows that do not add up: no task figures."""
    rows = echoing_rows()
    model = get_peft_model(_model(), LoraConfig(r=4, target_modules=["q_proj"]))
    args = eval_args(tmp_path / "out")
    for stats in ({}, {"eval": {"tasks": [{"task": "a", "rows": 3}, {"task": "b", "rows": 1}]}}):
        data = types.SimpleNamespace(train=None, eval=datasets.Dataset.from_list(rows), stats=stats)
        tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
        trainer, _ = build_trainer(model, args, data, tokenizer, "sdpa")
        metrics = trainer.evaluate()
        assert "eval_loss" in metrics and not [k for k in metrics if k.startswith("eval_a_")]


def test_a_multi_task_run_reports_each_task(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The cache packs each task's validation examples apart (its rows named in stats), and
    every evaluation gives each task's loss and token accuracy on the console and in
    metrics.json, which add up to the split's."""
    manifest = multi_task_expert(tmp_path / "e", tiny_model_dir)
    out = tmp_path / "run"
    done = run_here("train", "--manifest", str(manifest), "--output", str(out), "--max-steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    (stats_file,) = (manifest.parent / ".cache").rglob("stats.json")
    stats = json.loads(stats_file.read_text())["eval"]
    tasks = stats["tasks"]
    assert [t["task"] for t in tasks] == ["sql", "chat"]
    assert sum(t["rows"] for t in tasks) == stats["rows"]
    shown = run_here("pretokenize", "--manifest", str(manifest)).stdout
    by_task = f"(by task: sql {tasks[0]['rows']}, chat {tasks[1]['rows']})"
    assert f"eval: rows {stats['rows']} {by_task}" in shown
    assert sum(t["trained_tokens"] for t in tasks) == stats["trained_tokens"]
    evals = read_metrics(out)["evals"]
    assert [e["step"] for e in evals] == [0, 2]
    for record in evals:
        weights = {t["task"]: t["trained_tokens"] for t in tasks}
        by_task = record["tasks"]
        assert sorted(by_task) == ["chat", "sql"]
        mean = sum(by_task[n]["eval_loss"] * w for n, w in weights.items()) / sum(weights.values())
        assert mean == pytest.approx(record["eval_loss"], rel=1e-5)
        hits = sum(by_task[n]["token_accuracy"] * w for n, w in weights.items())
        assert hits / sum(weights.values()) == pytest.approx(record["token_accuracy"], abs=1e-9)
    assert done.stdout.count("by task: sql ") == 2
    best = min(evals[1:], key=lambda e: e["eval_loss"])["tasks"]  # report: the best's, by task
    report = run_here("report", str(out))
    assert report.returncode == 0, report.stdout + report.stderr
    sql, chat = best["sql"], best["chat"]
    assert (
        f"by task   sql {sql['eval_loss']:.4g} ({sql['token_accuracy']:.1%})  "
        f"chat {chat['eval_loss']:.4g} ({chat['token_accuracy']:.1%})"
    ) in report.stdout
    # generate --eval takes each task's examples in turn, and says whose each is
    for split in ("validation", "test"):
        asked = ("generate", "--adapter", str(out), "--eval", "5", "--split", split)
        tried = run_here(*asked, "--max-new-tokens", "2", "--json")
        assert tried.returncode == 0, tried.stdout + tried.stderr
        generations = json.loads(tried.stdout)["generations"]
        assert [g["task"] for g in generations] == ["sql", "chat", "sql", "chat", "sql"]
        words = [g["prompt"].split()[1] for g in generations]  # "user select 19 assistant"
        assert words == ["select", "hello", "select", "hello", "select"], generations
    shown = run_here(*asked[:-2], "--max-new-tokens", "2").stdout
    assert "prompt 1 (task sql)" in shown and "prompt 2 (task chat)" in shown


@pytest.mark.slow
def test_two_processes_evaluate_each_task_as_one_does(tmp_path: Path, tiny_model_dir: Path) -> None:
    """torchrun over 2 processes of 2 rows against one process of 4: each process evaluates
    its share of each task's batches, and the sums over both are the one process's."""
    from train_helpers import launch

    alone = multi_task_expert(tmp_path / "one", tiny_model_dir, batch_size=4)
    split = multi_task_expert(tmp_path / "two", tiny_model_dir, batch_size=2)
    train = ("train", "--max-steps", "2", "--manifest")
    single = run_here(*train, str(alone), "--output", str(tmp_path / "a"))
    assert single.returncode == 0, single.stdout + single.stderr
    torchrun = ["torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    two = launch(torchrun, *train, str(split), "--output", str(tmp_path / "b"))
    assert two.returncode == 0, two.stdout + two.stderr
    evals = [read_metrics(tmp_path / run)["evals"] for run in ("a", "b")]
    assert [e["step"] for e in evals[0]] == [e["step"] for e in evals[1]] == [0, 2]
    assert [e["step"] for e in evals[0]] == [e["step"] for e in evals[1]] == [0, 2]
    (one, _), (other, trained) = evals  # before training: the same model in both
    assert sorted(one["tasks"]) == sorted(other["tasks"]) == ["chat", "sql"]
    for name, figures in one["tasks"].items():
        got = other["tasks"][name]
        assert got["eval_loss"] == pytest.approx(figures["eval_loss"], rel=1e-6)
        assert got["token_accuracy"] == pytest.approx(figures["token_accuracy"], abs=1e-12)
    # the training of 2 x 2 rows is not 1 x 4's (its own shuffle): its tasks add up to its split
    (cache,) = (split.parent / ".cache").rglob("stats.json")
    weights = {
        t["task"]: t["trained_tokens"] for t in json.loads(cache.read_text())["eval"]["tasks"]
    }
    mean = sum(trained["tasks"][n]["eval_loss"] * w for n, w in weights.items())
    assert mean / sum(weights.values()) == pytest.approx(trained["eval_loss"], rel=1e-6)


def test_few_validation_examples_of_a_task_are_said() -> None:
    """Each task's loss rests on its own examples: a task of 5 beside one of 40 was said
    nothing of (the split's 45 are enough for one loss)."""
    from expert_cli.data.splits import split_note

    tasks = [{"task": "sql", "examples": 40}, {"task": "chat", "examples": 5}]
    note = split_note({"eval": {"examples": 45, "tasks": tasks}})
    assert note is not None and note.startswith(
        "the validation split gives each task's loss apart, and holds few examples of task "
        "chat (5): that loss rests on so few; give each task 16 or more"
    )
    tasks[0]["examples"] = 12
    assert "of tasks sql (12) and chat (5): those losses rest" in split_note(
        {"eval": {"examples": 17, "tasks": tasks}}
    )
    assert split_note({"eval": {"examples": 13, "tasks": tasks}}).startswith(  # the split's
        "the validation split holds 13 examples"
    )
    tasks[1]["examples"] = 16
    tasks[0]["examples"] = 16
    assert split_note({"eval": {"examples": 32, "tasks": tasks}}) is None


def test_check_says_a_tasks_few_validation_examples_as_the_build(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from expert_cli.data.checks import check_manifest

    manifest = multi_task_expert(tmp_path / "e", tiny_model_dir)
    rows = [
        {"text": f"<|im_start|>user\nq {i}<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"}
        for i in range(20)
    ]
    write_jsonl(manifest.parent / "data" / "sql-valid.jsonl", rows)
    said = [n for n in check_manifest(manifest).notes if "few examples" in n]
    assert said == [
        "the validation split gives each task's loss apart, and holds few examples of task "
        "chat (5): that loss rests on so few; give each task 16 or more (in its valid file, "
        "or by a larger training.dataset.eval_fraction where there is none)"
    ]
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert said[0] in " ".join(built.stdout.split())


def test_a_task_whose_validation_is_all_dropped_or_too_small_is_said(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A task whose validation examples were all dropped left a shard of no rows, which the
    datasets library cannot load again: the build was an IndexError traceback. It is left
    out of the evaluation, with a note; so is a task too small to hold one out."""
    manifest = multi_task_expert(tmp_path / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["overlong"] = "drop"
    data["training"]["config"]["max_seq_length"] = 64
    manifest.write_text(json.dumps(data))
    long = [{"text": "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n" + "a b " * 80}]
    write_jsonl(manifest.parent / "data" / "chat-valid.jsonl", long * 5)
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0, built.stdout + built.stderr
    assert (
        "every validation example of chat was dropped (5 over max_seq_length=64 with "
        "overlong: drop): the evaluation gives no loss for it"
    ) in " ".join(built.stdout.split())
    # no valid files, and a task of one example: nothing of it held out
    data["training"]["dataset"]["overlong"] = "truncate"
    for task in data["training"]["dataset"]["tasks"].values():
        del task["valid"]
    data["training"]["dataset"]["eval_fraction"] = 0.25
    manifest.write_text(json.dumps(data))
    write_jsonl(manifest.parent / "data" / "chat.jsonl", long[:1])
    said = (
        "training.dataset.tasks: chat holds too few examples to hold one out for evaluation "
        "(2 or more are needed): the evaluation gives no loss for it"
    )
    from expert_cli.data.checks import check_manifest

    assert said in check_manifest(manifest).notes
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert said in " ".join(built.stdout.split())


def test_a_task_name_that_cannot_name_its_figures_is_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = multi_task_expert(tmp_path / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    tasks = data["training"]["dataset"]["tasks"]
    for name in ("", " ", "a\nb", "x" * 81):
        data["training"]["dataset"]["tasks"] = {"sql": tasks["sql"], name: tasks["chat"]}
        manifest.write_text(json.dumps(data))
        done = run_here("check", "--manifest", str(manifest))
        assert done.returncode == 2, done.stdout
        assert (
            "training.dataset.tasks: task 2's name: expected 1 to 80 printable characters"
        ) in " ".join((done.stdout + done.stderr).split())


def _lowest_chat(manifest: Path, out: Path, steps: int) -> tuple[Any, dict]:
    """Train; the run's output and its evaluation of chat's lowest loss after training."""
    done = run_here(
        "train", "--manifest", str(manifest), "--output", str(out), "--max-steps", str(steps)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    trained = [e for e in read_metrics(out)["evals"] if e["step"] > 0]
    return done, min(trained, key=lambda e: e["tasks"]["chat"]["eval_loss"])


def test_the_best_adapter_chosen_by_a_tasks_loss(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Mixing general data into a domain expert, the checkpoint to keep is the domain task's
    lowest loss: `metric_for_best_model: eval_<task>_loss` was refused (eval_loss or loss)."""
    manifest = multi_task_expert(tmp_path / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    data["training"]["config"].update(
        metric_for_best_model="eval_chat_loss", load_best_model_at_end=True, save_steps=2
    )
    manifest.write_text(json.dumps(data))
    out = tmp_path / "run"
    _, best = _lowest_chat(manifest, out, 4)
    chat = best["tasks"]["chat"]["eval_loss"]
    report = run_here("report", str(out))
    assert f"best eval loss of task chat {chat:.4g} at step {best['step']}" in report.stdout
    state = json.loads(
        (out / "checkpoints" / f"checkpoint-{best['step']}" / "trainer_state.json").read_text()
    )
    assert state["best_metric"] == pytest.approx(chat)  # the Trainer chose by it too
    stopping = {"early_stopping_patience": 1, "early_stopping_threshold": 100.0}
    data["training"]["config"].update(stopping)
    manifest.write_text(json.dumps(data))
    done, low = _lowest_chat(manifest, tmp_path / "stopped", 6)
    assert (
        f"stopped early at step 4 of 6: 1 evaluation in a row without the loss improving by "
        f"more than 100 (early_stopping_patience); the lowest eval_chat_loss "
        f"{low['tasks']['chat']['eval_loss']:.4g}, at step {low['step']}"
    ) in " ".join(done.stdout.split())
    for key in stopping:
        del data["training"]["config"][key]
    for metric, said in (
        ("eval_nope_loss", "eval_nope_loss names no task (the tasks are sql, chat)"),
        ("eval_accuracy", "metric_for_best_model"),
    ):
        data["training"]["config"]["metric_for_best_model"] = metric
        manifest.write_text(json.dumps(data))
        refused = run_here("check", "--manifest", str(manifest))
        assert refused.returncode == 2 and said in " ".join(refused.stdout.split()), refused.stdout
    # a task with one example holds none out: the Trainer's KeyError at its first evaluation
    for task in data["training"]["dataset"]["tasks"].values():
        del task["valid"]
    data["training"]["config"]["metric_for_best_model"] = "eval_chat_loss"
    manifest.write_text(json.dumps(data))
    write_jsonl(manifest.parent / "data" / "chat.jsonl", [{"text": "one example"}])
    refused = run_here("train", "--manifest", str(manifest), "--output", str(tmp_path / "r2"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "the evaluation split holds no example of task chat" in " ".join(refused.stderr.split())
    assert not (tmp_path / "r2").exists()  # nothing half-written left
    # the split holds sql alone: its loss is the split's, chosen by
    data["training"]["config"]["metric_for_best_model"] = "eval_sql_loss"
    manifest.write_text(json.dumps(data))
    alone = run_here("train", "--manifest", str(manifest), "--output", str(tmp_path / "r3"))
    assert alone.returncode == 0, alone.stdout + alone.stderr
    (record,) = [e for e in read_metrics(tmp_path / "r3")["evals"] if e["step"] > 0][-1:]
    report = run_here("report", str(tmp_path / "r3"))
    assert f"best eval loss of task sql {record['eval_loss']:.4g}" in report.stdout
    # a resume that changes the metric: the best so far is of the other one
    again = run_here(
        "train", "--manifest", str(manifest), "--output", str(tmp_path / "r3"), "--resume",
        "--max-steps", "30", "--set", "metric_for_best_model=eval_loss",
    )  # fmt: skip
    assert again.returncode == 2, again.stdout + again.stderr
    assert "metric_for_best_model" in again.stderr
