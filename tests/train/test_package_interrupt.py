"""Ctrl-C or SIGTERM during `package` (real signals, sent at chosen points of the standard
library's work): the command says what it left, never a package beside a checksum of another
(the package and its .sha256 are renamed into place with signals held). It exited 130 with
nothing printed while a complete package was already in place."""

from __future__ import annotations

import os
import signal
import tarfile
from pathlib import Path

import pytest
from train_helpers import assert_interrupts_said, hand_built_run, run_here, signal_once

import expert_cli.atomic as atomic
from expert_cli.atomic import atomic_files


def test_a_signal_between_the_renames_waits_for_the_last(monkeypatch, tmp_path: Path) -> None:
    """SIGINT at the first rename: both files are in place before KeyboardInterrupt."""
    signal_once(monkeypatch, atomic.os, "replace", signal.SIGINT)
    dests = [tmp_path / "a", tmp_path / "b"]
    seen = []
    with pytest.raises(KeyboardInterrupt), atomic_files(dests) as staged:
        seen.append(staged)
        for tmp, text in zip(staged.paths, "xy", strict=True):
            tmp.write_text(text)
    assert seen[0].in_place
    assert [d.read_text() for d in dests] == ["x", "y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no .tmp- left


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_an_interrupt_as_the_package_is_put_in_place_says_it_is_complete(
    monkeypatch, tmp_path: Path, signum: int, code: int
) -> None:
    target = tmp_path / "x.expert"
    signal_once(monkeypatch, atomic.os, "replace", signum)
    done = run_here("package", "--adapter", str(hand_built_run(tmp_path)), "--output", str(target))
    said = " ".join(done.stderr.split())
    assert done.returncode == code, done.stdout + done.stderr
    assert f"interrupted: {target} and its .sha256 were written in full before it" in said
    monkeypatch.undo()
    checked = run_here("check", "--package", str(target))
    assert checked.returncode == 0 and "package is sound" in checked.stdout, checked.stdout


def test_an_interrupt_while_the_package_is_written_leaves_nothing(
    monkeypatch, tmp_path: Path
) -> None:
    """An earlier package of that name, replaced with --force, is left as it was."""
    target = tmp_path / "x.expert"
    run = hand_built_run(tmp_path)
    assert run_here("package", "--adapter", str(run), "--output", str(target)).returncode == 0
    before = {p.name: p.read_bytes() for p in (target, target.with_name("x.expert.sha256"))}
    signal_once(monkeypatch, tarfile.TarFile, "addfile", signal.SIGINT)
    done = run_here("package", "--adapter", str(run), "--output", str(target), "--force")
    said = " ".join(done.stderr.split())
    assert done.returncode == 130, done.stdout + done.stderr
    assert f"interrupted: before the package was in place: nothing written to {target}" in said
    assert {p.name: p.read_bytes() for p in tmp_path.glob("x.expert*")} == before
    assert not list(tmp_path.glob(".tmp-*"))


def test_an_interrupt_while_the_result_is_shown_says_the_package_is_complete(
    monkeypatch, tmp_path: Path
) -> None:
    import rich.console

    target = tmp_path / "x.expert"
    signal_once(monkeypatch, rich.console.Console, "print", signal.SIGINT)
    done = run_here("package", "--adapter", str(hand_built_run(tmp_path)), "--output", str(target))
    assert done.returncode == 130, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert f"interrupted: {target} and its .sha256 were written in full before it" in said
    assert target.is_file() and target.with_name("x.expert.sha256").is_file()


def test_a_signal_ignored_from_the_start_stays_ignored(tmp_path: Path) -> None:
    """Under `nohup` SIGHUP is ignored from the start: the run is meant to outlive its
    terminal. Neither the training loop's handlers nor the held renames take it over."""
    from expert_cli.atomic import sigterm_raises
    from expert_cli.train.stop_signal import Interrupt

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with Interrupt() as interrupt, sigterm_raises():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert interrupt.signum is None
        with atomic_files([tmp_path / "a"]) as staged:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            staged.paths[0].write_text("x")
        assert (tmp_path / "a").read_text() == "x"
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_an_interrupt_while_the_package_is_planned_is_said(monkeypatch, tmp_path: Path) -> None:
    """Ctrl-C while the run's files were read and hashed, before anything is written: exit
    130 with nothing printed; it says it was stopped, and nothing is there."""
    import expert_cli.train.package as package

    target = tmp_path / "x.expert"
    signal_once(monkeypatch, package, "plan_members", signal.SIGINT)
    done = run_here("package", "--adapter", str(hand_built_run(tmp_path)), "--output", str(target))
    assert done.returncode == 130, done.stdout + done.stderr
    assert "interrupted: stopped by Ctrl-C" in " ".join(done.stderr.split()), done.stderr
    assert not target.exists() and not list(tmp_path.glob(".tmp-*"))


def test_an_export_interrupted_says_what_it_left(monkeypatch, tmp_path: Path) -> None:
    """A signal before an export's write said only "stopped by Ctrl-C", and one while its
    result was shown ended it with exit 130 after "wrote": now the first says nothing was
    written there, the second that the export was written in full before it (export-gguf:
    tests/train/test_gguf_export.py)."""
    import expert_cli.train.hub_export as hub_export

    assert_interrupts_said(monkeypatch, hand_built_run(tmp_path), hub_export, "export-hub")


def test_a_package_finished_meanwhile_under_its_name_is_kept(monkeypatch, tmp_path: Path) -> None:
    """Two `package` of one --output at once both said "wrote" with their own checksums, and
    the later replaced the earlier without --force. A package that appears under the name
    while this one is built is kept (exit 2); with --force it is replaced. A run file that
    goes while it is read (a train --overwrite sets the run aside) is blamed on the run, not
    on --output."""
    import expert_cli.train.package as package

    run, target = hand_built_run(tmp_path), tmp_path / "x.expert"
    real = package.pm.write_tar

    def another_finishes_first(tmp: Path, members) -> None:
        real(tmp, members)
        target.write_bytes(b"the other package")

    monkeypatch.setattr(package.pm, "write_tar", another_finishes_first)
    done = run_here("package", "--adapter", str(run), "--output", str(target))
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"--output {target}: was written by another process while this package was built; it "
        "is left as it is; package again with another name, or --force to replace it"
    ) in " ".join(done.stderr.split())
    assert target.read_bytes() == b"the other package"
    assert sorted(p.name for p in tmp_path.glob("x.expert*")) == ["x.expert"]
    forced = run_here("package", "--adapter", str(run), "--output", str(target), "--force")
    assert forced.returncode == 0 and target.read_bytes() != b"the other package", forced.stderr

    def run_set_aside(tmp: Path, members) -> None:
        run.rename(run.with_name("set-aside"))
        real(tmp, members)

    monkeypatch.setattr(package.pm, "write_tar", run_set_aside)
    done = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "y.expert"))
    said = " ".join(done.stderr.split())
    assert done.returncode == 1 and f"--adapter {run}: " in said, said
    assert "could not be read (No such file or directory): was the run moved or removed" in said
    assert not list(tmp_path.glob("y.expert*"))
