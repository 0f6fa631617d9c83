"""The benchmark's sampler, options, run metrics, command control and FLOPs helpers, with an
injected fake NVML source instead of a GPU."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from expert_cli.benchmark import command as command_module
from expert_cli.benchmark import metrics as run_metrics
from expert_cli.benchmark import run as bm
from expert_cli.benchmark.command import Command
from expert_cli.benchmark.plot import write_plot
from expert_cli.errors import UserError
from expert_cli.telemetry.flops import lora_train_flops_per_token, mfu, peak_bf16_flops
from expert_cli.telemetry.gpu import GpuSample, GpuUnreadable, NoGpu, PynvmlSource


class FakeNvml:
    """Replays a recorded sequence per GPU; the last reading repeats once it runs out."""

    def __init__(self, sequences: dict[int, list[GpuSample]]) -> None:
        self.sequences = sequences
        self.calls = dict.fromkeys(sequences, 0)
        self.closed = False

    def device_count(self) -> int:
        return len(self.sequences)

    def driver_version(self) -> str:
        return "550.54.15"

    def name(self, index: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def sample(self, index: int) -> GpuSample:
        seq = self.sequences[index]
        reading = seq[min(self.calls[index], len(seq) - 1)]
        self.calls[index] += 1
        return reading

    def close(self) -> None:
        self.closed = True


def thermal_sequence(index: int) -> list[GpuSample]:
    return [
        GpuSample(
            index=index,
            gpu_util=97.0,
            mem_util=60.0,
            mem_used_mb=40_000.0,
            mem_total_mb=81_559.0,
            temperature_c=92.0,
            power_w=650.0,
            power_limit_w=700.0,
            sm_clock_mhz=1200.0,
            throttle_reasons=["hw_thermal_slowdown"],
        )
    ]


def notes() -> tuple[bm.Hooks, list[str]]:
    """Hooks that keep the notes a person would see."""
    seen: list[str] = []
    return bm.Hooks(note=seen.append), seen


def test_sampler_with_fake_source_assesses_and_writes(tmp_path: Path) -> None:
    fake = FakeNvml({0: thermal_sequence(0), 1: thermal_sequence(1)})
    opts = bm.BenchmarkOptions(
        duration=0.3, interval=0.1, output=tmp_path / "r.json", plot=tmp_path / "u.png", gpu="1"
    )
    report = bm.run_benchmark(opts, source_factory=lambda: fake)
    assert fake.closed
    assert fake.calls == {0: 0, 1: len(report["samples"])}  # only the selected GPU
    assert 2 <= len(report["samples"]) <= 4
    assert report["machine"]["gpus"] == [
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "peak_bf16_tflops": 989.0}
    ]
    assert report["machine"]["driver_version"] == "550.54.15"
    assert report["stats"]["gpus"]["1"]["temperature_c"]["mean"] == 92.0
    assert report["assessment"]["bottleneck"] == "thermal_throttling"
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["schema_version"] == bm.SCHEMA_VERSION
    assert saved["samples"][0]["gpus"][0]["throttle_reasons"] == ["hw_thermal_slowdown"]
    assert (tmp_path / "u.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))


def util_sequence(utils: list[float]) -> list[GpuSample]:
    return [
        GpuSample(
            index=0,
            gpu_util=u,
            mem_util=u / 2,
            mem_used_mb=60_000.0,
            mem_total_mb=81_559.0,
            temperature_c=60.0,
            power_w=500.0,
            power_limit_w=700.0,
            sm_clock_mhz=1980.0,
        )
        for u in utils
    ]


def test_command_startup_is_split_off_and_assessed_without_it(tmp_path: Path) -> None:
    fake = FakeNvml({0: util_sequence([0.0] * 4 + [99.0])})  # the last reading repeats
    metrics = tmp_path / "metrics.json"
    summary = {"data_wait_fraction": 0.002, "mfu": 0.08}
    written = json.dumps({"windows": [], "summary": summary})
    run = f"import pathlib, time; pathlib.Path({str(metrics)!r}).write_text({written!r}); "
    opts = bm.BenchmarkOptions(
        duration=1.0,
        interval=0.1,
        metrics=metrics,
        command=[sys.executable, "-c", run + "time.sleep(30)"],  # a run writing its metrics
        stop_at_end=True,  # the phases of the sampled window are the point here
    )
    report = bm.run_benchmark(opts, source_factory=lambda: fake)
    phases = report["phases"]
    assert phases["active"] and phases["first"] == 4 and phases["tail_s"] == 0.0
    assert phases["startup_s"] == report["samples"][3]["t"]
    assert report["stats"]["gpus"]["0"]["gpu_util"]["min"] == 0.0  # whole run kept
    assert report["active_stats"]["gpus"]["0"]["gpu_util"]["min"] == 99.0
    assert report["assessment"]["bottleneck"] == "gpu_bound"
    assert report["assessment"]["evidence"][0].startswith("start-up: ")
    assert report["run_metrics"]["summary"] == summary


def test_a_metrics_file_no_run_wrote_while_sampling_is_not_read(tmp_path: Path) -> None:
    """`benchmark -- expert-cli train ... --output RUN` where RUN holds a finished run: train
    exits 2 at once, and the finished run's figures were reported, and assessed, as this
    command's. A file no run writes during the window is not read."""
    fake = FakeNvml({0: util_sequence([99.0])})
    metrics = tmp_path / "run" / "metrics.json"
    metrics.parent.mkdir()
    metrics.write_text(json.dumps({"windows": [], "summary": {"data_wait_fraction": 0.4}}))
    fails = tmp_path / "expert-cli"  # a train command that exits 2 at once, as train does
    fails.write_text(f"#!{sys.executable}\nraise SystemExit(2)\n")
    fails.chmod(0o755)
    command = [str(fails), "train", "-m", "m.json", "--output", str(metrics.parent)]
    opts = bm.BenchmarkOptions(duration=0.5, interval=0.1, command=command)
    report = bm.run_benchmark(opts, source_factory=lambda: fake)
    assert report["metrics_path"] == str(metrics)  # found from the command
    assert report["exit_code"] == 2 and report["run_metrics"] is None
    assert not any("0.400" in line for line in report["assessment"]["evidence"])
    assert report["assessment"]["bottleneck"] != "input_bound"
    metrics.write_text('{"windows": ' + "[" * 50000 + "]" * 50000 + "}")
    assert run_metrics.read_run_metrics(metrics) is None  # nested past the parser: unread


