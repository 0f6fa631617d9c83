"""training.png and `expert-cli report`: four panels drawn from metrics.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from train_helpers import png_facts, run_here, write_final_adapter

from expert_cli.atomic import atomic_file
from expert_cli.train.run_plot import PANELS

METRICS = {
    "windows": [
        {
            "step": s,
            "loss": 3.0 - 0.1 * s,
            "learning_rate": 1e-3,
            "tokens_per_s": 900.0 + s,
            "data_wait_fraction": 0.01,
            "seconds": 1.0,
        }
        for s in range(5, 55, 5)
    ],
    "evals": [
        {"step": 20, "eval_loss": 1.9},
        {"step": 40, "eval_loss": 1.2},
        {"step": 50, "eval_loss": 1.3},
    ],
    "summary": {"status": "completed", "steps": 50, "tokens_per_s": 925.0, "final_loss": 1.0},
}


def test_report_draws_four_panels_and_summarises(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    write_final_adapter(tmp_path)  # the final adapter's place
    out = run_here("report", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "completed: 50 steps, 925 tok/s, final loss 1, best eval loss 1.2 at step 40" in out.stdout
    )
    width, height, texts = png_facts(tmp_path / "training.png")
    assert (width, height) == (1100, 700)
    assert texts["Description"] == "panels: " + ", ".join(PANELS) and len(PANELS) == 4
    # the best evaluation's token accuracy beside its loss; a hand-edited share over 1 is not
    evals = [{**e, "token_accuracy": 0.1 * i} for i, e in enumerate(METRICS["evals"], 1)]
    (tmp_path / "metrics.json").write_text(json.dumps({**METRICS, "evals": evals}))
    out = run_here("report", str(tmp_path))
    assert "best eval loss 1.2 at step 40, token accuracy 20.0%" in out.stdout, out.stdout
    evals[1]["token_accuracy"] = 20.0
    (tmp_path / "metrics.json").write_text(json.dumps({**METRICS, "evals": evals}))
    out = run_here("report", str(tmp_path))
    assert "best eval loss 1.2 at step 40\n" in out.stdout and "accuracy" not in out.stdout


def test_a_steady_speed_is_drawn_below_the_panels_top_edge() -> None:
    """A steady 75k tokens/s drew its line on the panel's top edge (the axis ended at the
    highest value), where the frame hid it; the axis now ends a tenth above it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from expert_cli.train.run_plot import _from_zero

    fig, ax = plt.subplots()
    try:
        ax.plot([1, 2, 3], [75000.0, 75001.0, 75000.0])
        _from_zero(ax, [75000.0, 75001.0, 75000.0])
        assert ax.get_ylim() == pytest.approx((0.0, 82501.1))
        ax.clear()
        _from_zero(ax, [])  # nothing recorded: from 0, matplotlib's own top
        assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] > 0
    finally:
        plt.close(fig)


def test_report_of_a_folder_without_metrics_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "file").write_text("x")
    # a RUN_DIR that is missing, a file or a link loop was blamed on --output, or a traceback
    for run_dir in (tmp_path, tmp_path / "file", tmp_path / "loop"):
        out = run_here("report", str(run_dir))
        assert out.returncode == 2, out.stderr
        assert f"{run_dir}: no readable metrics.json (expected a train output folder)" in (
            " ".join(out.stderr.split())
        )
    out = run_here("report", str(tmp_path / "missing"))  # was "no readable metrics.json"
    assert out.returncode == 2 and f"{tmp_path / 'missing'}: not there" in out.stderr
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-4"  # as other commands say it
    checkpoint.mkdir(parents=True)
    (tmp_path / "run" / "manifest.resolved.json").write_text("{}")
    out = run_here("report", str(checkpoint))
    assert out.returncode == 2, out.stderr
    said = " ".join(out.stderr.split())
    assert f"{checkpoint}: a checkpoint of a run; give the run: {tmp_path / 'run'}" in said


