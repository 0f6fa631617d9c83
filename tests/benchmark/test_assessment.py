"""Statistics and bottleneck assessment against recorded sample sequences."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from expert_cli.benchmark.assessment import RunFacts, assess
from expert_cli.benchmark.stats import (
    ACTIVE_UTIL,
    compute_stats,
    dip_pattern,
    percentile,
    split_phases,
    summarize,
)
from expert_cli.telemetry.gpu import GpuSample, decode_throttle_reasons

MEM_TOTAL_MB = 81_559.0
H100_REPORT = Path(__file__).parents[2] / "bench_results/h100/benchmark_train_report.json"


def recorded(
    utils: list[float],
    mem_percent: float | list[float] = 40.0,
    cores: list[float] | None = None,
    reasons: list[str] | None = None,
    temp: float = 60.0,
) -> list[dict[str, Any]]:
    """Samples of one GPU (index 0) and a 4-core host, as the benchmark records them."""
    mems = mem_percent if isinstance(mem_percent, list) else [mem_percent] * len(utils)
    out = []
    for i, (u, m) in enumerate(zip(utils, mems, strict=True)):
        gpu = GpuSample(
            index=0,
            gpu_util=u,
            mem_util=u / 2,
            mem_used_mb=MEM_TOTAL_MB * m / 100,
            mem_total_mb=MEM_TOTAL_MB,
            temperature_c=temp,
            power_w=300.0,
            power_limit_w=700.0,
            sm_clock_mhz=1980.0,
            throttle_reasons=list(reasons or []),
        )
        host = {
            "cpu_percent": list(cores or [10.0, 5.0, 5.0, 5.0]),
            "ram_used_gb": 20.0,
            "ram_total_gb": 128.0,
            "ram_percent": 15.6,
            "process_cpu_percent": None,
        }
        out.append({"t": float(i + 1), "host": host, "gpus": [gpu.to_dict()]})
    return out


def run(samples: list[dict[str, Any]], data_wait: float | None = None, **kw: Any) -> dict[str, Any]:
    facts = RunFacts.of(data_wait, kw.pop("mfu", None), kw.pop("metrics_given", False))
    return assess(compute_stats(samples, [0]), facts, **kw)


def mentions(lines: list[str], text: str) -> bool:
    return any(text in line for line in lines)


def test_summarize_values_by_hand() -> None:
    s = summarize([5.0, 1.0, None, 3.0, 2.0, 4.0])
    assert s == {"mean": 3.0, "min": 1.0, "max": 5.0, "p50": 3.0, "p95": pytest.approx(4.8), "n": 5}
    assert summarize([None, None]) is None
    assert percentile([10.0], 95) == 10.0


def test_gpu_stats_from_samples() -> None:
    stats = compute_stats(recorded([10, 20, 30, 90], reasons=["sw_power_cap"]), [0])
    g = stats["gpus"]["0"]
    assert g["gpu_util"]["mean"] == 37.5
    assert g["util_dip_fraction"] == 0.25  # only the 10% sample is below DIP_UTIL
    assert g["mem_used_percent"]["p50"] == pytest.approx(40.0)
    assert g["throttle_fraction"] == {"sw_power_cap": 1.0}
    assert stats["host"]["cpu_busiest_core_percent"]["max"] == 10.0
    assert stats["host"]["cpu_percent"]["mean"] == pytest.approx(6.25)


def test_throttle_reasons_decoded() -> None:
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x44) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(0x1 | 0x10000) == ["gpu_idle", "unknown_0x10000"]


def test_bursty_utilization_with_a_saturated_core_is_data_loading() -> None:
    utils = [90, 5, 85, 3, 92, 4, 88, 2, 95, 6]
    a = run(recorded(utils, cores=[100.0, 8.0, 3.0, 2.0]))
    assert a["bottleneck"] == "data_loading"
    assert any("busiest core p50 100%" in e for e in a["evidence"])
    assert any("bursty" in e for e in a["evidence"])
    assert any("dataloader_num_workers" in x for x in a["advice"])
    assert any("pretokenize" in x for x in a["advice"])
    assert any("packing" in x for x in a["advice"])


def test_high_data_wait_is_data_loading_even_with_idle_cpu() -> None:
    a = run(recorded([60, 62, 58, 61]), data_wait=0.45)
    assert a["bottleneck"] == "data_loading"
    assert any("data-wait fraction 0.45" in e for e in a["evidence"])


def test_moderate_util_low_memory_idle_cpu_is_small_batches() -> None:
    a = run(recorded([45, 50, 48, 52, 47], mem_percent=18.0), data_wait=0.02)
    assert a["bottleneck"] == "small_batches"
    assert any("batch_size" in x for x in a["advice"])
    assert any("memory used p95 18%" in e for e in a["evidence"])


def test_near_full_memory_with_low_util_is_memory_pressure() -> None:
    a = run(recorded([55, 60, 58, 57], mem_percent=[97.0, 98.0, 98.5, 99.0]))
    assert a["bottleneck"] == "memory_pressure"
    assert any("gradient_checkpointing" in x for x in a["advice"])
    assert any("max_seq_length" in x for x in a["advice"])


def test_thermal_reasons_are_thermal_throttling() -> None:
    a = run(recorded([95] * 5, reasons=["hw_thermal_slowdown"], temp=91.0))
    assert a["bottleneck"] == "thermal_throttling"
    assert any("hw_thermal_slowdown in 100% of samples" in e for e in a["evidence"])
    assert any("temperature p95 91 C" in e for e in a["evidence"])
    assert any("cooling" in x for x in a["advice"])


def test_power_cap_is_power_throttling() -> None:
    a = run(recorded([96] * 5, reasons=["sw_power_cap"]))
    assert a["bottleneck"] == "power_throttling"
    assert any("power limit" in x for x in a["advice"])


def test_rare_throttle_reason_is_not_the_bottleneck() -> None:
    samples = recorded([96] * 10)
    samples[0]["gpus"][0]["throttle_reasons"] = ["sw_power_cap"]  # 10% < THROTTLE_FRACTION
    assert run(samples)["bottleneck"] == "healthy"


def test_high_util_is_healthy() -> None:
    a = run(recorded([97, 98, 99, 96], mem_percent=70.0))
    assert a["bottleneck"] == "healthy"
    assert a["advice"] == ["nothing to change: the GPU is kept busy"]


def test_zero_util_is_idle() -> None:
    assert run(recorded([0, 0, 1, 0]))["bottleneck"] == "idle"


def test_worst_gpu_wins_and_others_are_listed() -> None:
    samples = recorded([97, 98, 99, 96])
    for s in samples:
        s["gpus"].append(dict(s["gpus"][0], index=1, gpu_util=0.0))
    a = assess(compute_stats(samples, [0, 1]), RunFacts())
    assert a["bottleneck"] == "healthy"
    assert [f["bottleneck"] for f in a["per_gpu"]] == ["healthy", "idle"]
    assert "GPU 1: idle" in a["evidence"]


def test_no_gpu_reports_cpu_and_reason() -> None:
    samples = [dict(s, gpus=[]) for s in recorded([0, 0])]
    a = assess(compute_stats(samples, []), RunFacts(), "NVML Shared Library Not Found")
    assert a["bottleneck"] == "no_gpu"
    assert a["evidence"][0] == "no NVIDIA GPU found (NVML Shared Library Not Found)"


# --- start-up, active phase and tail ------------------------------------------------------


def test_startup_and_tail_are_split_off() -> None:
    utils = [0, 0, 50, 0, 0, 90, 95, 30, 97, 96, 0, 0, 0]  # one blip during start-up
    phases = split_phases(recorded(utils), [0])
    assert phases["active"] is True
    assert (phases["start_t"], phases["end_t"], phases["n"]) == (6.0, 10.0, 5)
    assert phases["startup_s"] == 5.0  # the GPU got work after the 5th sample
    assert phases["tail_s"] == 3.0
    assert utils[5] >= ACTIVE_UTIL > utils[4]


def test_busy_from_the_first_sample_has_no_startup() -> None:
    phases = split_phases(recorded([90, 95, 97]), [0])
    assert (phases["startup_s"], phases["tail_s"], phases["n"]) == (0.0, 0.0, 3)


def test_never_busy_and_unknown_utilization() -> None:
    assert split_phases(recorded([0, 40, 0, 35, 0]), [0])["active"] is False  # no 2 in a row
    samples = recorded([0, 0])
    for s in samples:
        s["gpus"][0]["gpu_util"] = None
    assert split_phases(samples, [0]) is None


def test_phases_cover_the_busiest_gpu() -> None:
    samples = recorded([0, 0, 0, 0])
    for s, u in zip(samples, [0, 0, 80, 90], strict=True):
        s["gpus"].append(dict(s["gpus"][0], index=1, gpu_util=float(u)))
    assert split_phases(samples, [0, 1])["startup_s"] == 2.0
    assert split_phases(samples, [0])["active"] is False


# --- run metrics: data-wait and MFU ---------------------------------------------------------


def test_pass_metrics_advice_only_without_run_metrics() -> None:
    samples = recorded([60, 62, 58, 61], mem_percent=70.0)
    without = run(samples)
    assert without["bottleneck"] == "underutilized"
    assert mentions(without["advice"], "--metrics")
    read = run(samples, data_wait=0.01)
    assert read["bottleneck"] == "underutilized"
    assert not mentions(read["advice"], "--metrics")
    assert not mentions(read["advice"], "dataloader_num_workers")  # the pipeline keeps up
    given = run(samples, metrics_given=True)  # file given, no data-wait in it yet
    assert not mentions(given["advice"], "--metrics")
    assert mentions(given["evidence"], "none in the run's metrics file")


def test_busy_gpu_at_low_mfu_is_gpu_bound() -> None:
    a = run(recorded([97, 98, 99, 96], mem_percent=88.0), data_wait=0.002, mfu=0.08)
    assert a["bottleneck"] == "gpu_bound"
    assert a["summary"].startswith("GPU busy, input pipeline keeps up; model compute is the limit")
    assert "MFU 8.0%" in a["summary"]
    assert mentions(a["evidence"], "data-wait fraction 0.002 of step time")
    assert mentions(a["evidence"], "little room for a bigger batch")
    for advice in ("liger-kernel", "flash-attn-4", "target_modules", "gradient_checkpointing"):
        assert mentions(a["advice"], advice)
    assert not mentions(a["advice"], "batch_size")  # memory is 88% used


def test_a_runs_figures_after_its_first_window_are_read_first() -> None:
    """The recorded H100 run's data-wait was 0.44% with its first window (start-up) and
    0.17% without: the verdict reads the run as it ran, its start-up aside."""
    from expert_cli.benchmark.metrics import data_wait_fraction, run_mfu

    summary = {"data_wait_fraction": 0.0044, "mfu": 0.078}
    steady = {**summary, "steady": {"data_wait_fraction": 0.0017, "mfu": 0.08}}
    assert data_wait_fraction({"summary": steady, "windows": []}) == 0.0017
    assert run_mfu({"summary": steady, "windows": []}, None) == 0.08
    hand_edited = {**summary, "steady": "fast"}
    assert data_wait_fraction({"summary": hand_edited, "windows": []}) == 0.0044


def test_allocator_flushes_of_the_run_are_evidence() -> None:
    """A run at its memory limit: the allocator's cache flushes (each a GPU stall) that the
    run's metrics count are named beside its data-wait and MFU; none, nothing said."""
    from expert_cli.benchmark.metrics import allocator_flushes

    metrics = {"windows": [{"allocator_flushes": 2}, {"allocator_flushes": 1}, {}]}
    assert allocator_flushes(metrics) == 3
    assert allocator_flushes({"summary": {"allocator_flushes": 7}, "windows": []}) == 7
    assert allocator_flushes({"windows": [{"allocator_flushes": "many"}]}) is None
    assert allocator_flushes(None) is None
    samples = recorded([97, 98, 99, 96], mem_percent=97.0)
    flushed = assess(compute_stats(samples, [0]), RunFacts.of(0.002, 0.08, flushes=3))
    assert mentions(flushed["evidence"], "the CUDA allocator freed its cache 3 time(s)")
    clean = assess(compute_stats(samples, [0]), RunFacts.of(0.002, 0.08, flushes=0))
    assert not mentions(clean["evidence"], "allocator")


