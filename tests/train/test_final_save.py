"""A signal as a run ends (its steps trained, its adapter being saved). It used to stop the
run at once with no word, the final adapter unsaved and metrics.json saying `completed`. The
first signal is now held until the adapter is saved; a second one stops at once, saying how
to continue, with metrics.json saying `interrupted`."""

from __future__ import annotations

import signal
from pathlib import Path

import transformers
from train_helpers import read_metrics, run_main, write_expert

ARGS = ("--max-steps", "2")


def _signals_in_save(monkeypatch, count: int) -> list[int]:
    """The Trainer's save of the final adapter hears `count` SIGINTs as it starts."""
    saved = transformers.Trainer.save_model
    calls: list[int] = []

    def save_model(self, output_dir=None, *args, **kwargs):
        if ".final-" in str(output_dir):  # not a checkpoint's save within training
            calls.append(1)
            for _ in range(count):
                signal.raise_signal(signal.SIGINT)
        return saved(self, output_dir, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "save_model", save_model)
    return calls


def test_a_signal_as_the_adapter_is_saved_waits_for_it(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    out = tmp_path / "o"
    calls = _signals_in_save(monkeypatch, 1)
    code, stdout, err = run_main(
        capsys, monkeypatch, "train", "--manifest", str(manifest), "--output", str(out), *ARGS
    )
    assert calls and code == 0, stdout + err
    said = " ".join((stdout + err).split())
    assert "SIGINT: the run has trained its steps and stops once its final adapter is saved" in said
    assert (out / "adapter_model.safetensors").is_file()
    assert read_metrics(out)["summary"]["status"] == "completed"


def test_a_second_signal_as_it_is_saved_stops_and_says_how_to_continue(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    out = tmp_path / "o"
    train = ("train", "--manifest", str(manifest), "--output", str(out), *ARGS)
    _signals_in_save(monkeypatch, 2)
    code, stdout, err = run_main(capsys, monkeypatch, *train)
    assert code == 130, stdout + err
    said = " ".join((stdout + err).split())
    assert "interrupted: stopped at once as the run ended: its final adapter is not saved" in said
    assert "--resume to continue from its latest checkpoint" in said
    assert "Traceback" not in said
    assert not (out / "adapter_model.safetensors").exists()
    assert read_metrics(out)["summary"]["status"] == "interrupted"
    monkeypatch.undo()
    code, stdout, err = run_main(capsys, monkeypatch, *train, "--resume")
    assert code == 0, stdout + err
    assert (out / "adapter_model.safetensors").is_file()
    assert read_metrics(out)["summary"]["status"] == "completed"
