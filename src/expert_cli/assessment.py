"""Statistics over benchmark samples, and the assessment: which bottleneck, on what evidence,
and what to change in the manifest.

Pure functions over plain dicts (the report's own sample format), so tests can feed them
recorded sequences.
"""

from __future__ import annotations

import math
from typing import Any

# Thresholds, in percent unless named otherwise.
HEALTHY_UTIL = 85.0  # mean GPU utilization at or above which the GPU is kept busy
LOW_UTIL = 50.0  # mean GPU utilization below which the GPU is starved
IDLE_UTIL = 5.0  # mean GPU utilization below which nothing is running on it
DIP_UTIL = 20.0  # a sample below this is a dip in utilization
BURSTY_DIP_FRACTION = 0.2  # bursty: at least this fraction of samples are dips ...
BURSTY_PEAK_UTIL = 70.0  # ... while the p95 reaches this
MEMORY_PRESSURE = 95.0  # p95 of GPU memory used at or above this is near-full
LOW_MEMORY = 50.0  # p95 of GPU memory used below this leaves room for bigger batches
DATA_WAIT_HIGH = 0.2  # fraction of step time spent waiting for the next batch
BUSY_CORE = 90.0  # p50 of the busiest core at or above this: one core saturated
BUSY_CPU = 80.0  # p50 of the mean over all cores at or above this: CPU saturated
THROTTLE_FRACTION = 0.2  # fraction of samples with a thermal or power throttle reason
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown")
POWER_REASONS = ("sw_power_cap", "hw_power_brake_slowdown")

GPU_METRICS = ("gpu_util", "mem_util", "mem_used_percent", "mem_used_mb", "temperature_c",
               "power_w", "sm_clock_mhz")

ADVICE: dict[str, list[str]] = {
    "data_loading": [
        "raise training.config.dataloader_num_workers (e.g. to the number of free cores)",
        "pretokenize once with `expert-cli pretokenize --manifest M` (pretokenized_cache)",
        "enable training.config.packing so rows are full and there is no padding",
        "set dataloader_pin_memory true and dataloader_persistent_workers true",
    ],
    "small_batches": [
        "raise training.config.batch_size (and lower gradient_accumulation_steps to match)",
        "enable training.config.packing, or raise max_seq_length, for more tokens per step",
        "try torch_compile or use_cuda_graphs to cut per-kernel launch overhead",
    ],
    "memory_pressure": [
        "lower training.config.batch_size and raise gradient_accumulation_steps to match",
        "enable training.config.gradient_checkpointing",
        "lower training.config.max_seq_length, or use 4-bit base weights (QLoRA)",
    ],
    "thermal_throttling": [
        "improve cooling (airflow, fan curve, ambient temperature); clocks drop when hot",
        "check `nvidia-smi -q -d PERFORMANCE,TEMPERATURE` while training",
    ],
    "power_throttling": [
        "the GPU is at its power limit: raise it toward the default with "
        "`nvidia-smi -pl WATTS` if it was lowered, or accept it as the ceiling",
    ],
    "healthy": ["nothing to change: the GPU is kept busy"],
    "idle": ["nothing ran on the GPU: benchmark while training (`-- expert-cli train ...`) "
             "or with `--workload qwen3-0.6b-lora`"],
    "underutilized": [
        "pass the run's metrics (--metrics DIR/metrics.json) to see the data-wait fraction",
        "try raising training.config.batch_size and dataloader_num_workers",
    ],
    "no_gpu": ["run on a machine with an NVIDIA GPU and driver to benchmark the GPU"],
    "undetermined": ["sample on a GPU whose driver reports utilization (nvidia-smi)"],
}


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of already sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: list[float | None]) -> dict[str, float] | None:
    """mean/min/max/p50/p95 of the known values, or None when there are none."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    return {
        "mean": sum(known) / len(known), "min": known[0], "max": known[-1],
        "p50": percentile(known, 50), "p95": percentile(known, 95), "n": len(known),
    }


def host_stats(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Statistics of the host metrics over all samples."""
    hosts = [s["host"] for s in samples]
    cores = [h["cpu_percent"] for h in hosts]
    return {
        "cpu_percent": summarize([sum(c) / len(c) if c else None for c in cores]),
        "cpu_busiest_core_percent": summarize([max(c) if c else None for c in cores]),
        "ram_percent": summarize([h["ram_percent"] for h in hosts]),
        "ram_used_gb": summarize([h["ram_used_gb"] for h in hosts]),
        "process_cpu_percent": summarize([h.get("process_cpu_percent") for h in hosts]),
    }


