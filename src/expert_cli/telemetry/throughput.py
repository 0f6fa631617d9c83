"""Training throughput per logging window: tokens/s, samples/s, data wait, memory, MFU.

`ThroughputMeter` is fed by the trainer (batch fetch start/end with the batch's counts, step
end) and closes a window at every training log (expert_cli.train.callbacks drives it and
writes metrics.json).

Timing is honest without a GPU sync per step: a step is timed from the start of its batch
fetch to its end, and at a window's close the GPU is synchronized once and the time the GPU was
still busy is added to the window. Data wait is the time spent fetching batches (the Trainer
syncs on the loss every micro-step, so the GPU is idle while the CPU fetches).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from expert_cli.telemetry.flops import lora_train_flops_per_token, mfu

KIB_PER_GIB = 2**20
BYTES_PER_GIB = 2**30

# Per-window sums: real tokens, examples, trained tokens, sum of squared example lengths,
# seconds waiting for data, seconds of step time.
WINDOW_KEYS = ("tokens", "samples", "trained", "attended", "wait", "busy")

# all_reduce(values) -> the values summed over every training process.
Reducer = Callable[[list[float]], list[float]]


@dataclass(frozen=True)
class FlopsModel:
    """What the FLOPs count needs to know about the model, and the GPU's peak."""

    matmul_params: int
    trainable_params: int
    n_layers: int
    hidden: int
    attn_dim: int
    peak_flops_per_device: float | None

    def per_token(self, attended_len: float) -> float:
        """Training FLOPs per token (frozen weights get no weight gradients).

        `attended_len`: how many tokens a token attends over, averaged over tokens: sum of
        squared example lengths over the sum of lengths (a token of a long example costs more
        attention than one of a short example, so the plain mean example length undercounts).
        """
        return lora_train_flops_per_token(
            self.matmul_params,
            self.trainable_params,
            self.n_layers,
            self.hidden,
            max(1, round(attended_len)),
            attn_dim=self.attn_dim,
        )


def _cuda_sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def peak_memory_gb(reset: bool = True) -> float | None:
    """Peak GPU memory allocated since the last reset, else the process's peak RSS on CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = torch.cuda.max_memory_allocated() / BYTES_PER_GIB
        if reset:
            torch.cuda.reset_peak_memory_stats()
        return round(peak, 3)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB_PER_GIB, 3)


class ThroughputMeter:
    """Counts and timings of the current logging window and of the whole run."""

    def __init__(
        self,
        flops: FlopsModel | None,
        world_size: int = 1,
        reduce: Reducer | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sync: Callable[[], None] = _cuda_sync,
        memory: Callable[[], float | None] = peak_memory_gb,
    ) -> None:
        self.flops = flops
        self.world_size = world_size
        self.reduce = reduce
        self.clock, self.sync, self.memory = clock, sync, memory
        self.started = clock()
        self.windows: list[dict[str, Any]] = []
        self.totals = dict.fromkeys(WINDOW_KEYS, 0.0)
        self._reset_window()

    def _reset_window(self) -> None:
        self.win = dict.fromkeys(WINDOW_KEYS, 0.0)
        self._fetch_start: float | None = None
        self._last_end: float | None = None
        self.steps_in_window = 0

    def fetch_started(self) -> None:
        self._fetch_start = self.clock()

    def fetch_ended(self, tokens: int, samples: int, trained_tokens: int, attended: int) -> None:
        """The batches of one step arrived; `attended` = sum of squared example lengths."""
        if self._fetch_start is None:
            raise RuntimeError("fetch_ended without fetch_started")
        self.win["wait"] += self.clock() - self._fetch_start
        self.win["tokens"] += tokens
        self.win["samples"] += samples
        self.win["trained"] += trained_tokens
        self.win["attended"] += attended

    def step_ended(self) -> None:
        if self._fetch_start is None:
            return
        now = self.clock()
        self.win["busy"] += now - self._fetch_start
        self._fetch_start, self._last_end = None, now
        self.steps_in_window += 1

    def _window_totals(self) -> dict[str, float]:
        """This window's counts, summed over processes; busy/wait averaged over them."""
        self.sync()
        if self._last_end is not None:
            self.win["busy"] += self.clock() - self._last_end
        values = [self.win[k] for k in WINDOW_KEYS]
        if self.reduce is not None and self.world_size > 1:
            values = self.reduce(values)
        totals = dict(zip(WINDOW_KEYS, values, strict=True))
        if self.reduce is not None and self.world_size > 1:
            totals["wait"] /= self.world_size
            totals["busy"] /= self.world_size
        return totals

    def _mfu(self, tokens: float, attended: float, seconds: float) -> float | None:
        if self.flops is None or not self.flops.peak_flops_per_device or not tokens:
            return None
        per_token = self.flops.per_token(attended / tokens)
        return mfu(tokens / seconds, per_token, self.flops.peak_flops_per_device * self.world_size)

    def close_window(self, step: int, loss: float | None, lr: float | None) -> dict[str, Any]:
        """Finish the current window (call on every process) and return its record."""
        w = self._window_totals()
        seconds = max(w["busy"], 1e-9)
        record = {
            "step": step,
            "tokens_per_s": w["tokens"] / seconds,
            "samples_per_s": w["samples"] / seconds,
            "data_wait_fraction": min(1.0, w["wait"] / seconds),
            "mfu": self._mfu(w["tokens"], w["attended"], seconds),
            "peak_memory_gb": self.memory(),
            "loss": loss,
            "learning_rate": lr,
            "time": round(self.clock() - self.started, 3),
        }
        for key in self.totals:
            self.totals[key] += w[key]
        self.windows.append(record)
        self._reset_window()
        return record

    def summary(self, steps: int, status: str) -> dict[str, Any]:
        """Whole-run numbers over every closed window."""
        t = self.totals
        seconds = max(t["busy"], 1e-9)
        losses = [w["loss"] for w in self.windows if w["loss"] is not None]
        return {
            "tokens_per_s": t["tokens"] / seconds if t["busy"] else 0.0,
            "samples_per_s": t["samples"] / seconds if t["busy"] else 0.0,
            "data_wait_fraction": min(1.0, t["wait"] / seconds) if t["busy"] else 0.0,
            "mfu": self._mfu(t["tokens"], t["attended"], seconds) if t["busy"] else None,
            "steps": steps,
            "train_runtime_s": round(self.clock() - self.started, 3),
            "tokens": int(t["tokens"]),
            "trained_tokens": int(t["trained"]),
            "final_loss": losses[-1] if losses else None,
            "status": status,
        }
