"""Statistics over benchmark samples (per GPU and host), periodic utilization dips, and the
start-up / active / tail phases of a run.

Pure functions over plain dicts (the report's own sample format).
"""

from __future__ import annotations

import math
from typing import Any

DIP_UTIL = 20.0  # a sample below this is a dip in utilization
# Phases of a command's run: start-up, active phase, trailing tail.
ACTIVE_UTIL = 20.0  # a sample where some GPU is at or above this shows the GPU has work ...
ACTIVE_RUN = 2  # ... and this many such samples in a row mark sustained activity
# Periodic dips within busy utilization (stalls at a regular interval).
PERIODIC_DIP_DEPTH = 20.0  # a sample this many points below the p50 is a dip ...
PERIODIC_DIP_FRACTION = 0.1  # ... periodic: at least this fraction of samples are dips ...
PERIODIC_MIN_DIPS = 4  # ... in at least this many separate dips ...
PERIODIC_GAP_SPREAD = 0.5  # ... whose gaps deviate from their median by at most this share

GPU_METRICS = (
    "gpu_util",
    "mem_util",
    "mem_used_percent",
    "mem_used_mb",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
)


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
        "mean": sum(known) / len(known),
        "min": known[0],
        "max": known[-1],
        "p50": percentile(known, 50),
        "p95": percentile(known, 95),
        "n": len(known),
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


def dip_pattern(times: list[float], utils: list[float | None]) -> dict[str, Any] | None:
    """Dips of PERIODIC_DIP_DEPTH points below the p50: their share of samples, the median
    gap between the starts of separate dips, and whether they recur regularly."""
    known = sorted(u for u in utils if u is not None)
    if not known:
        return None
    below = percentile(known, 50) - PERIODIC_DIP_DEPTH
    starts, previous = [], False
    for t, u in zip(times, utils, strict=True):
        dip = u is not None and u < below
        if dip and not previous:
            starts.append(t)
        previous = dip
    fraction = sum(u < below for u in known) / len(known)
    gaps = sorted(b - a for a, b in zip(starts, starts[1:], strict=False))
    every = percentile(gaps, 50) if gaps else None
    spread = percentile(sorted(abs(g - every) for g in gaps), 50) if gaps else None
    regular = (
        len(starts) >= PERIODIC_MIN_DIPS
        and fraction >= PERIODIC_DIP_FRACTION
        and every is not None
        and spread <= PERIODIC_GAP_SPREAD * every
    )
    return {
        "below": below,
        "fraction": fraction,
        "dips": len(starts),
        "every_s": every,
        "regular": regular,
    }


def gpu_stats(samples: list[dict[str, Any]], index: int) -> dict[str, Any]:
    """Statistics of one GPU over the samples, with throttle-reason and dip fractions and the
    pattern of dips below its p50."""
    rows = [g for s in samples for g in s["gpus"] if g["index"] == index]
    out: dict[str, Any] = {m: summarize([r.get(m) for r in rows]) for m in GPU_METRICS}
    utils = [r["gpu_util"] for r in rows if r.get("gpu_util") is not None]
    out["util_dip_fraction"] = (sum(u < DIP_UTIL for u in utils) / len(utils)) if utils else None
    timed = [(s["t"], g.get("gpu_util")) for s in samples for g in s["gpus"] if g["index"] == index]
    out["util_dips"] = dip_pattern([t for t, _ in timed], [u for _, u in timed])
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


def split_phases(samples: list[dict[str, Any]], gpu_indices: list[int]) -> dict[str, Any] | None:
    """Start-up, active phase and trailing tail of a command's run.

    The active phase runs from the first to the last sample of sustained activity (some GPU
    at or above ACTIVE_UTIL in ACTIVE_RUN samples in a row); before it the command started up
    (imports, loading, caches), after it it shut down or saved. None when no GPU reports
    utilization; `active` is False when the GPU never got sustained work.
    """
    busiest = [
        max(
            (
                g["gpu_util"]
                for g in s["gpus"]
                if g["index"] in gpu_indices and g.get("gpu_util") is not None
            ),
            default=None,
        )
        for s in samples
    ]
    if all(u is None for u in busiest):
        return None
    hot = [u is not None and u >= ACTIVE_UTIL for u in busiest]
    runs = [i for i in range(len(hot) - ACTIVE_RUN + 1) if all(hot[i : i + ACTIVE_RUN])]
    if not runs:
        return {
            "active": False,
            "startup_s": None,
            "tail_s": None,
            "first": None,
            "last": None,
            "start_t": None,
            "end_t": None,
            "n": 0,
        }
    first, last = runs[0], runs[-1] + ACTIVE_RUN - 1
    return {
        "active": True,
        "startup_s": samples[first - 1]["t"] if first else 0.0,
        "tail_s": samples[-1]["t"] - samples[last]["t"],
        "first": first,
        "last": last,
        "start_t": samples[first]["t"],
        "end_t": samples[last]["t"],
        "n": last - first + 1,
    }


def phase_line(phases: dict[str, Any]) -> str:
    """One line on the start-up and the active phase, for the console and the evidence."""
    if not phases["active"]:
        return (
            f"the GPU never got sustained work (utilization >= {ACTIVE_UTIL:.0f}% in "
            f"{ACTIVE_RUN} samples in a row): assessed over the whole run"
        )
    tail = f", tail {phases['tail_s']:.0f} s after it" if phases["tail_s"] else ""
    return (
        f"start-up: {phases['startup_s']:.0f} s before the GPU got work; active phase "
        f"{phases['start_t']:.0f}-{phases['end_t']:.0f} s ({phases['n']} samples){tail}"
    )
