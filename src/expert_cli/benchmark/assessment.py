"""The assessment of a benchmark: which bottleneck, on what evidence, and what to change in
the manifest (statistics and phases are in stats.py).

Pure functions over plain dicts (the report's own sample format), so tests can feed them
recorded sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from expert_cli.benchmark.stats import DIP_UTIL, phase_line

# Thresholds, in percent unless named otherwise.
HEALTHY_UTIL = 85.0  # mean GPU utilization at or above which the GPU is kept busy
LOW_UTIL = 50.0  # mean GPU utilization below which the GPU is starved
IDLE_UTIL = 5.0  # mean GPU utilization below which nothing is running on it
BURSTY_DIP_FRACTION = 0.2  # bursty: at least this fraction of samples are dips ...
BURSTY_PEAK_UTIL = 70.0  # ... while the p95 reaches this
MEMORY_PRESSURE = 95.0  # p95 of GPU memory used at or above this is near-full
LOW_MEMORY = 50.0  # p95 of GPU memory used below this leaves room for bigger batches
BATCH_ROOM_MEMORY = 70.0  # p95 of GPU memory used below this: a bigger batch should still fit
DATA_WAIT_HIGH = 0.2  # fraction of step time spent waiting for the next batch
DATA_WAIT_LOW = 0.05  # data-wait below this: the input pipeline keeps up
LOW_MFU = 0.30  # MFU (fraction of the GPU's bf16 peak) below this: kernels far below peak
BUSY_CORE = 90.0  # p50 of the busiest core at or above this: one core saturated
BUSY_CPU = 80.0  # p50 of the mean over all cores at or above this: CPU saturated
THROTTLE_FRACTION = 0.2  # fraction of samples with a thermal or power throttle reason
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown")
POWER_REASONS = ("sw_power_cap", "hw_power_brake_slowdown")

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
        "let batch_size be auto (the default on a GPU): the micro-batch grows to what the "
        "GPU's memory holds, accumulation keeps the step",
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
    "gpu_bound": [
        "install the fast-path extras (`pip install 'expert-cli[gpu]'`: liger-kernel for "
        "fused RMSNorm/SwiGLU/RoPE and the fused loss; flash-attn-4 on Hopper/Blackwell)",
        "leave training.config.attention, fused_loss and adapter_precision unset: the "
        "defaults are the fastest measured (docs/PERFORMANCE.md)",
        "adapt fewer modules (training.config.target_modules, e.g. the attention projections "
        "instead of all-linear): every adapted layer adds small matmuls that run far below "
        "peak",
        "turn training.config.gradient_checkpointing off if it is on (it recomputes the "
        "forward pass), memory allowing",
    ],
    "healthy": ["nothing to change: the GPU is kept busy"],
    "idle": [
        "nothing ran on the GPU: benchmark while training (`-- expert-cli train ...`) "
        "or with `--workload qwen3-0.6b-lora`"
    ],
    "underutilized": ["try raising training.config.batch_size and dataloader_num_workers"],
    "no_gpu": ["run on a machine with an NVIDIA GPU and driver to benchmark the GPU"],
    "undetermined": ["sample on a GPU whose driver reports utilization (nvidia-smi)"],
}
PASS_METRICS = "pass the run's metrics (--metrics DIR/metrics.json) to see the data-wait fraction"
RAISE_BATCH = (
    "raise training.config.batch_size, or set it to auto (memory used p95 "
    "{mem:.0f}% leaves room): bigger matmuls run closer to peak"
)
PERIODIC_STALLS = (
    "find the stall that recurs about every {every:.0f} s: logging (loss to the "
    "host), evaluation or checkpoint saves; raise training.config.logging_steps, "
    "eval_steps or save_steps"
)


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
    "gpu_bound": "GPU busy, input pipeline keeps up; model compute is the limit",
    "healthy": "healthy: the GPU is kept busy",
    "idle": "idle: nothing ran on the GPU",
    "undetermined": "undetermined: the GPU does not report utilization",
    "no_gpu": "no NVIDIA GPU: CPU and RAM only",
}
PRIORITY = [
    "thermal_throttling",
    "power_throttling",
    "memory_pressure",
    "data_loading",
    "small_batches",
    "underutilized",
    "gpu_bound",
    "healthy",
    "idle",
    "undetermined",
]


@dataclass(frozen=True)
class RunFacts:
    """What the training run's own metrics (or the workload) say."""

    data_wait: float | None = None
    mfu: float | None = None
    metrics_given: bool = False  # a metrics file was given or found (even one without figures)
    flushes: int | None = None  # the CUDA allocator's cache flushes in the run

    @classmethod
    def of(
        cls,
        data_wait: float | None = None,
        mfu: float | None = None,
        metrics_given: bool = False,
        flushes: int | None = None,
    ) -> RunFacts:
        """The facts, with a known data-wait counting as metrics given."""
        return cls(data_wait, mfu, metrics_given or data_wait is not None, flushes)

    @property
    def waiting(self) -> bool:
        """The step waits for batches a large share of the time."""
        return self.data_wait is not None and self.data_wait >= DATA_WAIT_HIGH

    @property
    def keeps_up(self) -> bool:
        """The input pipeline keeps up: data-wait known and low."""
        return self.data_wait is not None and self.data_wait < DATA_WAIT_LOW

    def lines(self) -> list[str]:
        """Evidence lines for data-wait and MFU."""
        if self.data_wait is not None:
            digits = 2 if self.data_wait >= 0.01 else 3
            wait = f"data-wait fraction {self.data_wait:.{digits}f} of step time (run metrics)"
        elif self.metrics_given:
            wait = "data-wait fraction unknown (none in the run's metrics file yet)"
        else:
            wait = "data-wait fraction unknown (no run metrics; pass --metrics)"
        mfu = [] if self.mfu is None else [f"MFU {self.mfu:.1%} of the GPU's bf16 peak"]
        flushes = (
            [
                f"the CUDA allocator freed its cache {self.flushes} time(s) to retry an "
                "allocation (memory at its limit), a stall of the GPU each (run metrics)"
            ]
            if self.flushes
            else []
        )
        return [wait, *mfu, *flushes]


