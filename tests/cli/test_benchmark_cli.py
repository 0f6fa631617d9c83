"""`expert-cli benchmark` for real through the CLI, in a subprocess: no-GPU path, commands and
their exit codes, run metrics, bad arguments."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import cli_env, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _benchmark(
    cwd: Path, duration: str, *args: str, interval: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`expert-cli benchmark --duration D [--interval I] --output r.json ARGS` in `cwd`."""
    timing = ("--interval", interval) if interval else ()
    return run_cli(
        "benchmark", "--duration", duration, *timing, "--output", "r.json", *args, cwd=cwd
    )


def _benchmark_started(cwd: Path, duration: str, script: str) -> subprocess.Popen[str]:
    """`expert-cli benchmark --duration D --interval 0.5 --output r.json -- python -c SCRIPT`
    started in `cwd`, its stdout and stderr piped."""
    args = ["benchmark", "--duration", duration, "--interval", "0.5", "--output", "r.json"]
    return subprocess.Popen(
        [sys.executable, "-m", "expert_cli.cli", *args, "--", sys.executable, "-c", script],
        cwd=cwd,
        env={**cli_env(), "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def has_nvml_gpu() -> bool:
    from expert_cli.telemetry.gpu import NoGpu, open_nvml

    try:
        open_nvml().close()
    except NoGpu:
        return False
    return True


def test_no_gpu_path_reports_cpu_ram_and_plot(tmp_path: Path) -> None:
    if has_nvml_gpu():
        pytest.skip("this machine has an NVIDIA GPU; the no-GPU path cannot be exercised")
    out = _benchmark(tmp_path, "2", "--plot", "u.png", interval="0.5")
    assert out.returncode == 0, out.stderr
    assert "no NVIDIA GPU found (" in out.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["gpu_available"] is False
    assert report["assessment"]["bottleneck"] == "no_gpu"
    assert len(report["samples"]) == 4
    host = report["stats"]["host"]
    assert 0 <= host["cpu_percent"]["mean"] <= 100
    assert host["ram_used_gb"]["max"] > 0
    assert report["machine"]["cpu_count"] >= 1
    png = (tmp_path / "u.png").read_bytes()
    assert png[:8] == PNG_MAGIC
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "u.png").shape[0] > 100


def test_command_exit_code_is_returned(tmp_path: Path) -> None:
    out = _benchmark(
        tmp_path, "20", "--", sys.executable, "-c", "import sys; sys.exit(3)", interval="0.2"
    )
    assert out.returncode == 3, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["exit_code"], report["stopped_by"]) == (3, "command_exit")
    assert {"phases", "active_stats"} <= report.keys()
    if not report["gpu_available"]:
        assert (report["phases"], report["active_stats"]) == (None, None)


def test_short_command_ends_the_benchmark_early(tmp_path: Path) -> None:
    t = time.monotonic()
    out = _benchmark(tmp_path, "30", "--", sys.executable, "-c", "import time; time.sleep(1)")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t < 10
    report = json.loads((tmp_path / "r.json").read_text())
    assert 0.9 < report["elapsed_s"] < 3
    assert report["stats"]["host"]["process_cpu_percent"] is not None


def test_a_longer_command_runs_to_its_end_and_the_report_covers_the_window(
    tmp_path: Path,
) -> None:
    """The monitoring use: sample the first seconds of a run, never cut the run short."""
    script = (
        "import pathlib, sys, time\n"
        "time.sleep(6)\n"
        "pathlib.Path('finished').write_text('yes')\n"
        "print('the command still prints after the window')\n"
        "sys.exit(4)\n"
    )
    out = _benchmark(tmp_path, "2", "--", sys.executable, "-c", script, interval="0.5")
    assert out.returncode == 4, out.stdout + out.stderr  # the command's own exit code
    assert (tmp_path / "finished").read_text() == "yes"  # it ran to its end
    assert "the command still prints after the window" in out.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["exit_code"], report["command_ended_by"]) == (4, "command_exit")
    assert report["stopped_by"] == "duration" and 1.5 < report["elapsed_s"] < 3.5
    assert max(s["t"] for s in report["samples"]) < 3  # the samples cover the window only
    assert report["command_elapsed_s"] >= 6
    assert "command exited with code 4 after" in " ".join(out.stdout.split())