def gpu_stats(samples: list[dict[str, Any]], index: int) -> dict[str, Any]:
    """Statistics of one GPU over all samples, with throttle-reason and dip fractions."""
    rows = [g for s in samples for g in s["gpus"] if g["index"] == index]
    out: dict[str, Any] = {m: summarize([r.get(m) for r in rows]) for m in GPU_METRICS}
    utils = [r["gpu_util"] for r in rows if r.get("gpu_util") is not None]
    out["util_dip_fraction"] = (sum(u < DIP_UTIL for u in utils) / len(utils)) if utils else None
    reasons: dict[str, float] = {}
    for r in rows:
        for name in r.get("throttle_reasons", []):
            reasons[name] = reasons.get(name, 0) + 1
    out["throttle_fraction"] = {k: v / len(rows) for k, v in sorted(reasons.items())}
    out["mem_total_mb"] = rows[0].get("mem_total_mb") if rows else None
    return out


def compute_stats(samples: list[dict[str, Any]], gpu_indices: list[int]) -> dict[str, Any]:
    """Host statistics and per-GPU statistics, keyed by GPU index as a string (JSON keys)."""
    return {
        "host": host_stats(samples),
        "gpus": {str(i): gpu_stats(samples, i) for i in gpu_indices},
    }


def _stat(stats: dict[str, Any], metric: str, key: str) -> float | None:
    entry = stats.get(metric)
    return None if entry is None else entry[key]


def _fmt(value: float | None, unit: str = "%") -> str:
    return "n/a" if value is None else f"{value:.0f}{unit}"


SUMMARY: dict[str, str] = {
    "thermal_throttling": "thermal throttling: the GPU lowers its clocks because it is hot",
    "power_throttling": "power throttling: the GPU is held at its power limit",
    "memory_pressure": "memory pressure: GPU memory is nearly full while utilization is low",
    "data_loading": "data loading: the GPU waits for batches the CPU cannot prepare fast enough",
    "small_batches": "small batches / launch overhead: the GPU is partly busy with memory and "
                     "CPU to spare",
    "underutilized": "under-utilized GPU, cause not determined from these samples",
    "healthy": "healthy: the GPU is kept busy",
    "idle": "idle: nothing ran on the GPU",
    "undetermined": "undetermined: the GPU does not report utilization",
    "no_gpu": "no NVIDIA GPU: CPU and RAM only",
}
PRIORITY = ["thermal_throttling", "power_throttling", "memory_pressure", "data_loading",
            "small_batches", "underutilized", "healthy", "idle", "undetermined"]


def _throttle(g: dict[str, Any], reasons: tuple[str, ...]) -> tuple[float, list[str]]:
    """Largest fraction of samples with one of `reasons`, and those seen."""
    seen = {r: f for r, f in g["throttle_fraction"].items() if r in reasons}
    return max(seen.values(), default=0.0), [f"{r} in {f:.0%} of samples" for r, f in seen.items()]


def _host_evidence(host: dict[str, Any], data_wait: float | None) -> tuple[bool, list[str]]:
    """Whether the CPU looks saturated, and the lines that say so (or not)."""
    cpu_p50 = _stat(host, "cpu_percent", "p50")
    core_p50 = _stat(host, "cpu_busiest_core_percent", "p50")
    busy = (cpu_p50 or 0) >= BUSY_CPU or (core_p50 or 0) >= BUSY_CORE
    lines = [f"CPU p50 {_fmt(cpu_p50)} over all cores, busiest core p50 {_fmt(core_p50)}"]
    proc = _stat(host, "process_cpu_percent", "mean")
    if proc is not None:
        lines.append(f"command's process tree CPU mean {_fmt(proc)} (100% = one core)")
    if data_wait is None:
        lines.append("data-wait fraction unknown (no run metrics; pass --metrics)")
    else:
        lines.append(f"data-wait fraction {data_wait:.2f} of step time (run metrics)")
    return busy, lines