def test_plain_sampling_is_not_split() -> None:
    fake = FakeNvml({0: util_sequence([0.0, 0.0, 99.0])})
    report = bm.run_benchmark(
        bm.BenchmarkOptions(duration=0.5, interval=0.1), source_factory=lambda: fake
    )
    assert report["phases"] is None and report["active_stats"] is None
    assert not report["assessment"]["evidence"][0].startswith("start-up")


def test_recorded_h100_report_reassessed_and_rendered() -> None:
    from expert_cli.cli.benchmark_view import render_summary

    path = Path(__file__).parents[2] / "bench_results/h100/benchmark_train_report.json"
    recorded = json.loads(path.read_text())
    assert recorded["assessment"]["bottleneck"] == "underutilized"  # the old rules
    settings = recorded["settings"]
    ctx = bm.Context(
        phased=bool(recorded.get("command") or settings.get("workload")),
        run_metrics=recorded.get("run_metrics"),
        metrics_given=recorded.get("metrics_path") is not None,
        workload=recorded.get("workload"),
        no_gpu_reason=recorded.get("no_gpu_reason"),
    )
    report = {**recorded, **bm.analyse(recorded["samples"], settings["gpus"], ctx)}
    assert report["assessment"]["bottleneck"] == "gpu_bound"
    assert report["stats"]["gpus"]["0"]["gpu_util"]["mean"] < 65  # whole run, with start-up
    console = Console(file=io.StringIO(), width=200)
    render_summary(report, console)
    text = console.file.getvalue()
    assert "start-up: 58 s before the GPU got work" in text
    assert "GPU 0 NVIDIA H100 80GB HBM3, active phase 59-200 s" in text
    assert "assessment: GPU busy, input pipeline keeps up; model compute is the limit" in text
    assert "--metrics" not in text.split("what to change:")[1]


