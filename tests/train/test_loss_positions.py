"""A run whose fused loss runs the LM head on the trained tokens alone (the collator's loss
positions) trains exactly as one that runs it on every token, and its head sees fewer rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from expert_cli.train import loss as fused
from expert_cli.train.run import Silent, TrainOptions, train


def _prompt_heavy_expert(folder: Path, model_dir: Path) -> Path:
    """The test expert on instruction data: a long prompt, a short answer."""
    from conftest import write_jsonl
    from train_helpers import write_expert

    manifest = write_expert(
        folder, model_dir, rows=8, config={"fused_loss": "chunked", "batch_size": 2}
    )
    rows = [
        {"q": " ".join(f"word{(i * 7 + j) % 50}" for j in range(40)), "a": f"answer {i} ok"}
        for i in range(16)
    ]
    write_jsonl(folder / "data" / "train.jsonl", rows)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["field_mapping"] = {"instruction": "q", "response": "a"}
    manifest.write_text(json.dumps(data))
    return manifest


def test_the_head_on_trained_tokens_alone_trains_as_on_every_token(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from train_helpers import window_losses

    manifest = _prompt_heavy_expert(tmp_path / "e", tiny_model_dir)
    real = fused.summed_linear_cross_entropy
    head_rows: dict[bool, list[int]] = {True: [], False: []}
    losses = {}
    for only in (True, False):
        monkeypatch.setattr(fused, "TRAINED_ROWS_ONLY", only)
        monkeypatch.setattr(
            fused,
            "summed_linear_cross_entropy",
            lambda b, h, w, t, only=only: head_rows[only].append(h.shape[0]) or real(b, h, w, t),
        )
        out = tmp_path / f"run-{only}"
        result = train(TrainOptions(manifest=manifest, output=out, max_steps=4), Silent())
        assert result.status == "completed"
        losses[only] = window_losses(out)
    assert list(losses[True]) == [1, 2, 3, 4]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    assert len(head_rows[True]) == len(head_rows[False]) == 4
    # each batch's head ran on its answers' tokens: under a fifth of its rows' tokens
    for few, every in zip(head_rows[True], head_rows[False], strict=True):
        assert 0 < few < every / 5


def test_the_step_line_says_where_the_head_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from expert_cli.cli.train_view import _loss_name

    assert _loss_name("liger") == (
        "fused linear cross-entropy (liger, the LM head on trained tokens only)"
    )
    monkeypatch.setattr(fused, "TRAINED_ROWS_ONLY", False)
    assert _loss_name("chunked") == "fused linear cross-entropy (chunked)"
    assert _loss_name("off") == "standard (full logits)"


@pytest.mark.slow
def test_two_processes_with_loss_positions_match_one(tmp_path: Path, tiny_model_dir: Path) -> None:
    """DDP over 2 CPU processes (2 rows each) against one process of 4 rows: each rank's
    batches carry their own positions through DDP and accelerate's loader, same losses."""
    from train_helpers import launch, run_here, window_losses

    one = _prompt_heavy_expert(tmp_path / "one", tiny_model_dir)
    data = json.loads(one.read_text())
    data["training"]["config"]["batch_size"] = 4
    one.write_text(json.dumps(data))
    two = _prompt_heavy_expert(tmp_path / "two", tiny_model_dir)
    steps = ["--max-steps", "3"]
    single = run_here("train", "--manifest", str(one), "--output", str(tmp_path / "a"), *steps)
    assert single.returncode == 0, single.stdout + single.stderr
    assert "the LM head on trained tokens only" in single.stdout
    torchrun = ["torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    both = launch(
        torchrun, "train", "--manifest", str(two), "--output", str(tmp_path / "b"), *steps
    )
    assert both.returncode == 0, both.stdout + both.stderr
    expected, got = window_losses(tmp_path / "a"), window_losses(tmp_path / "b")
    assert sorted(got) == [1, 2, 3]
    assert got == pytest.approx(expected, rel=1e-5)