def test_a_reader_that_leaves_does_not_orphan_the_command(tmp_path: Path) -> None:
    """`benchmark -- CMD | head -1`: the summary met the broken pipe, the benchmark exited 1
    in silence after its window, and CMD ran on with no parent. It waits for CMD, writes
    the report and ends with CMD's code, with one note on stderr."""
    script = "import pathlib, time; time.sleep(3); pathlib.Path('finished').write_text('yes')"
    proc = _benchmark_started(tmp_path, "1", script)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, stderr
    assert (tmp_path / "finished").read_text() == "yes"  # waited for, not left behind
    assert "note: standard output cannot be written (Broken pipe)" in stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["exit_code"], report["command_ended_by"]) == (0, "command_exit")


def test_stop_at_end_stops_the_command_with_the_window(tmp_path: Path) -> None:
    out = _benchmark(
        tmp_path,
        "1",
        "--stop-at-end",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
        interval="0.5",
    )
    assert out.returncode == 0, out.stderr  # stopped as asked: no failure (it exited 130)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stopped_by"] == "duration" and report["settings"]["stop_at_end"] is True
    assert report["exit_code"] == 130  # the command's own, stopped with SIGINT


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    ("signum", "duration", "said"),
    [(signal.SIGTERM, "30", "SIGTERM"), (signal.SIGHUP, "1", "SIGHUP")],
    ids=["in-the-window", "after-the-window"],
)
def test_sigterm_or_sighup_stops_the_command_as_ctrl_c_does(
    tmp_path: Path, signum: int, duration: str, said: str
) -> None:
    """A scheduler's SIGTERM (or a closed terminal's SIGHUP) to `benchmark -- CMD` ended the
    benchmark at once with no report, and left the command running, re-parented to init
    (a training run going on unsupervised); now the command is stopped and the report written,
    as for Ctrl-C, within the window or while waiting for the command after it."""
    child = (  # a command that ends quietly with 130 on Ctrl-C, as expert-cli train does
        "import os, signal, time; signal.signal(signal.SIGINT, lambda *a: os._exit(130)); "
        "open('pid', 'w').write(str(os.getpid())); time.sleep(120)"
    )
    proc = _benchmark_started(tmp_path, duration, child)
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # the second case: past its 1 s window, waiting for the command
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    pid = int((tmp_path / "pid").read_text())
    assert proc.returncode == 128 + signum, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert _pid_gone(pid)  # stopped, not left behind
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["signal_exit"] == 128 + signum
    assert report.get("command_ended_by", report["stopped_by"]) == "interrupt"
    assert report["exit_code"] == 130  # the command's own: stopped with SIGINT first
    assert f"command stopped by {said} (exit code 130)" in " ".join(stdout.split())


METRICS = {
    "windows": [
        {
            "step": 10,
            "tokens_per_s": 5000.0,
            "samples_per_s": 4.0,
            "data_wait_fraction": 0.6,
            "mfu": 0.05,
            "peak_memory_gb": 3.0,
            "loss": 2.0,
            "time": 12.0,
        }
    ],
    "summary": {
        "tokens_per_s": 5100.0,
        "data_wait_fraction": 0.55,
        "mfu": 0.05,
        "steps": 10,
        "train_runtime_s": 12.5,
    },
}


