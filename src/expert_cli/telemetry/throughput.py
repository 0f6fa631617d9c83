"""Training throughput per logging window: tokens/s, samples/s, data wait, memory, MFU.

`ThroughputMeter` is fed by the trainer (batch fetch start/end with the batch's counts, step
end) and closes a window at every training log (expert_cli.train.callbacks drives it and
writes metrics.json).

One definition everywhere: tokens/s is non-padding tokens over the wall time of the window (from
the previous window's close, or the first batch fetch, to this close) or of the run (the sum of
its windows: start-up before the first step is not counted, nor are evaluations and checkpoint
saves, which each window records apart as `eval_s` and `save_s`; the first window holds the
first step's kernel selection and compilation). At a window's close the GPU is synchronized
once, so queued GPU work is counted without a sync per step. A last window closed after its
last step (the run's end, a Ctrl-C and its checkpoint) ends where the GPU finished that step,
timed by CUDA events (the host had queued it earlier). Data wait is the host's time fetching
batches over the same wall time: an upper bound on the GPU's idle time, as nothing syncs a step
of one process (the host may fetch while queued GPU work runs; several processes sync at every
step's end, and then it is the wait).

Across processes (DDP, FSDP, several nodes) each window's counts are gathered from every rank:
tokens/s and samples/s are the sums over ranks, data wait is the slowest rank's (a step waits
for it), MFU is against the sum of the ranks' peaks, and `ranks` keeps each rank's own figures.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from expert_cli.telemetry.flops import lora_train_flops_per_token, mfu

KIB_PER_GIB = 2**20
BYTES_PER_GIB = 2**30

# Per-window sums: real tokens, examples, trained tokens, sum of squared example lengths,
# seconds waiting for data.
WINDOW_KEYS = ("tokens", "samples", "trained", "attended", "wait")

# all_gather(values) -> every training process's values, in rank order.
Gatherer = Callable[[list[float]], list[list[float]]]
NO_MEMORY = -1.0  # a rank without a peak-memory figure (gathered as a number)
LEFT_OUT = ("eval", "save")  # work between steps left out of the windows' seconds


@dataclass(frozen=True)
class FlopsModel:
    """What the FLOPs count needs to know about the model, and the GPU's peak."""

    matmul_params: int
    trainable_params: int
    n_layers: int
    hidden: int
    attn_dim: int
    peak_flops_per_device: float | None
    # the LM head's weights, whose FLOPs count for the trained tokens alone (0: every token)
    head_params: int = 0

    def per_token(self, attended_len: float, trained_share: float = 1.0) -> float:
        """Training FLOPs per token (frozen weights get no weight gradients).

        `attended_len`: how many tokens a token attends over, averaged over tokens: sum of
        squared example lengths over the sum of lengths (a token of a long example costs more
        attention than one of a short example, so the plain mean example length undercounts).
        `trained_share`: the share of tokens whose next token is trained; with `head_params`
        the head's forward and input-gradient FLOPs (2 + 2 a weight) count for those only: a
        prompt token's logits are no part of the loss, so computing them is no useful work
        (the fused loss skips it; the standard loss does it and is not credited for it).
        """
        whole = lora_train_flops_per_token(
            self.matmul_params,
            self.trainable_params,
            self.n_layers,
            self.hidden,
            max(1, round(attended_len)),
            attn_dim=self.attn_dim,
        )
        skipped = 1.0 - min(max(trained_share, 0.0), 1.0)
        return whole - 4.0 * self.head_params * skipped


def _cuda_sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _own_rank() -> int:
    """This process's rank (0 without a process group)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def _cuda_mark(event: Any = None) -> Any:
    """`event` (a new one where None) recorded now on CUDA: reached when the GPU has done the
    work queued before it; None without CUDA. One event per use is recorded again at every
    step, not made anew."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        event = event if event is not None else torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return None


