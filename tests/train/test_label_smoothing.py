"""label_smoothing_factor: the training loss is smoothed, an evaluation's is not, and a
resume keeps the factor the run began with."""

from __future__ import annotations

import json
from pathlib import Path

from train_helpers import read_metrics, run_main, window_losses, write_expert


def test_a_smoothed_run_trains_on_the_fused_loss_and_evaluates_unsmoothed(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Two runs on the same data and seed, one smoothing its labels (a CPU: the chunked
    fused loss is chosen for it): the evaluation before the first step is the same loss in
    both (the base's, unsmoothed), the first step's training loss is not; a resume with
    another factor is refused, naming it."""
    config = {"eval_on_start": True, "evaluation_strategy": "steps", "eval_steps": 2}
    config |= {"logging_steps": 1, "save_steps": 2}
    runs = {}
    for factor in (0.0, 0.3):
        manifest = write_expert(
            tmp_path / f"e{factor}",
            tiny_model_dir,
            rows=24,
            valid_rows=6,
            config={**config, "label_smoothing_factor": factor},
        )
        out = tmp_path / f"run{factor}"
        code, said, err = run_main(capsys, monkeypatch, *_train(manifest, out, "2"))
        assert code == 0, said + err
        assert ("label smoothing 0.3" in said) == bool(factor), said  # the schedule line
        runs[factor] = (manifest, out)
    plain, smoothed = runs[0.0][1], runs[0.3][1]
    resolved = json.loads((smoothed / "manifest.resolved.json").read_text())
    assert (resolved["label_smoothing_factor"], resolved["fused_loss"]) == (0.3, "chunked")
    first = {name: read_metrics(out)["evals"][0] for name, out in (("p", plain), ("s", smoothed))}
    assert first["p"]["step"] == first["s"]["step"] == 0
    assert abs(first["p"]["eval_loss"] - first["s"]["eval_loss"]) < 1e-5
    assert abs(window_losses(plain)[1] - window_losses(smoothed)[1]) > 1e-3

    manifest = runs[0.3][0]
    smoothing = ("--resume", "--set", "training.config.label_smoothing_factor=0.1")
    code, said, err = run_main(capsys, monkeypatch, *_train(manifest, smoothed, "4"), *smoothing)
    assert code == 2, said + err
    assert "label_smoothing_factor 0.3 -> 0.1" in " ".join((said + err).split())


def _train(manifest: Path, out: Path, steps: str) -> tuple[str, ...]:
    return ("train", "-m", str(manifest), "--output", str(out), "--max-steps", steps)