def test_metrics_file_is_read_into_report(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    out = _benchmark(tmp_path, "1", "--metrics", "metrics.json", interval="0.5")
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run_metrics"]["summary"]["tokens_per_s"] == 5100.0
    assert report["run_metrics"]["last_window"]["step"] == 10
    assert "data-wait fraction 0.55 of step time (run metrics)" in report["assessment"]["evidence"]
    assert "run metrics: tokens/s 5100, data wait 0.55" in out.stdout
    assert "pass the run's metrics" not in out.stdout  # they were passed


def test_train_command_output_dir_metrics_are_found(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "expert-cli"  # stands in for `expert-cli train`
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        "out = sys.argv[sys.argv.index('--output') + 1]\n"
        f"open(out + '/metrics.json', 'w').write(json.dumps({METRICS!r}))\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "run").mkdir()
    out = _benchmark(
        tmp_path,
        "10",
        "--",
        str(fake),
        "train",
        "--manifest",
        "m.json",
        "--output",
        "run",
        interval="0.2",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["metrics_path"] == "run/metrics.json"
    assert report["run_metrics"]["summary"]["data_wait_fraction"] == 0.55


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--duration", "0"], "--duration"),
        (["--interval", "0"], "--interval"),
        (["--gpu", "first"], "--gpu"),
        (["--gpu", "99"], "--gpu"),
        (["--gpu", "\u00b2"], "--gpu"),  # a superscript two: str.isdigit() says True
        (["--gpu", "0,\u0663"], "--gpu"),  # an Arabic-Indic three
        (["--output", "mine.json"], "--output"),  # exists: replaced only with --force
        (["--output", "no/such/dir/r.json"], "--output"),
        (["--output", "."], "--output"),  # a folder
        (["--plot", "/dev/null"], "--plot"),  # a device: renaming over it would replace it
        (["--plot", "u.txt"], "--plot"),  # a PNG under a text file's name
        (["--workload", "resnet"], "--workload"),
    ],
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str], flag: str) -> None:
    (tmp_path / "mine.json").write_text("my earlier report")
    out = run_cli("benchmark", "--duration", "1", *args, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"{flag}:" in out.stderr
    assert "Traceback" not in out.stderr
    if args[1] in (".", "/dev/null"):
        assert f"{flag}: {args[1]} is not a regular file" in out.stderr
    if args[1] == "u.txt":
        assert "--plot: u.txt should end in .png, .svg or .pdf" in out.stderr
        assert not (tmp_path / "u.txt").exists()
    if args[1] == "mine.json":
        assert "--output: mine.json already exists; add --force to replace it" in out.stderr
    assert (tmp_path / "mine.json").read_text() == "my earlier report"


def test_force_replaces_an_earlier_report(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text("my earlier report")
    args = ("--duration", "1", "--interval", "0.5", "--output", "r.json", "--force")
    out = run_cli("benchmark", *args, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(json.loads((tmp_path / "r.json").read_text())["samples"]) >= 1


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys, expert_cli.cli; "
        "assert 'torch' not in sys.modules and 'expert_cli.benchmark.run' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_tiny_workload_reports_tokens_per_second(tmp_path: Path) -> None:
    out = run_cli(
        "benchmark",
        "--workload",
        "tiny",
        "--duration",
        "3",
        "--interval",
        "0.5",
        "--output",
        "r.json",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    wl = json.loads((tmp_path / "r.json").read_text())["workload"]
    assert wl["workload"] == "tiny"
    assert wl["timed_steps"] >= 1 and wl["tokens_per_s"] > 0
    # on a CPU the fast path's choices are the portable ones, and the report says so
    assert (wl["attention"], wl["fused_loss"], wl["adapter_precision"]) == ("sdpa", "off", "fp32")
    assert (wl["adapter_kernel"], wl["liger_kernels"]) == ("peft", False)
    assert "attention sdpa, loss off, Liger layers off, adapters peft in fp32" in out.stdout
    # 2 layers x r=16 x (in + out) over q, k, v, o, gate, up, down
    assert wl["trainable_params"] == 2 * 16 * (
        (64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128)
    )
    from expert_cli.telemetry.flops import lora_train_flops_per_token

    assert wl["flops_per_token"] == lora_train_flops_per_token(
        wl["total_params"], wl["trainable_params"], 2, 64, 64, attn_dim=64
    )


@pytest.mark.gpu
def test_real_gpu_is_sampled(tmp_path: Path) -> None:
    if not has_nvml_gpu():
        pytest.skip("no NVIDIA GPU")
    out = _benchmark(tmp_path, "2", "--gpu", "0", "--plot", "u.png", interval="0.5")
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["gpu_available"] is True
    assert report["machine"]["driver_version"]
    g = report["stats"]["gpus"]["0"]
    assert g["mem_used_mb"]["max"] > 0 and g["temperature_c"]["mean"] > 0
    assert (tmp_path / "u.png").read_bytes()[:8] == PNG_MAGIC
