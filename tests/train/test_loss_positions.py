"""A run whose fused loss runs the LM head on the trained tokens alone (the collator's loss
positions) trains exactly as one that runs it on every token, and its head sees fewer rows.
Over two processes: tests/cli/test_distributed.py's two-node run."""

from __future__ import annotations

from pathlib import Path

import pytest

from expert_cli.train import loss as fused
from expert_cli.train.run import Silent, TrainOptions, train


def test_the_head_on_trained_tokens_alone_trains_as_on_every_token(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from train_helpers import prompt_heavy_expert, window_losses

    manifest = prompt_heavy_expert(tmp_path / "e", tiny_model_dir)
    real = fused.summed_linear_cross_entropy
    head_rows: dict[bool, list[int]] = {True: [], False: []}
    losses = {}
    for only in (True, False):
        monkeypatch.setattr(fused, "TRAINED_ROWS_ONLY", only)
        monkeypatch.setattr(
            fused,
            "summed_linear_cross_entropy",
            lambda b, h, w, t, hits=None, smoothing=0.0, only=only: (
                head_rows[only].append(h.shape[0]) or real(b, h, w, t, hits, smoothing)
            ),
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
