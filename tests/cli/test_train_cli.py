"""`expert-cli train` on the demo expert through the CLI: outputs, reload, loss, metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from train_helpers import load_adapter, png_facts, read_metrics, run_here, run_main

STEPS = 10
WINDOW_KEYS = {
    "step",
    "tokens_per_s",
    "samples_per_s",
    "data_wait_fraction",
    "mfu",
    "peak_memory_gb",
    "loss",
    "learning_rate",
    "seconds",
    "time",
    "tokens_seen",
    "grad_norm",
}
SUMMARY_KEYS = {
    "tokens_per_s",
    "samples_per_s",
    "data_wait_fraction",
    "mfu",
    "steps",
    "steps_this_run",
    "train_runtime_s",
    "tokens",
    "trained_tokens",
    "final_loss",
    "status",
    "steady",  # with two windows or more: the rates without the first
}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    import shutil

    from conftest import DEMO_EXPERT_DIR

    expert = tmp_path_factory.mktemp("demo") / "demo"
    shutil.copytree(DEMO_EXPERT_DIR, expert, ignore=shutil.ignore_patterns(".cache", "output"))
    out = expert / "out"
    proc = run_here(
        "train",
        "--manifest",
        str(expert / "manifest.json"),
        "--output",
        str(out),
        "--max-steps",
        str(STEPS),
        "--set",
        "save_steps=10",
        "--set",
        "eval_steps=5",
        "--set",
        "logging_steps=5",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return expert, out, proc.stdout


@pytest.mark.slow
def test_outputs_written(demo_run: tuple[Path, Path, str]) -> None:
    _, out, stdout = demo_run
    for name in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "manifest.resolved.json",
        "manifest.source.json",
        "metrics.json",
        "training.png",
    ):
        assert (out / name).is_file(), name
    assert png_facts(out / "training.png")[2]["Description"].count(",") == 3  # four panels
    assert (out / "checkpoints" / f"checkpoint-{STEPS}").is_dir()
    assert list((out / "runs").glob("events.out.tfevents.*"))
    assert (out / "base_model" / "model.safetensors").is_file()  # the random init
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    assert resolved["runtime"]["final_step"] == STEPS  # the step the final adapter holds
    # the manifest as its file holds it, and the --set values the run applied to it
    config = json.loads((out / "manifest.source.json").read_text())["training"]["config"]
    assert config["save_steps"] != 10 and resolved["save_steps"] == 10
    assert resolved["runtime"]["overrides"] == ["save_steps=10", "eval_steps=5", "logging_steps=5"]
    model = resolved["runtime"]["model"]
    # a CPU run takes the portable path, and both the config and the run record it
    assert (
        model["attn_implementation"],
        model["fused_loss"],
        model["adapter_precision"],
        model["liger_kernels"],
        model["compiled_layers"],
        model["attention_isolation"],
    ) == ("sdpa", "off", "fp32", False, 0, "verified")
    # the step line says "torch.compile off": no note repeats it
    assert "torch.compile off" in stdout and "torch_compile: off" not in stdout
    assert not any(n.startswith("torch_compile") for n in model["notes"])
    assert (
        resolved["attn_implementation"],
        resolved["fused_loss"],
        resolved["batch_auto"],
        resolved["torch_compile"],
    ) == ("sdpa", "off", False, False)
    for text in (
        "attention sdpa (causal, packed examples apart: checked)",
        "loss standard (full logits)",
        "trainable of",
        "data ",
        "cache ",
        "completed",
    ):
        assert text in stdout, text


@pytest.mark.slow
def test_loss_falls_and_metrics_schema(demo_run: tuple[Path, Path, str]) -> None:
    _, out, stdout = demo_run
    metrics = read_metrics(out)
    windows = metrics["windows"]
    assert [w["step"] for w in windows] == [5, 10]
    assert [e["step"] for e in metrics["evals"]] == [5, 10]  # eval_steps=5
    assert metrics["evals"][0]["eval_loss"] > 0
    # the evaluation after step 5 is left out of the second window's seconds, recorded apart;
    # the evaluation and the save after the last step are in no window, and in the summary
    assert set(windows[0]) == WINDOW_KEYS and set(windows[1]) == WINDOW_KEYS | {"eval_s"}
    assert windows[1]["eval_s"] > 0
    assert set(metrics["summary"]) == SUMMARY_KEYS | {"eval_s", "save_s"}
    assert metrics["summary"]["eval_s"] > windows[1]["eval_s"] and metrics["summary"]["save_s"] > 0
    assert f"step 10/{STEPS}" in stdout and "evaluation " in stdout.split("step 10/")[1]
    assert all(w["grad_norm"] > 0 for w in windows)  # the window's last step's, unclipped
    assert f"grad-norm {windows[0]['grad_norm']:.3g}" in stdout
    assert "  rss " in stdout and "  mem " not in stdout  # a CPU run's memory: its RSS
    apart = r"\(evaluation [\d.]+ s excluded, saves (<0\.1|[\d.]+) s excluded\)"
    assert re.search(r"completed\s+10 steps in [\d.]+ s " + apart, stdout)
    assert windows[-1]["loss"] < windows[0]["loss"]
    summary = metrics["summary"]
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["tokens_per_s"] > 0 and 0 <= summary["data_wait_fraction"] < 1
    assert 0 < summary["trained_tokens"] < summary["tokens"]
    # one tokens/s: the run's is the windows' tokens over the windows' wall seconds
    seconds = sum(w["seconds"] for w in windows)
    assert summary["train_runtime_s"] == pytest.approx(seconds, abs=0.01)
    tokens = sum(w["tokens_per_s"] * w["seconds"] for w in windows)
    assert summary["tokens_per_s"] == pytest.approx(tokens / seconds, rel=0.01)
    assert summary["steps_this_run"] == STEPS
    # the rates without the first window: windows[1:] alone
    rest = windows[1:]
    steady_seconds = sum(w["seconds"] for w in rest)
    steady_tokens = sum(w["tokens_per_s"] * w["seconds"] for w in rest)
    assert summary["steady"]["after_step"] == windows[0]["step"]
    assert summary["steady"]["tokens_per_s"] == pytest.approx(
        steady_tokens / steady_seconds, rel=0.01
    )


@pytest.mark.slow
def test_adapter_reloads_with_the_end_of_training_loss(demo_run: tuple[Path, Path, str]) -> None:
    """PeftModel.from_pretrained + the eval rows reproduce the Trainer's final eval loss."""
    import torch
    from transformers import AutoTokenizer

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.collate import PackedCollator

    expert, out, _ = demo_run
    state = json.loads(
        (out / "checkpoints" / f"checkpoint-{STEPS}" / "trainer_state.json").read_text()
    )
    final_eval = [
        e["eval_loss"] for e in state["log_history"] if e.get("step") == STEPS and "eval_loss" in e
    ]
    resolved = resolve(load_manifest(expert / "manifest.json"), cpu_environment())
    tokenizer = AutoTokenizer.from_pretrained(out)
    data = prepare_data(resolved, tokenizer)
    collate = PackedCollator(tokenizer.pad_token_id)
    model = load_adapter(out)
    summed, trained = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(data.eval), resolved.batch_size):
            rows = [
                data.eval[i] for i in range(start, min(start + resolved.batch_size, len(data.eval)))
            ]
            batch = collate(rows)
            count = int((batch["labels"][:, 1:] != -100).sum())
            summed += model(**batch, use_cache=False).loss.item() * count
            trained += count
    # the eval loss is per trained token over the whole split, not a mean of batch means
    assert summed / trained == pytest.approx(final_eval[0], abs=1e-4)