def test_gpu_bound_with_free_memory_suggests_a_bigger_batch() -> None:
    a = run(recorded([97, 98, 99, 96], mem_percent=40.0), data_wait=0.01)
    assert a["bottleneck"] == "gpu_bound"  # data-wait known and low, MFU unknown
    assert "MFU" not in a["summary"]
    assert a["advice"][0].startswith(
        "raise training.config.batch_size, or set it to auto (memory used p95 40%"
    )


def test_a_busy_gpu_at_low_mfu_is_never_healthy_whatever_the_wait() -> None:
    """Utilization 95 %, MFU 8 %, the loader's wait a quarter of the time: it said "healthy:
    nothing to change". The wait is the host's fetch time, overlapping queued GPU work."""
    a = run(recorded([95, 96, 94, 95], mem_percent=60.0), data_wait=0.25, mfu=0.08)
    assert a["bottleneck"] == "gpu_bound"


def test_busy_gpu_at_good_mfu_is_healthy() -> None:
    a = run(recorded([97, 98, 99, 96]), data_wait=0.01, mfu=0.45)
    assert a["bottleneck"] == "healthy"
    assert mentions(a["evidence"], "MFU 45.0%")


def test_busy_p50_with_low_data_wait_is_busy_despite_the_mean() -> None:
    utils = [100, 100, 100, 30, 100, 100, 100, 10, 100, 100]  # mean 84, p50 100
    assert run(recorded(utils, mem_percent=70.0), data_wait=0.01)["bottleneck"] == "gpu_bound"
    assert run(recorded(utils, mem_percent=70.0))["bottleneck"] == "underutilized"