def peak_memory_gb(reset: bool = True) -> float | None:
    """Peak GPU memory allocated since the last reset, else the process's peak RSS on CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = torch.cuda.max_memory_allocated() / BYTES_PER_GIB
        if reset:
            torch.cuda.reset_peak_memory_stats()
        return round(peak, 3)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB_PER_GIB, 3)


def allocator_flushes() -> int | None:
    """How often, so far in this process, PyTorch's CUDA allocator found no cached block for
    an allocation and freed its whole cache to retry: each time waits for the GPU to go idle
    (a stall the host cannot hide), a sign of memory at its limit. None without CUDA. Reads the
    allocator's counters on the host: no device sync."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.memory_stats().get("num_alloc_retries", 0))
    return None


def flush_note(summary: dict[str, Any]) -> str | None:
    """What a run's allocator cache flushes (`summary["allocator_flushes"]`) cost, and the
    ways out; None when there were none."""
    flushes = summary.get("allocator_flushes") or 0
    if flushes <= 0:
        return None
    return (
        f"the CUDA allocator ran out of cached memory {flushes} time(s) and freed its cache "
        "to retry, each a stall of the GPU: lower training.config.batch_size (or let "
        "batch_size auto choose), or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )


class ThroughputMeter:
    """Counts and timings of the current logging window and of the whole run."""

    flushes: Callable[[], int | None] = staticmethod(allocator_flushes)
    mark: Callable[[Any], Any] = staticmethod(_cuda_mark)

    def __init__(
        self,
        flops: FlopsModel | None,
        world_size: int = 1,
        gather: Gatherer | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sync: Callable[[], None] = _cuda_sync,
        memory: Callable[[], float | None] = peak_memory_gb,
    ) -> None:
        self.flops = flops
        self.world_size = world_size
        self.gather = gather
        self.clock, self.sync, self.memory = clock, sync, memory
        self.started = clock()
        self.windows: list[dict[str, Any]] = []
        self.totals = dict.fromkeys(WINDOW_KEYS, 0.0)
        self.rank_totals: list[dict[str, float]] = []  # per rank, over the closed windows
        self.seconds = 0.0  # wall time of the closed windows
        self.steps = 0  # optimizer steps this process ran (a resumed run's earlier ones excluded)
        self.flushed = 0  # allocator cache flushes over the closed windows, every process
        self._first: tuple[dict[str, float], float] | None = None  # the first window's counts
        self._flushes_seen = self.flushes() or 0  # the model's load and probes before it
        self._window_start: float | None = None
        self._start_mark: Any = None  # a CUDA event at the window's start
        self._step_mark: Any = None  # a CUDA event at the latest step's end
        self.left_out = dict.fromkeys(LEFT_OUT, 0.0)  # over the closed windows
        self._reset_window()

    def _reset_window(self) -> None:
        self.win = dict.fromkeys(WINDOW_KEYS, 0.0)
        self._fetch_start: float | None = None
        self._last_end: float | None = None
        self._last_mark: Any = None  # a CUDA event at the last step's end
        self.steps_in_window = 0
        self._left = dict.fromkeys(LEFT_OUT, 0.0)  # inside the window: before one of its steps
        self._pending = dict.fromkeys(LEFT_OUT, 0.0)  # since its last step

    def fetch_started(self) -> None:
        self._fetch_start = self.clock()
        first = self._window_start is None  # the run's first step: start-up is not counted,
        if first:  # nor an evaluation before it (eval_on_start: 4e12 tok/s in that window)
            self._window_start = self._fetch_start
            self._start_mark = self.mark(self._start_mark)
        into = self.left_out if first else self._left  # before any window: the run's
        for key, seconds in self._pending.items():  # a step follows: inside the window
            into[key] += seconds
        self._pending = dict.fromkeys(LEFT_OUT, 0.0)

    @contextmanager
    def leaving_out(self, kind: str) -> Iterator[None]:
        """Time an evaluation or a checkpoint save (`kind` of LEFT_OUT) to leave it out of
        the window's seconds: the GPU synchronized before and after, so the steps queued
        before it are counted as training and its own work is not."""
        self.sync()
        start = self.clock()
        try:
            yield
        finally:
            self.sync()
            self._pending[kind] += self.clock() - start

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
        self._fetch_start, self._last_end = None, self.clock()
        self._last_mark = self._step_mark = self.mark(self._step_mark)
        self.steps_in_window += 1

    def _end(self, at_last_step: bool, now: float, start: float) -> float:
        """Where the window ends: now, or with `at_last_step` where the GPU finished the last
        step (by CUDA events: the host queued it at `_last_end`, before the GPU ran it)."""
        if not at_last_step or self._last_end is None:
            return now
        if self._start_mark is not None and self._last_mark is not None:
            self._last_mark.synchronize()
            return start + self._start_mark.elapsed_time(self._last_mark) / 1000
        return self._last_end

    def _per_rank(self, memory: float | None, alone: bool) -> list[dict[str, float]]:
        """This window's counts and peak memory of every process, in rank order (this
        process's only when `alone`)."""
        values = [self.win[k] for k in WINDOW_KEYS] + [NO_MEMORY if memory is None else memory]
        values.append(self._new_flushes())
        several = self.gather is not None and self.world_size > 1 and not alone
        rows = self.gather(values) if several and self.gather else [values]
        return [dict(zip((*WINDOW_KEYS, "memory", "flushes"), row, strict=True)) for row in rows]

    def _new_flushes(self) -> float:
        """This process's allocator cache flushes since the last window (-1: not known)."""
        now = self.flushes()
        if now is None:
            return NO_MEMORY
        before, self._flushes_seen = self._flushes_seen, now
        return float(now - before)

    def _mfu(self, counts: dict[str, float], seconds: float, devices: int) -> float | None:
        """MFU of the `counts` (tokens, attended, trained) of `devices` processes, against the
        sum of their peaks."""
        tokens = counts["tokens"]
        if self.flops is None or not self.flops.peak_flops_per_device or not tokens:
            return None
        per_token = self.flops.per_token(counts["attended"] / tokens, counts["trained"] / tokens)
        return mfu(tokens / seconds, per_token, self.flops.peak_flops_per_device * devices)

    def close_window(
        self,
        step: int,
        loss: float | None,
        lr: float | None,
        at_last_step: bool = False,
        alone: bool = False,
    ) -> dict[str, Any]:
        """Finish the current window (call on every process, as it gathers from them all) and
        return its record. With `at_last_step` (the run's end) the window ends at its last step,
        so what follows training (the final save) is not counted. `alone`: this process's own
        counts, without waiting for the others (a failure on one rank must not hang it)."""
        self.sync()
        now = self.clock()
        start = self._window_start if self._window_start is not None else now
        left = {k: v + (0.0 if at_last_step else self._pending[k]) for k, v in self._left.items()}
        seconds = max(self._end(at_last_step, now, start) - start - sum(left.values()), 1e-9)
        ranks = self._per_rank(self.memory(), alone)
        w = {k: sum(r[k] for r in ranks) for k in WINDOW_KEYS}
        w["wait"] = max(r["wait"] for r in ranks)  # the slowest rank's wait holds every step
        # the largest of any process: the one nearest its limit
        memory = max((r["memory"] for r in ranks), default=NO_MEMORY)
        record = {
            "step": step,
            "tokens_per_s": w["tokens"] / seconds,
            "samples_per_s": w["samples"] / seconds,
            "data_wait_fraction": min(1.0, w["wait"] / seconds),
            "mfu": self._mfu(w, seconds, len(ranks)),
            "peak_memory_gb": None if memory == NO_MEMORY else memory,
            "loss": loss,
            "learning_rate": lr,
            "seconds": round(seconds, 3),
            "time": round(now - self.started, 3),
        }
        for key, value in left.items():
            if value > 0:
                record[f"{key}_s"] = round(value, 3)
            # after the last step (an interrupt's checkpoint): the run's, in no window
            self.left_out[key] += value + (self._pending[key] if at_last_step else 0.0)
        if all(r["flushes"] != NO_MEMORY for r in ranks):
            record["allocator_flushes"] = int(sum(r["flushes"] for r in ranks))
            self.flushed += record["allocator_flushes"]
        if len(ranks) > 1:
            record["ranks"] = [_rank_figures(i, r, seconds) for i, r in enumerate(ranks)]
        self._add_to_ranks(ranks, alone)
        for key in self.totals:
            self.totals[key] += w[key]
        self.seconds += seconds
        self.steps += self.steps_in_window
        if not self.windows:
            self._first = (dict(w), seconds)
        self.windows.append(record)
        self._window_start = now
        self._start_mark = self.mark(self._start_mark)  # the GPU idle: synchronized
        self._reset_window()
        return record

    def _add_to_ranks(self, ranks: list[dict[str, float]], alone: bool) -> None:
        """Each process's totals, with a window's counts (`alone`: this process's only, to its
        own totals: the run's other ranks and their MFU peaks are kept)."""
        if not self.rank_totals:  # the first window (ranks never change in a run)
            count = max(len(ranks), self.world_size if alone else 1)
            self.rank_totals = [dict.fromkeys(WINDOW_KEYS, 0.0) for _ in range(count)]
        rows = ranks if len(ranks) == len(self.rank_totals) else [{}] * len(self.rank_totals)
        if alone and len(ranks) == 1 < len(self.rank_totals):
            rows[min(_own_rank(), len(rows) - 1)] = ranks[0]
        for total, r in zip(self.rank_totals, rows, strict=True):
            for key in WINDOW_KEYS:
                total[key] += r.get(key, 0.0)

    def _steady(self) -> dict[str, Any] | None:
        """The run's rates without its first window, which holds the first step's kernel
        selection, autotuning and compilation and the loader's first batches (a short run's
        figure reads low by them); None with fewer than two windows."""
        if len(self.windows) < 2 or self._first is None:
            return None
        first, first_seconds = self._first
        t = {k: self.totals[k] - first[k] for k in WINDOW_KEYS}
        seconds = self.seconds - first_seconds
        if seconds <= 0:
            return None
        return {
            "after_step": self.windows[0]["step"],
            "tokens_per_s": t["tokens"] / seconds,
            "data_wait_fraction": min(1.0, t["wait"] / seconds),
            "mfu": self._mfu(t, seconds, max(1, len(self.rank_totals))),
        }

    def _left_out_so_far(self) -> dict[str, float]:
        """The evaluation and save seconds of the closed windows, and those since the last
        step (after a run's last step: its last evaluation, the interrupt's checkpoint)."""
        return {k: v + self._left[k] + self._pending[k] for k, v in self.left_out.items()}

    def summary(self, steps: int, status: str) -> dict[str, Any]:
        """Whole-run numbers over every closed window of this process. `steps` is the run's
        step count (a resumed run's included); `steps_this_run` the steps this process ran."""
        t, seconds = self.totals, self.seconds
        losses = [w["loss"] for w in self.windows if w["loss"] is not None]
        return {
            "tokens_per_s": t["tokens"] / seconds if seconds else 0.0,
            "samples_per_s": t["samples"] / seconds if seconds else 0.0,
            "data_wait_fraction": min(1.0, t["wait"] / seconds) if seconds else 0.0,
            "mfu": self._mfu(t, seconds, max(1, len(self.rank_totals))) if seconds else None,
            "steps": steps,
            "steps_this_run": self.steps,
            "train_runtime_s": round(seconds, 3),
            "tokens": int(t["tokens"]),
            "trained_tokens": int(t["trained"]),
            "final_loss": losses[-1] if losses else None,
            "status": status,
            **({"steady": steady} if (steady := self._steady()) else {}),
            **({"allocator_flushes": self.flushed} if self.flushed else {}),
            **{f"{k}_s": round(v, 3) for k, v in self._left_out_so_far().items() if v > 0},
            **(
                {"ranks": [_rank_figures(i, r, seconds) for i, r in enumerate(self.rank_totals)]}
                if len(self.rank_totals) > 1 and seconds
                else {}
            ),
        }


def _rank_figures(rank: int, counts: dict[str, float], seconds: float) -> dict[str, Any]:
    """One process's own tokens/s, samples/s, data wait (and peak memory) over `seconds`."""
    figures: dict[str, Any] = {
        "rank": rank,
        "tokens": int(counts["tokens"]),
        "tokens_per_s": counts["tokens"] / seconds,
        "samples_per_s": counts["samples"] / seconds,
        "data_wait_fraction": min(1.0, counts["wait"] / seconds),
    }
    if counts.get("memory", NO_MEMORY) != NO_MEMORY:
        figures["peak_memory_gb"] = counts["memory"]
    return figures