def test_report_redraws_its_own_picture_but_asks_before_replacing_another_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    for _ in range(2):  # RUN_DIR/training.png is the run's own: redrawn without asking
        assert run_here("report", str(tmp_path)).returncode == 0
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my picture")
    out = run_here("report", str(tmp_path), "--output", str(mine))
    assert out.returncode == 2
    assert f"--output: {mine} already exists; add --force to replace it" in " ".join(
        out.stderr.split()
    )
    assert mine.read_bytes() == b"my picture"
    out = run_here("report", str(tmp_path), "--output", str(mine), "--force")
    assert out.returncode == 0, out.stderr
    assert png_facts(mine)[:2] == (1100, 700)
    # a folder where the run's picture goes was blamed on an --output never given
    (tmp_path / "training.png").unlink()
    (tmp_path / "training.png").mkdir()
    out = run_here("report", str(tmp_path))
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "--output" not in said
    assert f"the run's picture: {tmp_path / 'training.png'} is not a regular file" in said


def test_the_picture_is_written_in_the_format_its_name_says(tmp_path: Path) -> None:
    """--output metrics.json --force wrote a PNG over the run's own metrics (then read them
    back: the summary lost its eval loss); a name must say a picture's format now."""
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps(METRICS))
    for name in ("metrics.json", "adapter_model.safetensors", "plot.txt"):
        out = run_here("report", str(tmp_path), "--output", str(tmp_path / name), "--force")
        assert out.returncode == 2, out.stdout
        assert f"--output: {name} should end in .png, .svg or .pdf (the format written)" in (
            " ".join(out.stderr.split())
        )
    assert json.loads(metrics.read_text()) == METRICS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    for name, magic in (("a.svg", b"<?xml"), ("a.PDF", b"%PDF")):
        assert run_here("report", str(tmp_path), "--output", str(tmp_path / name)).returncode == 0
        assert (tmp_path / name).read_bytes().startswith(magic)