def test_mfu_from_run_metrics_or_workload() -> None:
    windows = [{"mfu": 0.1}, {"mfu": 0.2}, {"step": 3}]
    assert run_metrics.run_mfu({"summary": {"mfu": 0.3}, "windows": windows}, None) == 0.3
    assert run_metrics.run_mfu({"summary": None, "windows": windows}, None) == pytest.approx(0.15)
    assert run_metrics.run_mfu(None, {"mfu": 0.07}) == 0.07
    assert run_metrics.run_mfu(None, None) is None


def test_gpu_index_out_of_range_names_the_option() -> None:
    fake = FakeNvml({0: thermal_sequence(0)})
    opts = bm.BenchmarkOptions(duration=1, interval=1, gpu="2")
    with pytest.raises(UserError, match=r"--gpu: index 2 out of range.*1 GPU"):
        bm.run_benchmark(opts, source_factory=lambda: fake)


def test_no_gpu_source_still_samples_host() -> None:
    def no_gpu() -> FakeNvml:
        raise NoGpu("NVML could not start: Driver Not Loaded")

    hooks, seen = notes()
    report = bm.run_benchmark(
        bm.BenchmarkOptions(duration=0.2, interval=0.1), hooks, source_factory=no_gpu
    )
    assert report["gpu_available"] is False
    assert seen == [
        "no NVIDIA GPU found (NVML could not start: Driver Not Loaded); sampling CPU and RAM only"
    ]
    assert report["stats"]["host"]["ram_percent"]["n"] == len(report["samples"])
    with pytest.raises(UserError, match="--gpu: GPU 0 requested but no NVIDIA GPU"):
        bm.run_benchmark(bm.BenchmarkOptions(duration=0.2, gpu="0"), source_factory=no_gpu)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"duration": 0}, "--duration"),
        ({"interval": -1}, "--interval"),
        ({"gpu": "first"}, "--gpu"),
        ({"output": Path("/no/such/folder/r.json")}, "--output"),
        ({"plot": Path("/no/such/folder/u.png")}, "--plot"),
        ({"workload": "resnet"}, "--workload"),
        ({"output": Path("r.png"), "plot": Path("./r.png")}, "--plot"),
        ({"plot": Path(".png")}, "--plot"),  # a suffix alone: "should end in .png"
    ],
)
def test_bad_options_name_the_option(kwargs: dict, flag: str) -> None:
    with pytest.raises(UserError) as err:
        bm.validate_options(bm.BenchmarkOptions(**kwargs))
    assert err.value.lines[0].startswith(f"{flag}:")
    assert "should end in .png" not in err.value.lines[0]  # said of a name that does


@pytest.mark.parametrize(("name", "magic"), [("u.svg", b"<?xml"), ("u.PDF", b"%PDF")])
def test_the_plot_is_written_in_the_format_its_name_says(
    tmp_path: Path, name: str, magic: bytes
) -> None:
    fake = FakeNvml({0: thermal_sequence(0)})
    opts = bm.BenchmarkOptions(duration=0.3, interval=0.1)
    report = bm.run_benchmark(opts, source_factory=lambda: fake)
    write_plot(report, tmp_path / name)
    assert (tmp_path / name).read_bytes().startswith(magic)
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left