def assess_gpu(
    index: int, g: dict[str, Any], host: dict[str, Any], data_wait: float | None
) -> dict[str, Any]:
    """The bottleneck of one GPU, with the evidence lines behind it."""
    util, util_p50, util_p95 = (_stat(g, "gpu_util", k) for k in ("mean", "p50", "p95"))
    mem_p95 = _stat(g, "mem_used_percent", "p95")
    dips = g.get("util_dip_fraction") or 0.0
    cpu_busy, host_lines = _host_evidence(host, data_wait)
    evidence = [
        f"GPU {index} utilization mean {_fmt(util)} (p50 {_fmt(util_p50)}, p95 "
        f"{_fmt(util_p95)}, below {DIP_UTIL:.0f}% in {dips:.0%} of samples)",
        f"GPU {index} memory used p95 {_fmt(mem_p95)} of total",
    ]
    thermal, thermal_lines = _throttle(g, THERMAL_REASONS)
    power, power_lines = _throttle(g, POWER_REASONS)
    bursty = dips >= BURSTY_DIP_FRACTION and (util_p95 or 0) >= BURSTY_PEAK_UTIL
    waiting = data_wait is not None and data_wait >= DATA_WAIT_HIGH
    if thermal >= THROTTLE_FRACTION:
        name = "thermal_throttling"
        evidence += thermal_lines + [
            f"temperature p95 {_fmt(_stat(g, 'temperature_c', 'p95'), ' C')}, SM clock p50 "
            f"{_fmt(_stat(g, 'sm_clock_mhz', 'p50'), ' MHz')}"]
    elif power >= THROTTLE_FRACTION:
        name = "power_throttling"
        evidence += power_lines + [f"power p95 {_fmt(_stat(g, 'power_w', 'p95'), ' W')}"]
    elif util is None:
        name = "undetermined"
    elif mem_p95 is not None and mem_p95 >= MEMORY_PRESSURE and util < HEALTHY_UTIL:
        name = "memory_pressure"
    elif util >= HEALTHY_UTIL:
        name = "healthy"
        if mem_p95 is not None and mem_p95 >= MEMORY_PRESSURE:
            evidence.append("memory is nearly full: a longer row or bigger batch may not fit")
    elif waiting or ((util < LOW_UTIL or bursty) and cpu_busy):
        name = "data_loading"
        evidence += host_lines + (["utilization is bursty"] if bursty else [])
    elif util < IDLE_UTIL:
        name = "idle"
    elif (mem_p95 or 0) < LOW_MEMORY and not cpu_busy:
        name = "small_batches"
        evidence += host_lines
    else:
        name = "underutilized"
        evidence += host_lines
    return {"gpu": index, "bottleneck": name, "evidence": evidence}


def assess(
    stats: dict[str, Any], data_wait: float | None, no_gpu_reason: str | None = None
) -> dict[str, Any]:
    """The overall assessment: the most severe per-GPU bottleneck, its evidence and advice."""
    host = stats["host"]
    if no_gpu_reason is not None:
        _, lines = _host_evidence(host, data_wait)
        ram = _stat(host, "ram_percent", "p95")
        evidence = [f"no NVIDIA GPU found ({no_gpu_reason})", *lines, f"RAM p95 {_fmt(ram)}"]
        return {"bottleneck": "no_gpu", "summary": SUMMARY["no_gpu"], "evidence": evidence,
                "advice": ADVICE["no_gpu"], "per_gpu": []}
    per_gpu = [assess_gpu(int(i), g, host, data_wait) for i, g in stats["gpus"].items()]
    worst = min(per_gpu, key=lambda f: PRIORITY.index(f["bottleneck"]))
    evidence = list(worst["evidence"])
    for other in per_gpu:
        if other is not worst:
            evidence.append(f"GPU {other['gpu']}: {other['bottleneck']}")
    name = worst["bottleneck"]
    return {"bottleneck": name, "summary": SUMMARY[name], "evidence": evidence,
            "advice": ADVICE.get(name, []), "per_gpu": per_gpu}