@pytest.mark.filterwarnings("error")  # nor a warning: a glyph the font lacks, an axis overflow
def test_a_damaged_or_hand_edited_metrics_file_is_reported_without_a_traceback(
    tmp_path: Path,
) -> None:
    """Non-finite numbers, numbers no run records (1e308), strings where numbers go and a
    status holding terminal escape sequences: what is not a plausible number is neither drawn
    nor summarised, and the escapes are shown, not sent to the terminal."""
    windows = [
        {"step": 1, "loss": 2.0, "tokens_per_s": 10.0},
        {"step": 2, "loss": float("nan"), "tokens_per_s": float("inf")},
        {"step": "3", "loss": "high", "learning_rate": [1]},
        {"step": 4, "loss": 1e308, "data_wait_fraction": -1e308},
        "not a record",
    ]
    metrics = {
        "windows": windows,
        "evals": [{"step": 2, "eval_loss": float("nan")}, {"step": 4, "eval_loss": 1.5}, None],
        "summary": {
            "status": "completed\x1b[2J\x1b]0;pwned\x07",
            "steps": "many",
            "tokens_per_s": float("inf"),
            "final_loss": float("nan"),
        },
    }
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    out = run_here("report", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    expected = "completed\\x1b[2J\\x1b]0;pwned\\x07: 0 steps, - tok/s, final loss -, "
    assert expected + "best eval loss 1.5 at step 4" in out.stdout
    assert png_facts(tmp_path / "training.png")[:2] == (1100, 700)
    huge = {"steps": 1e300, "tokens_per_s": 1e308, "final_loss": -1e308, "status": "failed"}
    (tmp_path / "metrics.json").write_text(json.dumps({**metrics, "summary": huge}))
    out = run_here("report", str(tmp_path))  # a 309-digit tok/s was printed
    assert out.returncode == 0 and "failed: 0 steps, - tok/s, final loss -," in out.stdout
    below = {**huge, "tokens_per_s": -5}  # was printed as -5 tok/s
    (tmp_path / "metrics.json").write_text(json.dumps({**metrics, "summary": below}))
    out = run_here("report", str(tmp_path))
    assert out.returncode == 0 and "failed: 0 steps, - tok/s," in out.stdout


def test_control_characters_are_shown_as_escapes() -> None:
    from expert_cli.cli.render import visible

    assert visible("a\x1b[31mb\x9b\u202ec\td\ne") == "a\\x1b[31mb\\x9b\\u202ec\td\ne"
    assert visible("plain naïve 日本") == "plain naïve 日本"


def test_names_that_look_like_markup_are_shown_as_they_are(capsys) -> None:
    """A path or member name holding `[/x]` (rich's closing tag) was a MarkupError traceback
    wherever it was put in a note, a table cell or a title; `[red]` coloured the rest."""
    from rich.table import Table

    from expert_cli.cli.render import console, labelled, plain

    out = console()
    out.print(labelled("note", "yellow", "/data/[/x]/[red]a.jsonl C:\\dir\\", 6))
    out.print("unquoted [/x] still prints")
    table = Table("file", title=plain("[/x]"))
    table.add_row(plain("[red]b\x1bc"))
    out.print(table)
    text = capsys.readouterr().out
    assert "note  /data/[/x]/[red]a.jsonl C:\\dir\\\n" in text  # one backslash, as written
    assert "unquoted [/x] still prints" in text
    assert "[red]b\\x1bc" in text and "[/x]" in text.splitlines()[2]


def test_one_item_stays_one_line(capsys) -> None:
    """An error naming a file whose name holds a line break cannot print a forged second
    line; tabs and text stay as they are."""
    from expert_cli.cli.render import one_line, print_error
    from expert_cli.errors import UserError

    assert one_line("a\nb\r\x1bc\td") == "a\\nb\\r\\x1bc\td"
    print_error("error", UserError(["data/x\nmanifest is usable: not found"]))
    assert capsys.readouterr().err.splitlines() == [
        "error:",
        "  data/x\\nmanifest is usable: not found",
    ]


def _fake_run(
    run: Path,
    checkpoints: list[int],
    evals: list[tuple[int, float]],
    final_step: int | None = None,
    packaging_checkpoint: str | None = None,
) -> Path:
    """A run folder as `report` and `package` read it: complete checkpoints, a final adapter
    (when `final_step` is given), the eval losses, and the manifest file it was trained from."""
    for step in checkpoints:
        (run / "checkpoints" / f"checkpoint-{step}").mkdir(parents=True)
        (run / "checkpoints" / f"checkpoint-{step}" / "_COMPLETE").write_text("")
    (run / "checkpoints" / "checkpoint-999").mkdir(parents=True)  # killed while written
    manifest = {"name": "expert-x", "training": {}}
    if packaging_checkpoint:
        manifest["training"]["packaging_checkpoint"] = packaging_checkpoint
    (run.parent / "manifest.json").write_text(json.dumps(manifest))
    (run / "manifest.source.json").write_text(json.dumps(manifest))
    resolved = {"manifest_path": str(run.parent / "manifest.json"), "runtime": {}}
    if final_step is not None:
        write_final_adapter(run)
        resolved["runtime"]["final_step"] = final_step
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    metrics = {
        "windows": [],
        "evals": [{"step": s, "eval_loss": v} for s, v in evals],
        "summary": {"status": "completed", "steps": max(checkpoints + [final_step or 0])},
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def test_the_adapters_a_run_keeps_with_their_eval_losses(tmp_path: Path) -> None:
    from expert_cli.train.choice import KeptAdapter, eval_losses, kept_adapters, lowest

    run = _fake_run(tmp_path / "run", [20, 40, 60], [(20, 1.5), (40, 1.2), (60, 1.3)], 60)
    assert kept_adapters(run) == [
        KeptAdapter("checkpoint-20", 20, 1.5),
        KeptAdapter("checkpoint-40", 40, 1.2),
        KeptAdapter("checkpoint-60", 60, 1.3),
        KeptAdapter("final", 60, 1.3),
    ]
    assert lowest(kept_adapters(run)) == KeptAdapter("checkpoint-40", 40, 1.2)
    # a tie goes to the final adapter, then to the later checkpoint
    assert lowest([KeptAdapter("checkpoint-60", 60, 1.3), KeptAdapter("final", 60, 1.3)]).name == (
        "final"
    )
    assert lowest([KeptAdapter("checkpoint-1", 1, 2.0), KeptAdapter("checkpoint-3", 3, 2.0)]) == (
        KeptAdapter("checkpoint-3", 3, 2.0)
    )
    assert lowest([KeptAdapter("final", None, None)]) is None
    # a resumed run evaluates a step again: the last record wins; implausible ones are left out
    records = [
        {"step": 10, "eval_loss": 2.0},
        {"step": 10, "eval_loss": 1.8},
        {"step": 20, "eval_loss": float("nan")},
        {"step": 2.5, "eval_loss": 1.0},
        {"step": -1, "eval_loss": 1.0},
        {"step": True, "eval_loss": 1.0},
        {"step": 30, "eval_loss": "low"},
        "not a record",
    ]
    assert eval_losses({"evals": records}) == {10: 1.8}
    assert eval_losses({"evals": "damaged"}) == {}


def test_the_final_adapters_step_of_a_run_that_did_not_record_it(tmp_path: Path) -> None:
    """A run of an earlier version has no runtime.final_step: a completed run's last step,
    unless it loaded its best checkpoint at the end (then it is not known)."""
    from expert_cli.train.choice import final_step

    run = _fake_run(tmp_path / "run", [5], [(5, 1.0)], 5)
    assert final_step(run) == 5
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved["runtime"] = {}
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    assert final_step(run) == 5  # summary.steps of the completed run
    resolved["load_best_model_at_end"] = True
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    assert final_step(run) is None


def test_report_lists_the_adapters_and_says_how_to_ship_the_lowest(tmp_path: Path) -> None:
    run = _fake_run(
        tmp_path / "run", [20, 40, 60], [(10, 0.9), (20, 1.5), (40, 1.2), (60, 1.3)], 60
    )
    out = run_here("report", str(run))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [" ".join(line.split()) for line in out.stdout.splitlines()]
    assert lines[1:5] == [
        "adapters checkpoint-20 step 20 eval loss 1.5",
        "checkpoint-40 step 40 eval loss 1.2 lowest",
        "checkpoint-60 step 60 eval loss 1.3",
        "final step 60 eval loss 1.3 package ships it",
    ]
    assert lines[5] == (
        "note checkpoint-40 has a lower eval loss (1.2 at step 40) than final (1.3): "
        f"expert-cli package --adapter {run} --checkpoint best ships it"
    )
    assert lines[6] == (
        "note the lowest eval loss, 0.9 at step 10, has no checkpoint: save_steps equal to "
        "eval_steps keeps one at each evaluation"
    )
    # removed by save_total_limit (save_steps 10 saved it), or stopped while saved: said so
    # (it advised save_steps equal to eval_steps where they were equal)
    record = json.loads((run / "manifest.resolved.json").read_text())
    record |= {"save_steps": 10, "save_total_limit": 3}
    (run / "manifest.resolved.json").write_text(json.dumps(record))
    out = run_here("report", str(run))
    assert "has no checkpoint: save_total_limit 3 removed it since" in " ".join(out.stdout.split())
    (run / "checkpoints" / "checkpoint-10").mkdir()  # its files, no _COMPLETE
    out = run_here("report", str(run))
    said = " ".join(out.stdout.split())
    assert "has no checkpoint: the run was stopped while saving it (it is not whole)" in said


def test_report_follows_the_manifests_packaging_checkpoint_and_bounds_its_list(
    tmp_path: Path,
) -> None:
    steps = list(range(10, 210, 10))  # 20 checkpoints, evaluated at each
    evals = [(s, 2.0 - s / 1000) for s in steps]
    evals[2] = (30, 0.5)
    run = _fake_run(tmp_path / "run", steps, evals, 200, packaging_checkpoint="checkpoint-190")
    out = run_here("report", str(run))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [" ".join(line.split()) for line in out.stdout.splitlines()]
    # the lowest, then the last 8 adapters (the final one among them), then how many are not
    assert lines[1] == "adapters checkpoint-30 step 30 eval loss 0.5 lowest"
    assert [line.split()[0] for line in lines[2:9]] == [f"checkpoint-{s}" for s in steps[-7:]]
    assert lines[7].endswith(
        f"package ships it (training.packaging_checkpoint in {tmp_path / 'manifest.json'})"
    )
    assert lines[9] == "final step 200 eval loss 1.8"
    assert lines[10] == "and 12 more checkpoints"
    assert "checkpoint-30 has a lower eval loss (0.5 at step 30) than checkpoint-190" in lines[11]
    # a checkpoint the manifest names and the run does not keep is said before package fails
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["training"]["packaging_checkpoint"] = "checkpoint-1250"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    said = " ".join(run_here("report", str(run)).stdout.split())
    assert "package ships checkpoint-1250 (training.packaging_checkpoint in" in said
    assert "which the run does not keep: name one it keeps, or final" in said
    # a run that stopped before its end (diverged) wrote no final adapter
    run = _fake_run(tmp_path / "stopped" / "run", [10, 20], [(10, 1.0), (20, 0.9)])
    said = " ".join(run_here("report", str(run)).stdout.split())
    assert "checkpoint-20 step 20 eval loss 0.9 lowest" in said and "final step" not in said
    assert (
        "package ships the final adapter, which the run did not write (it stopped before its "
        "end): --checkpoint NAME ships one it keeps" in said
    )


def test_report_says_when_it_cannot_tell_which_adapter_package_ships(tmp_path: Path) -> None:
    """The manifest file that names the adapter to ship cannot be read: report lists the
    adapters, says package cannot tell, and marks none as shipped."""
    from expert_cli.train.report import AdapterRow, adapter_list

    run = _fake_run(tmp_path / "run", [20], [(20, 1.5)], 40)
    (tmp_path / "manifest.json").write_text("{ not json")
    listing = adapter_list(run, (1.5, 20))
    assert listing.rows == (
        AdapterRow("checkpoint-20", 20, 1.5, ("lowest",)),
        AdapterRow("final", 40, None, ()),
    )
    assert listing.hidden == 0 and len(listing.notes) == 1
    label, text = listing.notes[0]
    assert label == "package" and text.startswith("cannot tell which adapter it ships: ")
    assert text.endswith("; fix it, or pass --checkpoint NAME")
    said = [" ".join(line.split()) for line in run_here("report", str(run)).stdout.splitlines()]
    assert said[3].startswith("package cannot tell which adapter it ships:")


@pytest.mark.slow
def test_load_best_model_at_end_records_the_step_its_final_adapter_holds(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """With load_best_model_at_end the final adapter is the best checkpoint's weights: the run
    records that checkpoint's step (here the last, as the loss falls), and `report` shows it."""
    from train_helpers import write_expert

    manifest = write_expert(
        tmp_path / "e",
        tiny_model_dir,
        valid_rows=8,
        config={
            "evaluation_strategy": "steps",
            "eval_steps": 2,
            "save_steps": 2,
            "load_best_model_at_end": True,
        },
    )
    out = tmp_path / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "6")
    assert done.returncode == 0, done.stdout + done.stderr
    state = json.loads((out / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    best = state["best_global_step"]
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    assert resolved["runtime"]["final_step"] == best
    final = (out / "adapter_model.safetensors").read_bytes()
    chosen = out / "checkpoints" / f"checkpoint-{best}" / "adapter_model.safetensors"
    assert final == chosen.read_bytes()
    said = [" ".join(line.split()) for line in run_here("report", str(out)).stdout.splitlines()]
    assert any(line.startswith(f"final step {best} eval loss") for line in said), said


def test_the_final_adapters_step_is_the_best_checkpoints_when_it_was_loaded_at_the_end() -> None:
    """The eval loss shown beside the final adapter is the one measured at the step of its
    weights: with load_best_model_at_end, the best checkpoint's step, not the last."""
    from transformers import TrainerState

    from expert_cli.train.choice import final_adapter_step

    state = TrainerState(global_step=6, best_global_step=2)
    state.best_model_checkpoint = "/runs/a/checkpoints/checkpoint-2"
    assert final_adapter_step(True, state) == 2
    assert final_adapter_step(False, state) == 6
    assert final_adapter_step(True, TrainerState(global_step=6)) == 6  # evaluated nothing
    # evaluations every 2 steps, checkpoints every 4: the best evaluation (step 6) was not
    # saved, and the Trainer loads the best checkpoint that was (step 4)
    state = TrainerState(global_step=8, best_global_step=6)
    state.best_model_checkpoint = "/runs/a/checkpoints/checkpoint-4"
    assert final_adapter_step(True, state) == 4


def test_a_moved_run_resumed_after_its_last_step_finds_its_best_checkpoint(
    tmp_path: Path,
) -> None:
    """The state names the best checkpoint by the path the run had: moved before --resume,
    that folder was gone, the last checkpoint was shipped, and its step recorded as the best's
    (report said "eval loss 8.003 lowest; package ships it" of weights measured at 8.013)."""
    from transformers import TrainerState

    from expert_cli.train.checkpoints import best_checkpoint
    from expert_cli.train.choice import final_adapter_step

    checkpoints = tmp_path / "moved" / "checkpoints"
    (checkpoints / "checkpoint-20").mkdir(parents=True)
    (checkpoints / "checkpoint-40").mkdir()
    state = TrainerState(global_step=40, best_global_step=20)
    state.best_model_checkpoint = "/gone/run/checkpoints/checkpoint-20"
    assert best_checkpoint(state, checkpoints / "checkpoint-40") == checkpoints / "checkpoint-20"
    assert state.best_model_checkpoint == str(checkpoints / "checkpoint-20")
    assert final_adapter_step(True, state) == 20
    # the best one pruned since (a save_total_limit): the step recorded is the one saved
    (checkpoints / "checkpoint-20").rmdir()
    state.best_model_checkpoint = "/gone/run/checkpoints/checkpoint-20"
    assert best_checkpoint(state, checkpoints / "checkpoint-40") is None
    assert final_adapter_step(True, state) == 40


def test_a_moved_run_resumed_mid_training_keeps_its_best_checkpoint(tmp_path: Path) -> None:
    """Resumed mid-training, the Trainer forgets a best checkpoint it cannot find at its old
    path: it shipped the last weights and could rotate the best away."""
    from types import SimpleNamespace

    from transformers import TrainerState

    from expert_cli.train.checkpoints import CheckpointMarker

    checkpoints = tmp_path / "moved" / "checkpoints"
    (checkpoints / "checkpoint-2").mkdir(parents=True)
    (checkpoints / "checkpoint-4").mkdir()
    saved = TrainerState(global_step=4, best_global_step=2)
    saved.best_model_checkpoint = "/gone/run/checkpoints/checkpoint-2"
    saved.save_to_json(str(checkpoints / "checkpoint-4" / "trainer_state.json"))
    state = TrainerState(global_step=4, best_global_step=2)  # as the Trainer left it
    args = SimpleNamespace(
        load_best_model_at_end=True, output_dir=str(checkpoints), save_total_limit=None
    )
    CheckpointMarker().on_train_begin(args, state, None)
    assert state.best_model_checkpoint == str(checkpoints / "checkpoint-2")
    args.load_best_model_at_end = False  # nothing to find, nothing changed
    state.best_model_checkpoint = None
    CheckpointMarker().on_train_begin(args, state, None)
    assert state.best_model_checkpoint is None


def test_train_ends_by_naming_a_checkpoint_evaluated_lower_than_its_final_adapter(
    tmp_path: Path,
) -> None:
    """A run that overfits ends worse than it was: its last lines say which checkpoint was
    lower and how to ship it (else the final adapter is shipped without a word)."""
    import io

    from rich.console import Console

    from expert_cli.cli.train_view import print_end
    from expert_cli.train.session import TrainOptions, TrainResult

    run = _fake_run(tmp_path / "run", [20, 40], [(20, 1.1), (40, 1.4)], 40)
    summary = {
        "steps": 40,
        "final_loss": 0.2,
        "train_runtime_s": 10.0,
        "tokens_per_s": 1000.0,
        "data_wait_fraction": 0.01,
    }

    def said(status: str) -> str:
        console = Console(file=io.StringIO(), width=400)
        print_end(console, TrainResult(run, status, 0, summary), TrainOptions(Path("m.json")))
        return console.file.getvalue()

    assert (
        "note      checkpoint-20 has a lower eval loss (1.1 at step 20) than final (1.4): "
        f"expert-cli package --adapter {run} --checkpoint best ships it" in said("completed")
    )
    assert "lower eval loss" not in said("interrupted")  # no final adapter of its own yet
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["evals"] = [{"step": 20, "eval_loss": 1.4}, {"step": 40, "eval_loss": 1.1}]
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert "note" not in said("completed")


def test_a_run_on_a_read_only_disk_is_still_summarised(tmp_path: Path) -> None:
    """The run's own folder on a read-only mount: the summary, then a line saying the picture
    was not written (it was two chained tracebacks: the temporary file's clean-up raised
    EROFS). An --output there is exit 2 before anything is drawn."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (needs root on Linux)")
    try:
        run = mount / "run"
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps(METRICS))
        write_final_adapter(run)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        out = run_here("report", str(run))
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("completed: 50 steps, 925 tok/s, final loss 1")
        assert f"picture {run / 'training.png'} not written (Read-only file system)" in (
            " ".join(out.stdout.split())
        )
        other = run_here("report", str(tmp_path / "ro" / "run"), "--output", str(mount / "x.png"))
        assert other.returncode == 2, other.stdout + other.stderr
        assert f"--output {mount / 'x.png'}: {mount} cannot be written to" in " ".join(
            other.stderr.split()
        )
        assert "Traceback" not in out.stderr + other.stderr
        assert sorted(p.name for p in run.iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
            "metrics.json",
        ]
        with pytest.raises(OSError) as caught, atomic_file(run / "x.json") as tmp:
            tmp.write_text("x")
        assert caught.value.__context__ is None  # the write's error, not the clean-up's on it
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def test_a_run_whose_process_is_gone_reads_as_stopped(tmp_path: Path) -> None:
    """A run killed with SIGKILL leaves metrics.json saying running: report said `running:`
    of a run nobody trains. While a train holds the folder it is running."""
    from filelock import FileLock

    (tmp_path / "metrics.json").write_text(
        json.dumps({**METRICS, "summary": {**METRICS["summary"], "status": "running"}})
    )
    (tmp_path / ".train.lock").write_text("")  # left by the killed run, held by nobody
    out = run_here("report", str(tmp_path))
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert text.startswith("stopped: 50 steps")
    assert "status its metrics say running, but no train on this machine holds the folder" in text
    # killed before its first checkpoint: --resume would find none (it was said to go on)
    assert "it wrote no checkpoint to go on from: train again with --overwrite" in text
    (tmp_path / "checkpoints" / "checkpoint-40").mkdir(parents=True)
    (tmp_path / "checkpoints" / "checkpoint-40" / "_COMPLETE").write_text("")
    text = " ".join(run_here("report", str(tmp_path)).stdout.split())
    assert "--resume continues it from its last checkpoint" in text
    with FileLock(str(tmp_path / ".train.lock")):  # a live train
        out = run_here("report", str(tmp_path))
    assert out.stdout.startswith("running: 50 steps") and "no train on" not in out.stdout


def test_a_completed_run_without_its_final_adapter_reads_as_stopped(tmp_path: Path) -> None:
    """Killed after its last step and before the final save, a run's metrics say completed:
    report said "completed" beside "ships the final adapter, which the run did not write".
    It is stopped, and says how to save the adapter (--resume where a checkpoint is kept,
    else train again); while a train holds the folder it is saving."""
    from filelock import FileLock

    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    (tmp_path / ".train.lock").write_text("")
    text = " ".join(run_here("report", str(tmp_path)).stdout.split())
    assert text.startswith("stopped: 50 steps, 925 tok/s")
    assert "its metrics say completed, but the folder holds no final adapter" in text
    assert "it keeps no checkpoint to save it from: train again" in text
    kept = tmp_path / "checkpoints" / "checkpoint-50"
    kept.mkdir(parents=True)
    (kept / "adapter_model.safetensors").write_bytes(b"weights")
    (kept / "_COMPLETE").write_text("")
    out = run_here("report", str(tmp_path))
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert text.startswith("stopped: 50 steps") and "completed:" not in text
    assert "train with the same --output and --resume saves it" in text
    with FileLock(str(tmp_path / ".train.lock")):  # the final save going on
        text = " ".join(run_here("report", str(tmp_path)).stdout.split())
    assert text.startswith("saving: 50 steps") and "is saving the final adapter" in text
    write_final_adapter(tmp_path)
    text = " ".join(run_here("report", str(tmp_path)).stdout.split())
    assert text.startswith("completed: 50 steps") and "status" not in text.split("adapters")[0]


def test_a_path_with_control_characters_is_shown_escaped(tmp_path: Path) -> None:
    """A newline or an escape in a folder's name was printed raw: `wrote` split over two
    lines, and an escape sequence reached the terminal."""
    run = tmp_path / "a\nb\x1b[31m"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps(METRICS))
    out = run_here("report", str(run))
    assert out.returncode == 0, out.stderr
    assert f"wrote {tmp_path}/a\\nb\\x1b[31m/training.png\n" in out.stdout
    assert "\x1b" not in out.stdout


def test_two_losses_are_shown_apart() -> None:
    """The note said "checkpoint-10 has a lower eval loss (8.074 at step 10) than final
    (8.074)": 8.07408 and 8.07447 at four digits."""
    from expert_cli.train.choice import apart

    assert apart(8.07408, 8.07447) == ("8.0741", "8.0745")
    assert apart(1.2, 1.3) == ("1.2", "1.3")
    assert apart(2.0, 2.0 + 1e-12) == ("2", "2")  # no closer than 8 digits: as they are


def test_no_lower_loss_note_where_the_losses_agree_to_eight_digits(tmp_path: Path) -> None:
    """A checkpoint 1e-12 below the final adapter was said to have "a lower eval loss (2 at
    step 10) than final (2)"."""
    from expert_cli.train.choice import lower_loss_note

    run = _fake_run(tmp_path / "run", [10], [(10, 2.0), (20, 2.0 + 1e-12)], 20)
    assert lower_loss_note(run, "final") is None
    run = _fake_run(tmp_path / "run2", [10], [(10, 2.0), (20, 2.0 + 1e-6)], 20)
    assert lower_loss_note(run, "final") == (
        "checkpoint-10 has a lower eval loss (2 at step 10) than final (2.000001): "
        "--checkpoint best ships it"
    )
