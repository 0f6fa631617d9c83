"""Statistics and bottleneck assessment against recorded sample sequences."""

from __future__ import annotations

from typing import Any

import pytest

from expert_cli.assessment import assess, compute_stats, percentile, summarize
from expert_cli.telemetry.gpu import GpuSample, decode_throttle_reasons

MEM_TOTAL_MB = 81_559.0


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
        gpu = GpuSample(index=0, gpu_util=u, mem_util=u / 2, mem_used_mb=MEM_TOTAL_MB * m / 100,
                        mem_total_mb=MEM_TOTAL_MB, temperature_c=temp, power_w=300.0,
                        power_limit_w=700.0, sm_clock_mhz=1980.0,
                        throttle_reasons=list(reasons or []))
        host = {"cpu_percent": list(cores or [10.0, 5.0, 5.0, 5.0]), "ram_used_gb": 20.0,
                "ram_total_gb": 128.0, "ram_percent": 15.6, "process_cpu_percent": None}
        out.append({"t": float(i + 1), "host": host, "gpus": [gpu.to_dict()]})
    return out


def run(samples: list[dict[str, Any]], data_wait: float | None = None) -> dict[str, Any]:
    return assess(compute_stats(samples, [0]), data_wait)


def test_summarize_values_by_hand() -> None:
    s = summarize([5.0, 1.0, None, 3.0, 2.0, 4.0])
    assert s == {"mean": 3.0, "min": 1.0, "max": 5.0, "p50": 3.0, "p95": pytest.approx(4.8),
                 "n": 5}
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
    a = assess(compute_stats(samples, [0, 1]), None)
    assert a["bottleneck"] == "healthy"
    assert [f["bottleneck"] for f in a["per_gpu"]] == ["healthy", "idle"]
    assert "GPU 1: idle" in a["evidence"]


def test_no_gpu_reports_cpu_and_reason() -> None:
    samples = [dict(s, gpus=[]) for s in recorded([0, 0])]
    a = assess(compute_stats(samples, []), None, no_gpu_reason="NVML Shared Library Not Found")
    assert a["bottleneck"] == "no_gpu"
    assert a["evidence"][0] == "no NVIDIA GPU found (NVML Shared Library Not Found)"