def _throttle(g: dict[str, Any], reasons: tuple[str, ...]) -> tuple[float, list[str]]:
    """Largest fraction of samples with one of `reasons`, and those seen."""
    seen = {r: f for r, f in g["throttle_fraction"].items() if r in reasons}
    return max(seen.values(), default=0.0), [f"{r} in {f:.0%} of samples" for r, f in seen.items()]


def _host_evidence(host: dict[str, Any], run: RunFacts) -> tuple[bool, list[str]]:
    """Whether the CPU looks saturated, and the lines that say so (or not)."""
    cpu_p50 = _stat(host, "cpu_percent", "p50")
    core_p50 = _stat(host, "cpu_busiest_core_percent", "p50")
    busy = (cpu_p50 or 0) >= BUSY_CPU or (core_p50 or 0) >= BUSY_CORE
    lines = [f"CPU p50 {_fmt(cpu_p50)} over all cores, busiest core p50 {_fmt(core_p50)}"]
    proc = _stat(host, "process_cpu_percent", "mean")
    if proc is not None:
        lines.append(f"command's process tree CPU mean {_fmt(proc)} (100% = one core)")
    return busy, lines + run.lines()[:1]


def classify(g: dict[str, Any], run: RunFacts, cpu_busy: bool) -> str:
    """The bottleneck of one GPU from its statistics, the run's facts and the CPU."""
    util, util_p50 = _stat(g, "gpu_util", "mean"), _stat(g, "gpu_util", "p50")
    mem_p95 = _stat(g, "mem_used_percent", "p95")
    dips = g.get("util_dip_fraction") or 0.0
    bursty = dips >= BURSTY_DIP_FRACTION and (_stat(g, "gpu_util", "p95") or 0) >= BURSTY_PEAK_UTIL
    if _throttle(g, THERMAL_REASONS)[0] >= THROTTLE_FRACTION:
        return "thermal_throttling"
    if _throttle(g, POWER_REASONS)[0] >= THROTTLE_FRACTION:
        return "power_throttling"
    if util is None:
        return "undetermined"
    if mem_p95 is not None and mem_p95 >= MEMORY_PRESSURE and util < HEALTHY_UTIL:
        return "memory_pressure"
    if util >= HEALTHY_UTIL or ((util_p50 or 0) >= HEALTHY_UTIL and run.keeps_up):
        # a known MFU under LOW_MFU is never healthy, whatever the loader's wait (the host's
        # fetch time overlaps queued GPU work: with the GPU this busy it starves nothing)
        limited = run.keeps_up if run.mfu is None else run.mfu < LOW_MFU
        return "gpu_bound" if limited else "healthy"
    if run.waiting or ((util < LOW_UTIL or bursty) and cpu_busy):
        return "data_loading"
    if util < IDLE_UTIL:
        return "idle"
    if (mem_p95 or 0) < LOW_MEMORY and not cpu_busy:
        return "small_batches"
    return "underutilized"


def _periodic(g: dict[str, Any], run: RunFacts) -> dict[str, Any] | None:
    """The dip pattern when dips recur regularly while the input pipeline keeps up."""
    pattern = g.get("util_dips")
    return pattern if pattern and pattern["regular"] and run.keeps_up else None


