"""Ctrl-C saves a checkpoint and exits 130; --resume continues with the same loss curve."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import (
    ROOT,
    cli_env,
    read_metrics,
    run_main,
    signal_at_step,
    window_losses,
    write_expert,
)

STEPS = 24  # long enough for Ctrl-C after step 3 to land mid-run


def _train(manifest: Path, out: Path) -> tuple[str, ...]:
    return ("train", "--manifest", str(manifest), "--output", str(out))


def _interrupt_after(
    manifest: Path, out: Path, step: int, steps: int | None = STEPS
) -> subprocess.CompletedProcess:
    length = ("--max-steps", str(steps)) if steps else ()  # None: the manifest's epochs
    proc = subprocess.Popen(
        [sys.executable, "-m", "expert_cli.cli", *_train(manifest, out), *length],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=ROOT,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if read_metrics(out)["windows"][-1]["step"] >= step:
                break
        except (FileNotFoundError, json.JSONDecodeError, IndexError):
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.slow
def test_resume_matches_uninterrupted(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=48)
    # the uninterrupted run and the resumed one in this process; Ctrl-C needs its own process
    code, _, err = run_main(
        capsys, monkeypatch, *_train(manifest, tmp_path / "a"), "--max-steps", str(STEPS)
    )
    assert code == 0, err

    out = tmp_path / "b"
    first = _interrupt_after(manifest, out, step=3)
    assert first.returncode == 130, first.stdout + first.stderr
    assert "--resume" in first.stdout
    assert "SIGINT: stopping at the end of this optimizer step" in " ".join(first.stdout.split())
    assert read_metrics(out)["summary"]["status"] == "interrupted"
    stopped = read_metrics(out)["summary"]["steps"]
    assert 3 <= stopped < STEPS and (out / "checkpoints" / f"checkpoint-{stopped}").is_dir()
    before = window_losses(out)

    # the printed command, as a user copies it: no --max-steps, which the run keeps (it
    # resumed as a run of the manifest's epochs, its learning rate jumping back up)
    command = first.stdout.split("continue with:\n", 1)[1].splitlines()[0].split()
    assert command[:2] == ["expert-cli", "train"] and command[-1] == "--resume"
    code, second, err = run_main(capsys, monkeypatch, *command[1:])
    assert code == 0, second + err
    assert f"--resume: {STEPS} steps, the length the run was last given" in " ".join(second.split())
    after = window_losses(out)  # the resumed run keeps the windows up to its checkpoint
    assert {k: v for k, v in after.items() if k <= stopped} == before
    assert max(after) == STEPS and set(after) > set(before)
    expected = window_losses(tmp_path / "a")
    for step, loss in {**before, **after}.items():
        assert loss == pytest.approx(expected[step], rel=1e-4, abs=1e-5), step

    # resuming a finished run to train on: its final adapter (of step STEPS) stays in the
    # folder until the new one is saved, and the record of its step stays with it
    from expert_cli.train.run import setup
    from expert_cli.train.session import Silent, TrainOptions

    more = TrainOptions(manifest, tmp_path / "a", resume=True, max_steps=STEPS + 4)
    run, resume = setup(more, Silent())
    try:
        assert resume is not None and run.runtime["final_step"] == STEPS
        assert run.runtime["max_steps"] == STEPS + 4 and run.args.max_steps == STEPS + 4
    finally:
        run.release()


@pytest.mark.slow
def test_an_interrupt_keeps_its_checkpoint_under_a_limit_of_one(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """save_total_limit 1 with evaluations: the Trainer's end of training deleted every
    checkpoint but the best, the one Ctrl-C had just saved included, so --resume went back
    to the best evaluation's step and the steps since were lost."""
    config = {"evaluation_strategy": "steps", "eval_steps": 2, "save_steps": 2}
    config |= {"save_total_limit": 1, "learning_rate": 0.3}  # the loss soon stops falling
    config |= {"logging_steps": 5}
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=48, valid_rows=4, config=config)
    out = tmp_path / "b"
    signal_at_step(monkeypatch, 7)
    code, said, err = run_main(
        capsys, monkeypatch, *_train(manifest, out), "--max-steps", str(STEPS)
    )
    assert code == 130, said + err
    stopped = read_metrics(out)["summary"]["steps"]
    assert stopped == 7
    # the steps since the last window were logged at the stop: the closing loss is theirs
    last = read_metrics(out)["windows"][-1]
    assert last["step"] == stopped and last["loss"] is not None, last
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert f"checkpoint-{stopped}" in kept, (stopped, kept)


