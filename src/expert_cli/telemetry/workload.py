"""A fixed synthetic LoRA training workload, so machines, drivers and settings can be
compared on the same work: random-init model, random packed tokens, AdamW, in a thread.

The step itself is built by the caller (expert_cli.train.workload.build_fast_step: the
training fast path), so this module stays free of model code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from expert_cli.errors import RunError, UserError
from expert_cli.telemetry.flops import lora_train_flops_per_token, mfu, peak_bf16_flops


def _allocation_failed(error: BaseException | None) -> bool:
    """torch's OutOfMemoryError (by name: this module does not import torch) or MemoryError."""
    return error is not None and any(
        c.__name__ in ("OutOfMemoryError", "MemoryError") for c in type(error).__mro__
    )


WARMUP_STEPS = 3  # steps left out of tokens/s (allocator, kernel selection, autotuning)
TIMING_WINDOW = 5  # steps between device syncs (one sync a step would cost the overlap)
SEED = 0
# The architecture of Qwen/Qwen3-0.6B (its config.json), for random-init benchmarks.
QWEN3_0_6B: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class WorkloadSpec:
    """What one named workload trains: a Qwen3Config, row shape, LoRA rank."""

    name: str
    description: str
    model: dict[str, Any]
    seq_len: int
    segment_len: int  # position ids restart every segment_len tokens (packed examples)
    batch_size: int
    lora_r: int = 16
    needs_cuda: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


WORKLOADS: dict[str, WorkloadSpec] = {
    "qwen3-0.6b-lora": WorkloadSpec(
        name="qwen3-0.6b-lora",
        description="Qwen3-0.6B architecture, random init, bf16, LoRA r=16 on all linear "
        "projections, 8 packed rows of 2048 tokens (examples of 512) per step, AdamW, on "
        "expert-cli's fast path",
        model=QWEN3_0_6B,
        seq_len=2048,
        segment_len=512,
        batch_size=8,
        needs_cuda=True,
    ),
    "tiny": WorkloadSpec(
        name="tiny",
        description="2-layer Qwen3-style model (hidden 64), LoRA r=16, 2 packed rows of 256 "
        "tokens per step; runs on a CPU, for tests and smoke checks",
        model={
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "vocab_size": 1024,
            "max_position_embeddings": 512,
            "tie_word_embeddings": True,
        },
        seq_len=256,
        segment_len=64,
        batch_size=2,
    ),
}


def get_workload(name: str) -> WorkloadSpec:
    """The named workload; an unknown name is the user's error, naming the option."""
    if name not in WORKLOADS:
        raise UserError(
            f"--workload: unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}"
        )
    return WORKLOADS[name]


class WorkloadRunner:
    """Runs a workload in a background thread until `stop()`; reports tokens/s and MFU.

    `build(spec)` returns the step to repeat (a callable returning the loss tensor) and a dict
    of what was chosen (attention kernel, loss, dtype, parameter counts).
    """

    def __init__(
        self,
        spec: WorkloadSpec,
        build: Callable[[WorkloadSpec], tuple[Callable[[], Any], dict[str, Any]]],
    ) -> None:
        self.spec = spec
        self.build = build
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"workload-{spec.name}", daemon=True)
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self.info: dict[str, Any] = {"workload": spec.name, "description": spec.description}
        self.steps = 0
        self._timed_steps = 0
        self._timed_s = 0.0
        self.last_loss: float | None = None

    def start(self) -> None:
        """Start the thread (the step is built there; `wait_ready` reports a failure)."""
        self._thread.start()

    def _run(self) -> None:
        try:
            self._train()
        except BaseException as exc:  # reported by wait_ready() or stop(), in the main thread
            self._error = exc
        finally:
            self._ready.set()

    def wait_ready(self) -> None:
        """Block until the model is built and past its warm-up steps, so that sampling sees
        the steady state (or until it has failed: then raise)."""
        self._ready.wait()
        self._raise_error()

    def _raise_error(self) -> None:
        if isinstance(self._error, UserError):  # e.g. a GPU workload on a machine without one
            raise self._error
        if _allocation_failed(self._error):  # the CLI says so in one line
            raise self._error
        if self._error is not None:
            raise RunError(f"workload {self.spec.name} failed: {self._error!r}") from self._error

    def _train(self) -> None:
        t0 = time.perf_counter()
        step, info = self.build(self.spec)
        self.info.update(
            info,
            setup_s=time.perf_counter() - t0,
            tokens_per_step=self.spec.batch_size * self.spec.seq_len,
        )
        window_start, window_steps = None, 0
        while not self._stop.is_set():
            loss = step()
            self.steps += 1
            if self.steps == WARMUP_STEPS or (
                window_start is not None and window_steps + 1 == TIMING_WINDOW
            ):
                value = float(loss.item())  # synchronises the device: the timing is real
                now = time.perf_counter()
                with self._lock:
                    self.last_loss = value
                    if window_start is not None:
                        self._timed_steps += window_steps + 1
                        self._timed_s += now - window_start
                window_start, window_steps = now, 0
                self._ready.set()
            elif window_start is not None:
                window_steps += 1

    def tokens_per_s(self) -> float | None:
        """Mean trained tokens per second over the steps after warm-up, None before any."""
        with self._lock:
            if not self._timed_steps:
                return None
            tokens = self._timed_steps * self.spec.batch_size * self.spec.seq_len
            return tokens / self._timed_s

    def stop(self) -> dict[str, Any]:
        """Stop after the current step and return the workload's report section."""
        self._stop.set()
        self._thread.join()
        self._raise_error()
        return self.result()

    def result(self) -> dict[str, Any]:
        """Steps, tokens/s, FLOPs per token and MFU (None where the GPU's peak is unknown)."""
        tps = self.tokens_per_s()
        m = self.spec.model
        out = dict(
            self.info,
            steps=self.steps,
            timed_steps=self._timed_steps,
            last_loss=self.last_loss,
            tokens_per_s=tps,
            flops_per_token=None,
            mfu=None,
        )
        if "total_params" in self.info:
            fpt = lora_train_flops_per_token(
                self.info["total_params"],
                self.info["trainable_params"],
                m["num_hidden_layers"],
                m["hidden_size"],
                self.spec.segment_len,
                attn_dim=m["num_attention_heads"] * m["head_dim"],
            )
            # the tensor cores' fp16 rate is their bf16 one on the GPUs of the table
            half = self.info["dtype"] in ("bfloat16", "float16")
            peak = peak_bf16_flops(self.info["device"]) if half else None
            out.update(
                flops_per_token=fpt,
                peak_flops=peak,
                mfu=None if tps is None else mfu(tps, fpt, peak),
            )
        return out