def test_evaluation_without_validation_rows_stops_before_the_model(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    from train_helpers import write_expert

    manifest = write_expert(
        tmp_path / "e",
        tiny_model_dir,
        config={"evaluation_strategy": "steps", "eval_steps": 5},
    )
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["eval_fraction"] = 0.0
    manifest.write_text(json.dumps(data))
    code, stdout, err = run_main(
        capsys, monkeypatch, "train", "--manifest", str(manifest), "--output", str(tmp_path / "out")
    )
    assert code == 2, stdout + err
    assert (  # said as the manifest is read: check says it too, and no cache is built
        "training.config.evaluation_strategy: steps, and the run has nothing to evaluate"
        in " ".join(err.split())
    )
    assert not (tmp_path / "out").exists()  # no model was loaded, no folder made
    assert not (tmp_path / "e" / ".cache").exists()


def test_a_negative_max_steps_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    from train_helpers import write_expert

    manifest = write_expert(tmp_path / "e", tiny_model_dir)
    out = run_here("train", "--manifest", str(manifest), "--max-steps", "-3")
    assert out.returncode == 2 and "--max-steps" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_generate_on_the_demo_run(capsys, monkeypatch, demo_run: tuple[Path, Path, str]) -> None:
    """One completion per prompt, streamed; the demo's random base is said to give noise."""
    _, out, _ = demo_run
    prompts = ("List the 5 most recent orders.", "How many customers are there?")
    args = ("generate", "--adapter", str(out), "-p", prompts[0], "-p", prompts[1])
    text = run_here(*args, "--max-new-tokens", "8")
    assert text.returncode == 0, text.stdout + text.stderr
    assert text.stdout.count("expert: ") == 2
    assert "prompt 1" in text.stdout and "prompt 2" in text.stdout
    assert "random initialisation: its answers are noise by design" in " ".join(text.stdout.split())
    code, report, err = run_main(capsys, monkeypatch, *args, "--max-new-tokens", "8", "--json")
    assert code == 0, err
    pairs = [(g["prompt"], g["output"]) for g in json.loads(report)["generations"]]
    assert [p for p, _ in pairs] == list(prompts)
    assert all(isinstance(o, str) and o for _, o in pairs)
    assert all(g["new_tokens"] <= 8 for g in json.loads(report)["generations"])


@pytest.mark.slow
def test_a_run_shorter_than_logging_steps_reports_its_loss(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`--max-steps 2` with logging_steps 50 (a quick try) ended with `final loss -`: no
    window had logged a loss. The run logs at its last step at the latest."""
    from train_helpers import write_expert

    manifest = write_expert(tmp_path / "e", tiny_model_dir, config={"logging_steps": 50})
    out = tmp_path / "out"
    code, stdout, err = run_main(
        capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out), "--max-steps", "2"
    )
    assert code == 0, err
    loss = read_metrics(out)["summary"]["final_loss"]
    assert isinstance(loss, float) and loss > 0 and "final loss -" not in stdout
    # 3 steps logged every 2: the last window (step 3) had no loss, and the final loss was
    # the window before it (steps 1-2); the last step's loss is logged now
    manifest = write_expert(tmp_path / "f", tiny_model_dir, config={"logging_steps": 2})
    out = tmp_path / "out3"
    code, stdout, err = run_main(
        capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out), "--max-steps", "3"
    )
    assert code == 0, err
    metrics = read_metrics(out)
    windows = [(w["step"], w["loss"]) for w in metrics["windows"]]
    assert [step for step, _ in windows] == [2, 3] and all(loss for _, loss in windows), windows
    assert metrics["summary"]["final_loss"] == windows[-1][1] != windows[0][1]


def test_a_flex_run_says_its_probe_read_sdpas_mask() -> None:
    """flex_attention is probed through sdpa (flex compiles for every new shape); the line
    said "checked" as if flex's own mask had been run."""
    from expert_cli.cli.train_view import _isolation

    assert _isolation("verified", True, "flex_attention") == (
        " (causal, packed examples apart: checked with sdpa's mask)"
    )
    assert _isolation("verified", False, "sdpa") == " (causal: checked)"
    assert _isolation("not probed: x", True, "flex_attention") == " (not probed: x)"