@pytest.mark.slow
def test_an_interrupt_saves_its_step_when_checkpoints_keep_the_best_alone(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """save_strategy best: the stop's save was taken back by the Trainer where that step's
    evaluation was not a new best (the message said a checkpoint was saved; --resume went
    back to the best's step). A signal during a step's evaluation stopped a step later; it
    stops at that step (its loss logged before the evaluation)."""
    import transformers

    config = {"save_strategy": "best", "evaluation_strategy": "steps", "eval_steps": 1}
    config |= {"learning_rate": 1e-9, "max_steps": 8}  # no evaluation after the first is best
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=24, valid_rows=4, config=config)
    with monkeypatch.context() as during_a_step:
        signal_at_step(during_a_step, 3)
        code, said, err = run_main(capsys, during_a_step, *_train(manifest, tmp_path / "a"))
    assert code == 130, said + err
    assert read_metrics(tmp_path / "a")["summary"]["steps"] == 3
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == [
        "checkpoint-1",  # the best
        "checkpoint-3",  # was not there
    ]
    real, sent = transformers.Trainer.prediction_step, []

    def during_evaluation(self, *args, **kwargs):
        if self.state.global_step == 2 and not sent:  # step 2's evaluation's first batch
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "prediction_step", during_evaluation)
    code, said, err = run_main(capsys, monkeypatch, *_train(manifest, tmp_path / "b"))
    assert code == 130, said + err
    assert read_metrics(tmp_path / "b")["summary"]["steps"] == 2  # was 3
    assert read_metrics(tmp_path / "b")["windows"][-1]["step"] == 2
    assert (tmp_path / "b" / "checkpoints" / "checkpoint-2").is_dir()
    code, said, err = run_main(capsys, monkeypatch, *_train(manifest, tmp_path / "b"), "--resume")
    assert code == 0 and "resuming from checkpoint-2 (step 2 of 8)" in said, said + err