def test_run_metrics_read_tolerantly(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    assert run_metrics.read_run_metrics(path) is None  # not written yet
    path.write_text('{"windows": [{"step": 10, "tokens_')  # half-written
    assert run_metrics.read_run_metrics(path) is None
    windows = [
        {"step": 10, "tokens_per_s": 900.0, "data_wait_fraction": 0.5},
        {"step": 20, "tokens_per_s": 1100.0, "data_wait_fraction": 0.3},
    ]
    path.write_text(json.dumps({"windows": windows}))
    run = run_metrics.read_run_metrics(path)
    assert run["last_window"]["step"] == 20
    assert run_metrics.data_wait_fraction(run) == pytest.approx(0.4)  # mean of windows
    path.write_text(json.dumps({"windows": windows, "summary": {"data_wait_fraction": 0.1}}))
    assert run_metrics.data_wait_fraction(run_metrics.read_run_metrics(path)) == 0.1  # summary wins


def test_a_metrics_file_that_is_no_runs_is_refused_and_its_numbers_bounded(
    tmp_path: Path,
) -> None:
    """`--metrics manifest.json` ran and said the data wait was unknown; a data wait of 7 (a
    hand-edited file) was reported as "7.00 of step time"."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"name": "x", "training": {}}))
    with pytest.raises(UserError) as err:
        bm.validate_options(bm.BenchmarkOptions(metrics=manifest))
    assert err.value.lines == [
        f"--metrics {manifest}: not a training run's metrics.json (it has no list of windows); "
        "give OUTPUT/metrics.json of `expert-cli train`"
    ]
    with pytest.raises(UserError, match="is a folder"):
        bm.validate_options(bm.BenchmarkOptions(metrics=tmp_path))
    bm.validate_options(bm.BenchmarkOptions(metrics=tmp_path / "later" / "metrics.json"))
    path = tmp_path / "metrics.json"
    windows = [{"data_wait_fraction": v, "mfu": v} for v in (7, float("nan"), True, "a", 0.0, 0.2)]
    path.write_text(json.dumps({"windows": windows, "summary": {"data_wait_fraction": -1}}))
    run = run_metrics.read_run_metrics(path)
    assert run_metrics.data_wait_fraction(run) == pytest.approx(0.1)  # 0.0 and 0.2 only
    assert run_metrics.run_mfu(run, {"mfu": 3.0}) == pytest.approx(0.1)
    assert run_metrics.run_mfu(None, {"mfu": 3.0}) is None
    for value in (7, True, "high"):  # in the summary: no run writes it; refused up front
        path.write_text(json.dumps({"windows": [], "summary": {"data_wait_fraction": value}}))
        with pytest.raises(UserError) as err:
            bm.validate_options(bm.BenchmarkOptions(metrics=path))
        assert "its summary's data_wait_fraction is no fraction from 0 to 1" in err.value.lines[0]
    from expert_cli.cli.benchmark_view import _extras_lines

    report = {
        "metrics_path": str(path),
        "run_metrics": {"summary": {"data_wait_fraction": 7, "tokens_per_s": "x", "mfu": 2.0}},
    }
    assert _extras_lines(report) == ["run metrics: tokens/s -, data wait -, MFU -"]


def test_a_metrics_device_pipe_or_huge_file_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    """`--metrics /dev/zero` read until memory ran out (a MemoryError traceback), a FIFO hung
    the benchmark before its first sample; the same read was repeated while sampling."""
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in (Path("/dev/zero"), fifo):
        with pytest.raises(UserError) as err:
            bm.validate_options(bm.BenchmarkOptions(metrics=path))
        assert err.value.lines == [
            f"--metrics {path}: is not a regular file (a device, pipe or socket); give the "
            "run's metrics.json (OUTPUT/metrics.json)"
        ]
        assert run_metrics.read_run_metrics(path) is None  # returns at once, nothing read
    big = tmp_path / "metrics.json"
    big.write_text(json.dumps({"windows": []}))
    monkeypatch.setattr(run_metrics, "MAX_METRICS_BYTES", 4)
    with pytest.raises(UserError, match="over 0 MB, larger than any run's metrics.json"):
        bm.validate_options(bm.BenchmarkOptions(metrics=big))
    assert run_metrics.read_run_metrics(big) is None


def test_a_runs_own_files_are_not_a_report_to_write(tmp_path: Path) -> None:
    """`benchmark --output RUN/metrics.json --force` wrote its report over the run's record,
    and `report RUN` then called the folder no train output. A file of another name in the
    run folder, or metrics.json in a folder holding no run, is the user's to write."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.resolved.json").write_text("{}")
    (run / "metrics.json").write_text(json.dumps({"windows": []}))
    for flag, name in (("output", "metrics.json"), ("plot", "training.png")):
        with pytest.raises(UserError) as err:
            bm.validate_options(bm.BenchmarkOptions(**{flag: run / name}, force=True))
        assert err.value.lines == [
            f"--{flag} {run / name}: is the {name} of the training run in {run}, not this "
            "command's to write; give another file name"
        ]
    assert json.loads((run / "metrics.json").read_text()) == {"windows": []}
    bm.validate_options(bm.BenchmarkOptions(output=run / "benchmark.json"))
    bm.validate_options(bm.BenchmarkOptions(output=tmp_path / "metrics.json"))


def test_train_metrics_path_from_command() -> None:
    assert run_metrics.train_metrics_path(
        ["expert-cli", "train", "-m", "m.json", "--output", "runs/a"]
    ) == Path("runs/a/metrics.json")
    assert run_metrics.train_metrics_path(
        ["/venv/bin/expert-cli", "train", "--output=runs/b"]
    ) == Path("runs/b/metrics.json")
    assert run_metrics.train_metrics_path(
        ["expert-cli", "train", "--manifest", "experts/demo/m.json"]
    ) == Path("experts/demo/output/metrics.json")  # the trainer's default output folder
    assert run_metrics.train_metrics_path(["expert-cli", "train"]) is None
    assert run_metrics.train_metrics_path(["expert-cli", "check", "--output", "x"]) is None
    assert run_metrics.train_metrics_path(["python", "train.py", "--output", "x"]) is None


def test_command_stopped_politely_with_sigint() -> None:
    cmd = Command([sys.executable, "-c", "import time; time.sleep(60)"])
    assert cmd.wait(0.2) is None
    t = time.monotonic()
    assert cmd.stop() == 130  # KeyboardInterrupt: killed by SIGINT, 128 + 2
    assert time.monotonic() - t < 5


def test_command_ignoring_sigint_gets_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command_module, "SIGINT_GRACE_S", 0.5)
    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
    cmd = Command([sys.executable, "-c", code])
    time.sleep(0.3)  # let it install the handler
    assert cmd.stop() == 143  # 128 + SIGTERM