# --- periodic dips ------------------------------------------------------------------------


def test_dip_pattern_by_hand() -> None:
    utils = [100, 100, 100, 100, 60] * 6
    p = dip_pattern([float(t) for t in range(30)], utils)
    assert p == {"below": 80.0, "fraction": 0.2, "dips": 6, "every_s": 5.0, "regular": True}
    irregular = [100, 60, 100, 100, 100, 100, 100, 100, 100, 100, 100, 60, 60, 100, 60, 100]
    assert dip_pattern([float(t) for t in range(16)], irregular)["regular"] is False


def test_regular_dips_with_low_data_wait_are_noted() -> None:
    samples = recorded([100, 100, 100, 100, 60] * 6, mem_percent=88.0)
    a = run(samples, data_wait=0.003, mfu=0.08)
    assert a["bottleneck"] == "gpu_bound"
    assert mentions(a["evidence"], "bursty: utilization dips below 80% about every 5 s")
    assert mentions(a["advice"], "logging_steps")
    assert not mentions(run(samples, mfu=0.08)["evidence"], "bursty")  # data-wait unknown


# --- the recorded H100 training run ---------------------------------------------------------


def h100_assessment() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Phases, active-phase stats and assessment of the committed H100 benchmark of
    `expert-cli train` (Qwen3-0.6B LoRA, 250 steps), from its samples and run metrics."""
    report = json.loads(H100_REPORT.read_text())
    samples = [{"t": s["t"], "host": s["host"], "gpus": s["gpus"]} for s in report["samples"]]
    summary = report["run_metrics"]["summary"]
    phases = split_phases(samples, [0])
    active = compute_stats(samples[phases["first"] : phases["last"] + 1], [0])
    facts = RunFacts.of(summary["data_wait_fraction"], summary["mfu"])
    a = assess(active, facts, phases=phases)
    return phases, active, a


def test_recorded_h100_training_run_is_gpu_bound_after_startup() -> None:
    phases, active, a = h100_assessment()
    assert 50 <= phases["startup_s"] <= 65  # imports, tokenizer, random init, cache check
    assert phases["tail_s"] == 0.0  # stopped at --duration while still training
    assert active["gpus"]["0"]["gpu_util"]["p50"] == 100.0
    assert active["gpus"]["0"]["gpu_util"]["mean"] >= 85.0
    assert a["bottleneck"] == "gpu_bound"
    assert "MFU 7.8%" in a["summary"]
    assert a["evidence"][0].startswith("start-up: 58 s before the GPU got work")
    assert mentions(a["evidence"], "bursty: utilization dips")
    assert not mentions(a["advice"], "--metrics")
    assert not mentions(a["advice"], "dataloader_num_workers")
    assert not mentions(a["advice"], "raise training.config.batch_size")  # memory p95 88%
    assert mentions(a["advice"], "liger-kernel") and mentions(a["advice"], "flash-attn")
