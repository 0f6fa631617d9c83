"""The environment and terminal a run meets: a terminal that hangs up (SIGHUP), a pipe whose
reader leaves, a closed stderr, output that takes ASCII alone, a WORLD_SIZE left in the
shell. Each lost work or ended in a traceback (found by a red-team pass, 2026-11-28)."""

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
    run_here,
    run_main,
    signal_at_step,
    write_expert,
)

STEPS = 40


def _start(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "expert_cli.cli", *args],
        text=True,
        env={**cli_env(), "COLUMNS": "200", **(env or {})},
        cwd=ROOT,
        **popen,
    )


def _wait_for_step(out: Path, proc: subprocess.Popen, step: int) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if read_metrics(out)["windows"][-1]["step"] >= step:
                return
        except (FileNotFoundError, json.JSONDecodeError, IndexError, KeyError):
            pass
        time.sleep(0.02)
    raise AssertionError("the run did not reach the step")


@pytest.mark.slow
def test_a_terminal_that_hangs_up_saves_a_checkpoint(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """SIGHUP (an ssh session dropped) ended the run at once, exit 129: the steps since the
    last checkpoint lost, metrics.json left "running". It stops as SIGTERM does."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=48)
    out = tmp_path / "run"
    args = ("train", "-m", str(manifest), "--output", str(out), "--max-steps", str(STEPS))
    signal_at_step(monkeypatch, 3, signal.SIGHUP)
    code, stdout, stderr = run_main(capsys, monkeypatch, *args)
    assert code == 129, stdout + stderr
    summary = read_metrics(out)["summary"]
    assert (summary["status"], summary["steps"]) == ("interrupted", 3)
    assert (out / "checkpoints" / "checkpoint-3").is_dir()
    assert "SIGHUP: stopping at the end of this optimizer step" in " ".join(stdout.split())


@pytest.mark.slow
def test_a_reader_that_leaves_stops_the_printing_not_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`train ... | head`: rich's answer to the broken pipe was a silent exit 1, the steps
    since the last checkpoint lost."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=48)
    out = tmp_path / "run"
    args = ("train", "-m", str(manifest), "--output", str(out), "--max-steps", str(STEPS // 4))
    proc = _start(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    _wait_for_step(out, proc, 2)
    proc.stdout.close()  # the reader is gone: the next line printed meets a broken pipe
    stderr = proc.stderr.read() if proc.stderr else ""
    proc.wait(timeout=180)
    assert proc.returncode == 0, stderr
    assert "note: standard output cannot be written (Broken pipe)" in stderr
    assert read_metrics(out)["summary"]["status"] == "completed"
    assert read_metrics(out)["summary"]["steps"] == STEPS // 4  # 8 steps past the pipe's end


def test_sigterm_and_a_full_stdout_where_a_command_has_nothing_of_its_own(
    capsys, monkeypatch
) -> None:
    """check (find-datasets, report: the commands with no interrupt of their own) under
    SIGTERM or SIGHUP ended in silence, no line and no JSON under --json; its --json into a
    full stdout printed two tracebacks (the error's JSON went to the same stdout)."""
    import errno

    import typer

    from expert_cli.data import checks

    manifest = str(ROOT / "experts" / "demo" / "manifest.json")
    real = checks.check_manifest

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(checks, "check_manifest", stopped)
        code, out, err = run_main(capsys, patch, "check", "-m", manifest, "--json")
    assert code == 143, out + err
    assert json.loads(out)["error"] == {
        "kind": "interrupted",
        "exit_code": 143,
        "lines": ["stopped by SIGTERM"],
    }
    assert "interrupted:" in err and "stopped by SIGTERM" in err

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(typer, "echo", full)
    code, out, err = run_main(capsys, monkeypatch, "check", "-m", manifest, "--json")
    assert code == 1 and "no space left on the device" in " ".join(err.split()), err


def test_a_closed_stderr_ascii_output_and_a_pipe(tmp_path: Path) -> None:
    """check with stderr closed (its progress bar's write, EBADF) exited 1 with no output;
    with output that takes ASCII alone, a path holding é was a UnicodeEncodeError traceback;
    piped (80 columns), the resolved table cut paths with "…". One process for the three."""
    folder = tmp_path / ("a_rather_long_folder_name_for_experiments_é" * 2) / "demo"
    shutil.copytree(ROOT / "experts" / "demo", folder, ignore=shutil.ignore_patterns(".cache"))
    env = {"PYTHONIOENCODING": "ascii", "COLUMNS": "80"}
    args = ("check", "-m", str(folder / "manifest.json"))
    proc = _start(*args, env=env, stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2))
    stdout, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0 and stdout.rstrip().endswith("manifest is usable"), stdout
    assert "Traceback" not in stdout and "…" not in stdout and "..." not in stdout
    rows = [line for line in stdout.splitlines() if line.startswith(("│", "|"))]
    start = next(i for i, row in enumerate(rows) if "manifest_path" in row)
    cells = "".join(row.split(row[0])[2].strip() for row in rows[start : start + 8])
    assert str(folder / "manifest.json").replace("é", "\\xe9") in cells


def test_a_world_size_left_in_the_shell(capsys, monkeypatch, tmp_path: Path) -> None:
    """WORLD_SIZE=2 RANK=0 left over: train waited for ever for a process never started,
    deaf to SIGTERM (the wait is inside the rendezvous), or, without MASTER_ADDR, ended in
    accelerate's traceback; check said usable."""
    manifest = str(ROOT / "experts" / "demo" / "manifest.json")
    world = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    for name, value in world.items():
        monkeypatch.setenv(name, value)
    _, stdout, _ = run_main(capsys, monkeypatch, "check", "-m", manifest, "--json")
    for name in world:
        monkeypatch.delenv(name)
    notes = json.loads(stdout)["notes"]
    assert any(
        n.startswith("WORLD_SIZE is 2 (RANK 0) in the environment, but no launcher") for n in notes
    )
    out = tmp_path / "run"
    done = run_here("train", "-m", manifest, "--output", str(out), env=world)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert "WORLD_SIZE is 2 in the environment, but MASTER_ADDR is not" in said
    waiting = {**world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531"}
    args = ("train", "-m", manifest, "--output", str(out))
    proc = _start(*args, env=waiting, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for line in proc.stdout:  # the note comes before the wait
        if "a run waits for the other 1 to join" in line:
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)  # ended at once, where it was deaf to it
    assert proc.returncode == -signal.SIGTERM
    assert not out.exists()


def test_a_resumes_argument_warning_from_transformers_is_kept_off(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """A resume with another --max-steps printed transformers' "[transformers] Warning: The
    following arguments do not match the ones in the `trainer_state.json`" (logging_steps),
    where the run itself compares what makes it another run; the filter drops it, and the
    same call without the filter shows it reaches the logger's handlers."""
    import logging

    from transformers import TrainerState, TrainingArguments
    from transformers.trainer_utils import compare_trainer_and_checkpoint_args

    from expert_cli.cli.app import _DropAdvice

    run_main(capsys, monkeypatch, "--version")  # the entry point installs its filters
    logger = logging.getLogger("transformers.trainer_utils")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        args = TrainingArguments(output_dir=str(tmp_path), logging_steps=4137, save_steps=500)
        state = TrainerState(logging_steps=4138, save_steps=500, train_batch_size=8)
        compare_trainer_and_checkpoint_args(args, state)  # message unique: warning_once
        assert not any("do not match" in m for m in seen), seen
        filters = [f for f in logger.filters if isinstance(f, _DropAdvice)]
        assert filters
        for f in filters:
            logger.removeFilter(f)
        state = TrainerState(logging_steps=4139, save_steps=500, train_batch_size=8)
        compare_trainer_and_checkpoint_args(args, state)
        assert any("do not match" in m for m in seen), seen  # the check can fail
    finally:
        logger.removeHandler(handler)
        logger.addFilter(_DropAdvice())


def test_library_chatter_is_kept_off_the_console(capsys, monkeypatch) -> None:
    """matplotlib's lines about its cache folder (HOME or MPLCONFIGDIR not writable) reached
    the console of train; training.png is drawn all the same."""
    import logging

    run_main(capsys, monkeypatch, "--version")
    assert logging.getLogger("matplotlib").getEffectiveLevel() == logging.ERROR


@pytest.mark.parametrize(("args", "code"), [(["--version"], 0), (["check", "-m", "gone.json"], 2)])
def test_a_signal_while_the_interpreter_shuts_down(tmp_path: Path, args, code: int) -> None:
    """Ctrl-C after the last line, while exit hooks ran (torch's, the datasets library's),
    printed "Exception ignored in atexit callback" with a KeyboardInterrupt and lost the
    command's exit code: it ends at once with the command's code, nothing more said."""
    script = (
        "import atexit, os, signal, sys, time\n"
        "from expert_cli.cli import console_script\n"
        "atexit.register(time.sleep, 30)\n"  # runs after the hook below (last in, first out)
        "atexit.register(os.kill, os.getpid(), signal.SIGINT)\n"
        f"sys.argv = ['expert-cli', *{args!r}]\n"
        "console_script()\n"
    )
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert done.returncode == code, done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - began < 25  # ended at the signal, not after the 30 s hook
    said = done.stdout + done.stderr  # the command's own output, in full
    assert (
        ("gone.json" in said)
        if code
        else said.strip().endswith(__import__("expert_cli").__version__)
    )


def test_a_reader_that_leaves_does_not_fail_a_package_written(tmp_path: Path) -> None:
    """`package ... | head -1`: the package and its .sha256 were written in full, then the
    broken pipe was a silent exit 1 (a `set -o pipefail` script took packaging for failed).
    The same holds for export-gguf, export-hub and merge: their product is files."""
    from train_helpers import hand_built_run

    run = hand_built_run(tmp_path)
    target = tmp_path / "x.expert"
    proc = _start("package", "--adapter", str(run), "--output", str(target),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    stderr = proc.stderr.read()
    proc.wait(timeout=180)
    assert proc.returncode == 0, stderr
    assert "note: standard output cannot be written (Broken pipe)" in stderr
    assert target.is_file() and (tmp_path / "x.expert.sha256").is_file()