def test_missing_command_is_a_user_error() -> None:
    with pytest.raises(UserError, match="-- no-such-program-xyz: cannot start"):
        Command(["no-such-program-xyz"])


def test_pynvml_wrapper_reads_and_decodes() -> None:
    class NotSupported(Exception):
        pass

    def unsupported(*_: object) -> None:
        raise NotSupported

    nv = SimpleNamespace(
        NVMLError_NotSupported=NotSupported,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87, memory=41),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=2 * 1024**3, total=8 * 1024**3),
        nvmlDeviceGetTemperature=lambda h, sensor: 71,
        nvmlDeviceGetPowerUsage=unsupported,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 350_000,
        nvmlDeviceGetClockInfo=lambda h, clock: 1755,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4 | 0x20,
        nvmlDeviceGetName=lambda h: b"NVIDIA L4",
    )
    source = PynvmlSource(nv)
    s = source.sample(0)
    assert (s.gpu_util, s.mem_util, s.mem_used_mb, s.mem_total_mb) == (87.0, 41.0, 2048, 8192)
    assert s.mem_used_percent == 25.0
    assert (s.temperature_c, s.power_w, s.power_limit_w, s.sm_clock_mhz) == (71, None, 350, 1755)
    assert s.throttle_reasons == ["sw_power_cap", "sw_thermal_slowdown"]
    assert source.name(0) == "NVIDIA L4"