@pytest.mark.slow
def test_a_resume_from_the_last_steps_checkpoint_saves_it_as_the_final_adapter(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Killed between its last checkpoint and its final save, a run resumed from that
    checkpoint trained one step more (step 5 of 4, an evaluation and a checkpoint of its
    own); it saves the checkpoint's adapter as the final one and trains nothing."""
    from safetensors.torch import load_file

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config={"save_steps": 2})
    out = tmp_path / "o"
    args = (*_train(manifest, out), "--max-steps", "4")
    assert run_main(capsys, monkeypatch, *args)[0] == 0
    speed = read_metrics(out)["summary"]["tokens_per_s"]
    (out / "adapter_model.safetensors").unlink()  # as a kill before the final save leaves it
    code, stdout, _ = run_main(capsys, monkeypatch, "report", str(out))
    assert code == 0 and " ".join(stdout.split()).startswith("stopped: 4 steps")
    assert "--resume saves it" in " ".join(stdout.split())
    code, stdout, err = run_main(capsys, monkeypatch, *args, "--resume")
    assert code == 0, stdout + err
    assert "resuming from checkpoint-4 (step 4 of 4)" in stdout
    assert "step 4 of 4 was in checkpoint-4: its adapter saved as the final one" in " ".join(
        stdout.split()
    )
    summary = read_metrics(out)["summary"]
    assert summary["steps"] == 4 and summary["steps_this_run"] == 0
    assert summary["tokens_per_s"] == pytest.approx(speed, rel=0.01)  # the run's, not 0
    code, stdout, _ = run_main(capsys, monkeypatch, "report", str(out))
    assert " ".join(stdout.split()).startswith("completed: 4 steps") and " 0 tok/s" not in stdout
    assert read_metrics(out)["summary"]["final_loss"] == window_losses(out)[4]  # the run's own
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    assert resolved["runtime"]["final_step"] == 4
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    final = load_file(out / "adapter_model.safetensors")
    kept = load_file(out / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors")
    assert final.keys() == kept.keys() and all(final[k].equal(kept[k]) for k in kept)


@pytest.mark.slow
def test_resume_without_checkpoint_is_a_clean_error(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A run folder without a checkpoint is told so; a mistyped --output (a folder not there,
    or one that holds no run) was told "no checkpoint to resume from under OUT/checkpoints
    ... start again with --overwrite" of a folder with nothing in it."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=4)
    out = tmp_path / "o"
    code, _, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--resume")
    assert code == 2 and not out.exists()
    assert f"--resume: {out} is not there; give the --output of the run to go on with" in (
        " ".join(err.split())
    )
    out.mkdir()
    code, _, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--resume")
    assert code == 2 and f"--resume: {out} holds no run;" in " ".join(err.split())
    (out / "checkpoints").mkdir()
    code, _, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--resume")
    assert code == 2 and "no checkpoint to resume from" in " ".join(err.split())


def _signal_mid_build(args: list[str], expert: Path, sig: int) -> subprocess.CompletedProcess:
    """`expert-cli ARGS` stopped by `sig` half a second into its token-cache build (the
    expert's data must take longer than that to tokenize)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "expert_cli.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=ROOT,
    )
    builds = expert / ".cache" / "pretokenized"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if builds.is_dir() and any(p.name.startswith(".build-") for p in builds.iterdir()):
            break
        time.sleep(0.05)
    time.sleep(0.5)  # well into the build
    assert proc.poll() is None, "the build ended before the signal: give it more rows"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert "Traceback" not in stderr, stderr
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.slow
def test_a_signal_while_tokenizing_leaves_nothing_behind(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """SIGTERM (a scheduler's stop, `kill`) while the token cache is built killed train where
    it stood: a new --output folder stayed behind holding only `.train.lock`. Now the folder
    it created goes, as it does for Ctrl-C, with 128 + the signal's number and no traceback.
    (SIGTERM is raised as Ctrl-C's KeyboardInterrupt: one way out, tested once.)"""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=20_000)
    args = [*_train(manifest, tmp_path / "runs" / "new"), "--max-steps", "2"]
    done = _signal_mid_build(args, tmp_path / "e", signal.SIGTERM)
    assert done.returncode == 143, done.stdout + done.stderr
    assert not (tmp_path / "runs").exists()
    said = " ".join((done.stdout + done.stderr).split())  # it ended without a word
    assert "interrupted: before training began: nothing trained" in said, said


@pytest.mark.slow
def test_pretokenize_stopped_says_what_is_kept(tmp_path: Path, tiny_model_dir: Path) -> None:
    """SIGTERM or Ctrl-C in `pretokenize` ended it without a word; it says the finished shards
    are kept (the same command resumes from them), and exits 143."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=20_000)
    args = ["pretokenize", "--manifest", str(manifest)]
    done = _signal_mid_build(args, manifest.parent, signal.SIGTERM)
    assert done.returncode == 143, done.stdout + done.stderr
    said = " ".join(done.stderr.split())  # once: it said "stopped by Ctrl-C" after it too
    assert said.count("interrupted:") == 1 and "interrupted: the shards finished so far" in said


def test_resume_of_an_fp16_checkpoint_in_another_precision(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A checkpoint holding an fp16 run's loss scale (scaler.pt: a T4 run), resumed where the
    run is not fp16 (an A100 takes bf16; here the CPU's fp32): the scale is left unread. The
    Trainer loaded it into the scaler such a run does not have: an AttributeError."""
    import torch

    from expert_cli.train.run import train
    from expert_cli.train.session import Silent, TrainOptions

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config={"save_steps": 2})
    out = tmp_path / "run"
    assert train(TrainOptions(manifest, out, max_steps=2), Silent()).status == "completed"
    checkpoint = out / "checkpoints" / "checkpoint-2"
    torch.save(torch.amp.GradScaler("cpu").state_dict(), checkpoint / "scaler.pt")
    more = train(TrainOptions(manifest, out, resume=True, max_steps=4), Silent())
    assert more.status == "completed"
    assert read_metrics(out)["summary"]["steps"] == 4


def test_resume_of_a_finished_run_to_fewer_steps_says_only_that(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A finished 2-step run resumed with --max-steps 1 has nothing to train: it said the
    learning-rate schedule would be built again for the new length, then that nothing was
    left to resume."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    out = tmp_path / "run"
    code, _, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--max-steps", "2")
    assert code == 0, err
    code, said, err = run_main(
        capsys, monkeypatch, *_train(manifest, out), "--resume", "--max-steps", "1"
    )
    said = " ".join(said.split())
    assert code == 0, err
    assert "nothing to resume" in said and "schedule is built again" not in said


@pytest.mark.slow
def test_a_resume_given_the_length_its_epochs_came_to_keeps_its_schedule_in_silence(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A run of the manifest's epochs, stopped, resumed with --max-steps of the very length
    those epochs came to: it said the learning-rate schedule was built again for a new
    length (it is the same one)."""
    config = {"save_steps": 1, "save_total_limit": 2}
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=32, config=config)
    out = tmp_path / "run"
    with monkeypatch.context() as interrupted:
        signal_at_step(interrupted, 2)
        code, said, err = run_main(capsys, interrupted, *_train(manifest, out))
    assert code == 130, said + err
    newest = max((out / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name[11:]))
    length = json.loads((newest / "trainer_state.json").read_text())["max_steps"]
    assert int(newest.name[11:]) < length
    code, said, err = run_main(
        capsys, monkeypatch, *_train(manifest, out), "--resume", "--max-steps", str(length)
    )
    said = " ".join(said.split())
    assert code == 0, said + err
    assert "schedule is built again" not in said, said
    assert read_metrics(out)["summary"]["steps"] == length


def test_an_expert_folder_moved_between_stop_and_resume(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The expert folder, its base model and data inside, moved (or mounted elsewhere on
    another machine) while its run was stopped: --resume said the run "was trained with
    another configuration (changed: base_model; train_sources)", the same manifest byte for
    byte, and offered only --overwrite. Paths inside the manifest's folder compare as
    relative to it; a data file renamed (the same content) is the same data, and another
    file in its place is other data."""
    config = {"save_steps": 1, "save_total_limit": 2}
    before = tmp_path / "before"
    before.mkdir()
    shutil.copytree(tiny_model_dir, before / "model")
    manifest = write_expert(before, before / "model", rows=32, config=config)
    out = tmp_path / "run"
    with monkeypatch.context() as interrupted:
        signal_at_step(interrupted, 2)
        code, said, err = run_main(capsys, interrupted, *_train(manifest, out))
    assert code == 130, said + err
    moved = tmp_path / "after"
    before.rename(moved)
    data = json.loads((moved / "manifest.json").read_text())
    data["base_models"][0]["name"] = str(moved / "model")  # written absolute: moved with it
    (moved / "manifest.json").write_text(json.dumps(data))
    code, said, err = run_main(
        capsys, monkeypatch, *_train(moved / "manifest.json", out), "--resume"
    )
    assert code == 0, said + err
    assert "resuming from checkpoint-2" in " ".join(said.split())
    assert read_metrics(out)["summary"]["status"] == "completed"
    (moved / "data" / "train.jsonl").rename(moved / "data" / "renamed.jsonl")
    data["training"]["dataset"]["path"] = "data/renamed.jsonl"
    (moved / "manifest.json").write_text(json.dumps(data))
    code, said, err = run_main(
        capsys, monkeypatch, *_train(moved / "manifest.json", out), "--resume", "--max-steps", "16"
    )
    assert code == 0, said + err  # was: "another configuration (changed: train_sources)"
    assert "resuming from checkpoint-" in said
    edited = moved / "data" / "renamed.jsonl"
    edited.write_text(edited.read_text().replace("a", "b", 1))
    code, said, err = run_main(
        capsys, monkeypatch, *_train(moved / "manifest.json", out), "--resume", "--max-steps", "18"
    )
    said = " ".join(err.split())
    assert (
        code == 2
        and "was trained on other data (changed since it began: data/renamed.jsonl)" in said
    )


def test_a_damaged_random_base_kept_for_a_resume_says_how_to_build_it_again(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A random-init run keeps its base in OUTPUT/base_model for a resume: damaged there, it
    was told to "download or copy it again" (nothing to download), or quoted transformers'
    error. It is named, with the way on: remove the folder, and the resume builds it again
    from the seed, the same weights."""
    config = {"save_steps": 1, "save_total_limit": 2}
    manifest = write_expert(
        tmp_path / "e", tiny_model_dir, rows=32, config=config, base={"init": "random"}
    )
    out = tmp_path / "run"
    with monkeypatch.context() as interrupted:
        signal_at_step(interrupted, 2)
        code, said, err = run_main(capsys, interrupted, *_train(manifest, out))
    assert code == 130, said + err
    weights = out / "base_model" / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    code, said, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--resume")
    assert code == 2, said + err
    assert " ".join(err.split()).endswith(
        f"{out / 'base_model'}: model.safetensors is damaged (its header does not match its "
        "size); it is this run's random-init base, built from its seed: remove that folder and "
        "--resume builds it again (the same weights where the device and dtype are the same)"
    )
    assert read_metrics(out)["summary"]["status"] == "interrupted"
    shutil.rmtree(out / "base_model")
    code, said, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--resume")
    assert code == 0, said + err
    assert weights.read_bytes() == whole  # built again: the same weights


def test_intervals_edited_before_a_resume_are_applied(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The Trainer takes its logging and save intervals from the checkpoint's state: edited
    before --resume, they were recorded in manifest.resolved.json and not applied."""
    config = {"logging_steps": 2, "save_steps": 2, "save_total_limit": 5}
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config=config)
    out = tmp_path / "run"
    code, _, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--max-steps", "2")
    assert code == 0, err
    every = ("--set", "training.config.logging_steps=1", "--set", "training.config.save_steps=1")
    code, said, err = run_main(
        capsys, monkeypatch, *_train(manifest, out), "--max-steps", "4", "--resume", *every
    )
    assert code == 0, said + err
    assert sorted(window_losses(out)) == [2, 3, 4]
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved == ["checkpoint-2", "checkpoint-3", "checkpoint-4"], saved


def test_a_damaged_final_adapter_is_not_a_finished_run(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A finished run whose final adapter was cut short since (a copy, a full disk) was "a
    finished run; nothing to resume", and report said package ships it, which package then
    refused. Now report names the damage, and --resume saves the adapter again from the
    checkpoint of the last step."""
    from safetensors.torch import load_file

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config={"save_steps": 2})
    out = tmp_path / "o"
    args = (*_train(manifest, out), "--max-steps", "4")
    assert run_main(capsys, monkeypatch, *args)[0] == 0
    weights = out / "adapter_model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size - 100)
    code, stdout, _ = run_main(capsys, monkeypatch, "report", str(out))
    said = " ".join(stdout.split())
    assert code == 0 and said.startswith("stopped: 4 steps"), said
    assert "adapter_model.safetensors is damaged (its header does not match its size)" in said
    assert "package ships the final adapter, which is damaged: --checkpoint NAME ships" in said
    code, stdout, err = run_main(capsys, monkeypatch, *args, "--resume")
    assert code == 0, stdout + err
    assert "its adapter saved as the final one" in " ".join(stdout.split())
    final = load_file(weights)
    kept = load_file(out / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors")
    assert final.keys() == kept.keys() and all(final[k].equal(kept[k]) for k in kept)


def test_a_final_adapter_this_process_cannot_read_is_not_called_damaged(
    monkeypatch, tmp_path: Path
) -> None:
    """Another user's run whose adapter is 0600: not readable here, and not damaged."""
    from train_helpers import hand_built_run

    from expert_cli.train.choice import final_adapter_whole

    run = hand_built_run(tmp_path)
    weights = run / "adapter_model.safetensors"
    assert final_adapter_whole(run)
    opened = Path.open

    def denied(self, *args, **kwargs):
        if self == weights:
            raise PermissionError(13, "Permission denied")
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    assert final_adapter_whole(run)
    monkeypatch.undo()
    weights.write_bytes(weights.read_bytes()[:-1])
    assert not final_adapter_whole(run)


def test_a_second_signal_before_any_whole_checkpoint_says_there_is_nothing_to_resume(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A second signal while the run's first checkpoint was written said to --resume from
    "its latest checkpoint", which --resume then refused (none whole), and `train` without it
    sent the user back to --resume: now the checkpoint cut short is removed, the line says
    to start over with --overwrite, and so do both refusals."""
    from expert_cli.train.final_save import AT_ONCE, NOTHING_KEPT, stopped_at_once

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config={"save_steps": 1})
    out = tmp_path / "run"
    code, _, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--max-steps", "2")
    assert code == 0, err
    checkpoints = out / "checkpoints"
    (checkpoints / "checkpoint-3").mkdir()  # cut short while written: no marker
    (checkpoints / "checkpoint-3" / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    assert stopped_at_once(out, 3, is_main=True) == AT_ONCE  # checkpoint-2 is kept
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-1", "checkpoint-2"]

    for kept in checkpoints.iterdir():
        shutil.rmtree(kept)
    (checkpoints / "checkpoint-1").mkdir()
    assert stopped_at_once(out, 1, is_main=True) == NOTHING_KEPT
    assert not any(checkpoints.iterdir())
    assert "--overwrite to start over" in NOTHING_KEPT and "--resume" not in NOTHING_KEPT

    metrics = json.loads((out / "metrics.json").read_text())
    metrics["summary"]["status"] = "interrupted"
    (out / "metrics.json").write_text(json.dumps(metrics))
    code, said, err = run_main(capsys, monkeypatch, *_train(manifest, out), "--max-steps", "2")
    said = " ".join((said + err).split())
    assert code == 2 and "with no checkpoint written whole to resume from" in said, said
    assert "start again there with --overwrite" in said and "continue it with --resume" not in said
    code, said, err = run_main(
        capsys, monkeypatch, *_train(manifest, out), "--max-steps", "2", "--resume"
    )
    said = " ".join((said + err).split())
    assert code == 2 and "without one, start again with --overwrite" in said, said


def test_a_final_adapter_without_its_config_is_not_a_finished_run(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A finished run whose adapter_config.json was removed (or emptied): report said
    "package ships it", package said the run stopped before its final adapter, and --resume
    said there was nothing to resume. Now report and package name the file, and --resume
    saves the final adapter again from the last step's checkpoint."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config={"save_steps": 2})
    out = tmp_path / "o"
    args = (*_train(manifest, out), "--max-steps", "2")
    assert run_main(capsys, monkeypatch, *args)[0] == 0
    config = (out / "adapter_config.json").read_text()
    for damage in ("{}", None):
        if damage is None:
            (out / "adapter_config.json").unlink()
        else:
            (out / "adapter_config.json").write_text(damage)
        code, stdout, _ = run_main(capsys, monkeypatch, "report", str(out))
        said = " ".join(stdout.split())
        assert code == 0 and said.startswith("stopped: 2 steps"), said
        assert "adapter_config.json is missing or not an adapter's configuration" in said
        assert "package ships the final adapter, which is damaged" in said
    code, stdout, err = run_main(capsys, monkeypatch, "package", "--adapter", str(out))
    said = " ".join((stdout + err).split())
    assert code == 2 and "its final adapter's adapter_config.json is not there" in said, said
    code, stdout, err = run_main(capsys, monkeypatch, *args, "--resume")
    assert code == 0, stdout + err
    assert "its adapter saved as the final one" in " ".join(stdout.split())
    assert json.loads((out / "adapter_config.json").read_text()) == json.loads(config)
    code, stdout, err = run_main(capsys, monkeypatch, "package", "--adapter", str(out))
    assert code == 0, stdout + err