def _advice(name: str, g: dict[str, Any], run: RunFacts) -> list[str]:
    """What to change for this bottleneck, given what is known about memory and the run."""
    advice = list(ADVICE.get(name, []))
    mem_p95 = _stat(g, "mem_used_percent", "p95")
    if name == "gpu_bound" and mem_p95 is not None and mem_p95 < BATCH_ROOM_MEMORY:
        advice.insert(0, RAISE_BATCH.format(mem=mem_p95))
    if name == "underutilized" and run.keeps_up:
        advice = [
            "the input pipeline keeps up: raise training.config.batch_size if memory "
            "allows, and look for stalls between steps (logging, evaluation, checkpoints)"
        ]
    if name == "underutilized" and not run.metrics_given:
        advice.insert(0, PASS_METRICS)
    periodic = _periodic(g, run)
    if periodic is not None and name in ("gpu_bound", "healthy", "underutilized"):
        advice.append(PERIODIC_STALLS.format(every=periodic["every_s"]))
    return advice


def assess_gpu(
    index: int, g: dict[str, Any], host: dict[str, Any], run: RunFacts
) -> dict[str, Any]:
    """The bottleneck of one GPU, with the evidence lines and the advice behind it."""
    util, util_p50, util_p95 = (_stat(g, "gpu_util", k) for k in ("mean", "p50", "p95"))
    mem_p95 = _stat(g, "mem_used_percent", "p95")
    dips = g.get("util_dip_fraction") or 0.0
    cpu_busy, host_lines = _host_evidence(host, run)
    name = classify(g, run, cpu_busy)
    evidence = [
        f"GPU {index} utilization mean {_fmt(util)} (p50 {_fmt(util_p50)}, p95 "
        f"{_fmt(util_p95)}, below {DIP_UTIL:.0f}% in {dips:.0%} of samples)",
        f"GPU {index} memory used p95 {_fmt(mem_p95)} of total",
    ]
    if name == "thermal_throttling":
        evidence += _throttle(g, THERMAL_REASONS)[1] + [
            f"temperature p95 {_fmt(_stat(g, 'temperature_c', 'p95'), ' C')}, SM clock p50 "
            f"{_fmt(_stat(g, 'sm_clock_mhz', 'p50'), ' MHz')}"
        ]
    elif name == "power_throttling":
        evidence += _throttle(g, POWER_REASONS)[1] + [
            f"power p95 {_fmt(_stat(g, 'power_w', 'p95'), ' W')}"
        ]
    elif name in ("gpu_bound", "healthy"):
        evidence += run.lines() if run.metrics_given or run.mfu is not None else []
        if mem_p95 is not None and mem_p95 >= BATCH_ROOM_MEMORY:
            evidence.append(f"memory used p95 {mem_p95:.0f}%: little room for a bigger batch")
    elif name == "data_loading":
        bursty = dips >= BURSTY_DIP_FRACTION
        evidence += host_lines + (["utilization is bursty"] if bursty else [])
    elif name in ("small_batches", "underutilized"):
        evidence += host_lines
    periodic = _periodic(g, run)
    if periodic is not None and name != "data_loading":
        evidence.append(
            f"bursty: utilization dips below {max(periodic['below'], 0):.0f}% about every "
            f"{periodic['every_s']:.0f} s ({periodic['fraction']:.0%} of samples) while data-wait "
            "is low: stalls outside the input pipeline (logging, host syncs, evaluation, "
            "checkpoint saves)"
        )
    return {"gpu": index, "bottleneck": name, "evidence": evidence, "advice": _advice(name, g, run)}


def assess(
    stats: dict[str, Any],
    run: RunFacts,
    no_gpu_reason: str | None = None,
    *,
    phases: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The overall assessment: the most severe per-GPU bottleneck, its evidence and advice.

    `stats` are those of the active phase when `phases` split the run; `run` what the run's
    own metrics say (`RunFacts.of`).
    """
    host = stats["host"]
    if no_gpu_reason is not None:
        _, lines = _host_evidence(host, run)
        ram = _stat(host, "ram_percent", "p95")
        evidence = [f"no NVIDIA GPU found ({no_gpu_reason})", *lines, f"RAM p95 {_fmt(ram)}"]
        return {
            "bottleneck": "no_gpu",
            "summary": SUMMARY["no_gpu"],
            "evidence": evidence,
            "advice": ADVICE["no_gpu"],
            "per_gpu": [],
        }
    per_gpu = [assess_gpu(int(i), g, host, run) for i, g in stats["gpus"].items()]
    worst = min(per_gpu, key=lambda f: PRIORITY.index(f["bottleneck"]))
    evidence = ([phase_line(phases)] if phases else []) + list(worst["evidence"])
    for other in per_gpu:
        if other is not worst:
            evidence.append(f"GPU {other['gpu']}: {other['bottleneck']}")
    name = worst["bottleneck"]
    summary = SUMMARY[name]
    if name == "gpu_bound" and run.mfu is not None:
        summary += f" (MFU {run.mfu:.1%}, far below peak)"
    return {
        "bottleneck": name,
        "summary": summary,
        "evidence": evidence,
        "advice": worst["advice"],
        "per_gpu": per_gpu,
    }