def test_pynvml_wrapper_reads_past_any_nvml_error() -> None:
    """A driver without a query (NVML's FunctionNotFound: the clock event reasons on an older
    driver), or a metric it may not read (NoPermission), leaves that metric unknown; the
    older throttle-reasons query is asked instead. Only NotSupported was caught: one such
    reading ended `benchmark` with a traceback."""

    class NVMLError(Exception):
        pass

    class FunctionNotFound(NVMLError):
        pass

    class NoPermission(NVMLError):
        pass

    def raises(kind: type) -> Any:
        def query(*_: object) -> None:
            raise kind

        return query

    nv = SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_FunctionNotFound=FunctionNotFound,
        NVMLError_NoPermission=NoPermission,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=50, memory=10),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=1024**3, total=16 * 1024**3),
        nvmlDeviceGetTemperature=raises(NoPermission),
        nvmlDeviceGetPowerUsage=lambda h: 70_000,
        nvmlDeviceGetEnforcedPowerLimit=raises(NoPermission),
        nvmlDeviceGetClockInfo=lambda h, clock: 1590,
        nvmlDeviceGetCurrentClocksEventReasons=raises(FunctionNotFound),
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4,
    )
    s = PynvmlSource(nv).sample(0)
    assert (s.gpu_util, s.temperature_c, s.power_w, s.power_limit_w) == (50.0, None, 70.0, None)
    assert s.throttle_reasons == ["sw_power_cap"]
    del nv.nvmlDeviceGetCurrentClocksThrottleReasons  # an older nvidia-ml-py has neither
    assert PynvmlSource(nv).sample(0).throttle_reasons == []

    class GpuIsLost(NVMLError):
        pass

    nv.nvmlDeviceGetPowerUsage = raises(GpuIsLost)  # not a metric it cannot read: raised
    with pytest.raises(GpuUnreadable, match="GPU 0: NVML says"):
        PynvmlSource(nv).sample(0)


def test_lora_flops_by_hand() -> None:
    # fwd 2*1000 + activation grads 2*1000 + weight grads 2*10 + attention 12*2*8*16 = 7092
    assert lora_train_flops_per_token(1000, 10, 2, 8, 16) == 7092.0
    # attention over heads*head_dim = 16 instead of hidden: 4020 + 12*2*16*16 = 10164
    assert lora_train_flops_per_token(1000, 10, 2, 8, 16, attn_dim=16) == 10164.0
    assert mfu(1000.0, 1e9, 1e13) == pytest.approx(0.1)
    assert mfu(1000.0, 1e9, None) is None


def test_the_attention_term_counts_the_whole_score_matrix() -> None:
    """No halving for the causal mask (PaLM's convention); the docs give its size for
    Qwen3-0.6B at 2,048-token examples: 37% of the count, an MFU 18% lower if halved."""
    whole = lora_train_flops_per_token(606_000_000, 10_100_000, 28, 1024, 2048, attn_dim=2048)
    dense = lora_train_flops_per_token(606_000_000, 10_100_000, 28, 1024, 0, attn_dim=2048)
    attention = whole - dense
    assert attention == 12 * 28 * 2048 * 2048  # scores and values, forward and backward
    assert round(attention / whole, 2) == 0.37
    assert round(1 - (dense + attention / 2) / whole, 2) == 0.18


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H200", 989),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA L4", 121),
        ("NVIDIA L40S", 362),
        ("NVIDIA GeForce RTX 4090", 165),
        ("NVIDIA A10G", 125),
        ("Tesla T4", 65),  # fp16: no bf16 there, runs are fp16
        ("Tesla V100-SXM2-16GB", 125),
        ("Tesla V100-PCIE-32GB", 112),
        ("Tesla V100S-PCIE-32GB", 130),
        ("NVIDIA RTX A1000", None),  # took the A100's 312 by substring: MFU 10x too low
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None),  # a slice of the card, not its peak
        ("NVIDIA GH200 480GB", 989),
        ("NVIDIA L40", 181),
    ],
)
def test_peak_bf16_table(name: str, tflops: float | None) -> None:
    peak = peak_bf16_flops(name)
    assert (peak if peak is None else peak / 1e12) == tflops


def test_qwen3_workload_lora_params_by_hand() -> None:
    from expert_cli.telemetry.workload import get_workload

    m = get_workload("qwen3-0.6b-lora").model
    h, q, kv, ff = (
        m["hidden_size"],
        m["num_attention_heads"] * m["head_dim"],
        m["num_key_value_heads"] * m["head_dim"],
        m["intermediate_size"],
    )
    r = 16  # A is r x in, B is out x r
    per_layer = r * ((h + q) + (h + kv) * 2 + (q + h) + (h + ff) * 2 + (ff + h))
    assert per_layer == 360_448
    assert per_layer * m["num_hidden_layers"] == 10_092_544
    with pytest.raises(UserError, match="--workload: unknown workload 'x'"):
        get_workload("x")


@pytest.mark.slow
def test_qwen3_workload_builds_the_real_architecture() -> None:
    import torch

    from expert_cli.telemetry.workload import get_workload
    from expert_cli.train.workload import build_lora_model

    _, counts = build_lora_model(get_workload("qwen3-0.6b-lora"), "meta", torch.bfloat16)
    assert counts["trainable_params"] == 10_092_544
    assert counts["total_params"] - counts["trainable_params"] == 596_049_920  # Qwen3-0.6B


def test_a_gpu_nvml_loses_ends_the_sampling_and_stops_the_command() -> None:
    """NVML stops answering for a GPU mid-run (lost from the bus): the samples so far are
    reported with why the sampling ended, and the benchmarked command is stopped (it ended
    in a traceback, the command left running in its own session)."""
    from expert_cli.cli.benchmark_view import _command_line

    class Lost(FakeNvml):
        def sample(self, index: int) -> GpuSample:
            if self.calls[index] >= 2:
                raise GpuUnreadable(f"GPU {index}: NVML says GPU is lost")
            return super().sample(index)

    opts = bm.BenchmarkOptions(
        duration=20, interval=0.1, command=[sys.executable, "-c", "import time; time.sleep(30)"]
    )
    start = time.monotonic()
    report = bm.run_benchmark(opts, source_factory=lambda: Lost({0: util_sequence([90.0])}))
    assert time.monotonic() - start < 15  # not the whole window, nor the command's 30 s
    assert report["stopped_by"] == "gpu_error" and len(report["samples"]) == 2
    assert report["gpu_error"] == "GPU 0: NVML says GPU is lost"
    assert report["exit_code"] == 130  # stopped by the SIGINT Command.stop sends first
    assert _command_line(report).startswith("sampling ended: GPU 0: NVML says GPU is lost;")


def test_workload_takes_the_kernels_train_takes_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`benchmark --workload` runs the step `train` would run on this machine: on a GPU
    machine (its facts given, the step on the CPU) the fused LoRA linear and the chunked
    loss where liger-kernel is missing, and the same losses as peft's layers with the
    standard loss."""
    from expert_cli.config.environment import Environment
    from expert_cli.telemetry.workload import get_workload
    from expert_cli.train import workload

    spec = get_workload("tiny")
    losses = {}
    for gpu in (False, True):
        env = Environment(gpu_count=int(gpu), cpu_count=2, bf16=gpu)
        monkeypatch.setattr(workload, "probe_environment", lambda env=env: env)
        step, info = workload.build_fast_step(spec)
        losses[gpu] = [step().item() for _ in range(3)]
        kernels = (info["attention"], info["fused_loss"], info["adapter_kernel"])
        assert kernels == (("sdpa", "chunked", "fused") if gpu else ("sdpa", "off", "peft"))
        assert info["adapter_layers_fused"] == (2 * 7 if gpu else 0)  # both layers' 7
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
    assert losses[True][2] < losses[True][0]


@pytest.mark.parametrize("flag", ["output", "plot"])
def test_a_report_folder_that_cannot_be_written_is_refused_before_sampling(
    tmp_path: Path, flag: str
) -> None:
    """A folder that exists but takes no file (/proc here; a read-only disk alike) was found
    out by the write after the whole window, as a traceback; a file where the folder should
    be was called a folder that does not exist."""
    with pytest.raises(UserError, match=rf"^--{flag} .*/proc/self cannot be written to"):
        bm.validate_options(bm.BenchmarkOptions(**{flag: Path("/proc/self/r.png")}))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match=rf"^--{flag}: .*afile is not a folder"):
        bm.validate_options(bm.BenchmarkOptions(**{flag: tmp_path / "afile" / "r.png"}))
