"""Throughput windows: tokens/s, samples/s, data-wait fraction, MFU math, metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from expert_cli.atomic import write_json_atomic
from expert_cli.telemetry.flops import lora_train_flops_per_token
from expert_cli.telemetry.throughput import FlopsModel, ThroughputMeter
from expert_cli.train.callbacks import over_windows


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _meter(clock: FakeClock, flops: FlopsModel | None = None, **kw) -> ThroughputMeter:
    return ThroughputMeter(flops, clock=clock, sync=lambda: None, memory=lambda: 1.5, **kw)


def _step(
    meter: ThroughputMeter,
    clock: FakeClock,
    wait: float,
    compute: float,
    tokens: int = 1000,
    samples: int = 4,
    trained: int = 600,
    attended: int | None = None,
) -> None:
    """One step; by default `samples` examples of equal length."""
    meter.fetch_started()
    clock.t += wait
    if attended is None:
        attended = samples * (tokens // samples) ** 2
    meter.fetch_ended(tokens, samples, trained, attended)
    clock.t += compute
    meter.step_ended()


def test_window_rates_and_data_wait_over_wall_time() -> None:
    clock = FakeClock()
    meter = _meter(clock)
    clock.t = 30.0  # start-up before the first step is not training time
    for i in range(4):
        _step(meter, clock, wait=0.1, compute=0.4)
        if i == 1:
            clock.t += 5.0  # an evaluation inside the window is part of its wall time
    rec = meter.close_window(step=4, loss=2.5, lr=1e-4)
    assert rec["seconds"] == pytest.approx(7.0)
    assert rec["tokens_per_s"] == pytest.approx(4000 / 7.0)
    assert rec["samples_per_s"] == pytest.approx(16 / 7.0)
    assert rec["data_wait_fraction"] == pytest.approx(0.4 / 7.0)
    assert rec["peak_memory_gb"] == 1.5 and rec["mfu"] is None
    assert (rec["step"], rec["loss"], rec["learning_rate"]) == (4, 2.5, 1e-4)


def test_windows_tile_the_run_and_the_summary_is_their_sum() -> None:
    """Every console figure (window lines, the end line) is one definition: tokens over the
    wall time; the run's figure is the windows' tokens over the windows' seconds."""
    clock = FakeClock()
    meter = _meter(clock)
    records = []
    for window in range(3):
        for _ in range(window + 1):
            _step(meter, clock, wait=0.05, compute=0.2 * (window + 1))
        clock.t += 0.3  # logging, a checkpoint save
        records.append(meter.close_window(window + 1, 1.0, None))
    _step(meter, clock, wait=0.0, compute=1.0)
    clock.t += 9.0  # the final save after the last step: not counted
    records.append(meter.close_window(4, None, None, at_last_step=True))
    summary = meter.summary(10, "completed")
    seconds = sum(r["seconds"] for r in records)
    assert seconds == pytest.approx(clock.t - 9.0)
    assert summary["train_runtime_s"] == pytest.approx(seconds, abs=1e-3)
    tokens = sum(r["tokens_per_s"] * r["seconds"] for r in records)
    assert summary["tokens"] == pytest.approx(tokens) == 7000
    assert summary["tokens_per_s"] == pytest.approx(7000 / seconds)
    assert (summary["steps"], summary["steps_this_run"]) == (10, 7)


def test_the_summary_also_gives_the_rates_after_the_first_window() -> None:
    """The first window holds the first step's compilation and autotuning: a short run's
    figure read low by them (27,641 tok/s where the windows after the first ran at 28,370 in
    bench_results/h100/train_metrics.json). The summary keeps the whole run's, and adds the
    rates without that window."""
    clock = FakeClock()
    meter = _meter(clock)
    _step(meter, clock, wait=0.5, compute=3.5)  # step 1: compiles, waits for the workers
    meter.close_window(1, None, None)
    for step in (2, 3):
        _step(meter, clock, wait=0.0, compute=1.0)
        meter.close_window(step, None, None)
    summary = meter.summary(3, "completed")
    assert summary["tokens_per_s"] == pytest.approx(3000 / 6.0)
    steady = summary["steady"]
    assert steady["after_step"] == 1 and steady["tokens_per_s"] == pytest.approx(2000 / 2.0)
    assert steady["data_wait_fraction"] == 0.0
    one = _meter(FakeClock())
    _step(one, one.clock, wait=0.0, compute=1.0)
    one.close_window(1, None, None)
    assert "steady" not in one.summary(1, "completed")  # one window: nothing to leave out


def test_gpu_time_still_running_at_window_close_counts() -> None:
    clock = FakeClock()

    def sync() -> None:
        clock.t += 0.5  # the GPU finishes queued work at the window's sync

    meter = ThroughputMeter(None, clock=clock, sync=sync, memory=lambda: None)
    _step(meter, clock, wait=0.0, compute=0.5)
    rec = meter.close_window(1, None, None)
    assert rec["tokens_per_s"] == pytest.approx(1000 / 1.0)


def test_mfu_uses_lora_flops_and_example_length() -> None:
    clock = FakeClock()
    fm = FlopsModel(
        matmul_params=1_000_000,
        trainable_params=10_000,
        n_layers=2,
        hidden=64,
        attn_dim=128,
        peak_flops_per_device=1e12,
    )
    meter = _meter(clock, fm)
    _step(meter, clock, wait=0.0, compute=1.0, tokens=1000, samples=4)
    rec = meter.close_window(1, 1.0, 1e-3)
    per_token = lora_train_flops_per_token(1_000_000, 10_000, 2, 64, 250, attn_dim=128)
    assert per_token == 6 * 1_000_000 - 2 * (1_000_000 - 10_000) + 12 * 2 * 128 * 250
    assert rec["mfu"] == pytest.approx(1000 * per_token / 1e12)


def test_mfu_attention_is_weighted_by_example_length() -> None:
    """Examples of 100 and 900 tokens: a token attends over (100^2 + 900^2) / 1000 = 820
    tokens on average, not over the mean example length of 500."""
    clock = FakeClock()
    fm = FlopsModel(1_000_000, 10_000, 2, 64, 128, 1e12)
    meter = _meter(clock, fm)
    _step(meter, clock, wait=0.0, compute=1.0, tokens=1000, samples=2, attended=100**2 + 900**2)
    rec = meter.close_window(1, None, None)
    assert rec["mfu"] == pytest.approx(1000 * fm.per_token(820) / 1e12)
    assert fm.per_token(820) > fm.per_token(500)
    summary = meter.summary(1, "completed")
    assert summary["mfu"] == pytest.approx(rec["mfu"])


def test_mfu_counts_the_head_for_the_trained_tokens_alone() -> None:
    """The LM head's forward and input-gradient FLOPs (`head_params`) count for the trained
    tokens alone: 600 of 1,000 tokens here."""
    clock = FakeClock()
    every = FlopsModel(1_000_000, 10_000, 2, 64, 128, 1e12)
    fm = FlopsModel(1_000_000, 10_000, 2, 64, 128, 1e12, head_params=200_000)
    meter = _meter(clock, fm)
    _step(meter, clock, wait=0.0, compute=1.0, tokens=1000, trained=600)
    rec = meter.close_window(1, None, None)
    per_token = every.per_token(250) - 4 * 200_000 * 0.4
    assert fm.per_token(250, 0.6) == pytest.approx(per_token)
    assert rec["mfu"] == pytest.approx(1000 * per_token / 1e12)
    assert meter.summary(1, "completed")["mfu"] == pytest.approx(rec["mfu"])
    assert fm.per_token(250) == every.per_token(250)  # every token trained: no change
    assert fm.per_token(250, 0.0) == every.per_token(250) - 4 * 200_000
    assert every.per_token(250, 0.6) == every.per_token(250)  # no head counted apart


def test_ranks_sum_tokens_take_the_slowest_wait_and_keep_their_own_figures() -> None:
    """Two processes: this one (1000 tokens, 0.25 s wait) and a slower one (500 tokens, 0.5 s
    wait, 2.5 GB): tokens/s summed, data wait of the slowest, MFU against both peaks."""
    clock = FakeClock()
    fm = FlopsModel(1_000_000, 10_000, 2, 64, 128, 1e12)
    other = [500.0, 2.0, 300.0, 500 * 250.0, 0.5, 2.5, -1.0]  # -1: no allocator count
    meter = _meter(clock, fm, world_size=2, gather=lambda v: [v, other])
    _step(meter, clock, wait=0.25, compute=0.75)
    rec = meter.close_window(1, None, None)
    assert rec["tokens_per_s"] == pytest.approx(1500 / 1.0)
    assert rec["samples_per_s"] == pytest.approx(6 / 1.0)
    assert rec["data_wait_fraction"] == pytest.approx(0.5)
    assert rec["mfu"] == pytest.approx(1500 * fm.per_token(250) / 2e12)
    assert [(r["rank"], r["tokens_per_s"], r["data_wait_fraction"]) for r in rec["ranks"]] == [
        (0, 1000.0, 0.25),
        (1, 500.0, 0.5),
    ]
    assert [r["peak_memory_gb"] for r in rec["ranks"]] == [1.5, 2.5]
    assert rec["peak_memory_gb"] == 2.5  # the largest of any process (it was rank 0's)
    _step(meter, clock, wait=0.0, compute=1.0)
    meter.close_window(2, None, None)
    summary = meter.summary(2, "completed")
    assert summary["tokens"] == 3000 and summary["tokens_per_s"] == pytest.approx(1500.0)
    assert summary["data_wait_fraction"] == pytest.approx(1.0 / 2.0)  # 0.5 s + 0.5 s of 2 s
    assert [r["tokens"] for r in summary["ranks"]] == [2000, 1000]
    assert summary["ranks"][0]["data_wait_fraction"] == pytest.approx(0.25 / 2.0)
    # a last window closed by this process alone (it failed): its counts go to its own
    # totals; the summary kept only this process (MFU against one peak: 67% read for 40%)
    _step(meter, clock, wait=0.0, compute=1.0)
    meter.close_window(3, None, None, at_last_step=True, alone=True)
    summary = meter.summary(3, "failed")
    assert [r["tokens"] for r in summary["ranks"]] == [3000, 1000]
    assert summary["mfu"] == pytest.approx(4000 / 3.0 * fm.per_token(250) / 2e12)
    single = _meter(FakeClock(), fm)
    _step(single, FakeClock(), wait=0.0, compute=1.0)
    assert "ranks" not in single.close_window(1, None, None)


def test_summary_over_windows() -> None:
    clock = FakeClock()
    meter = _meter(clock)
    _step(meter, clock, wait=0.0, compute=1.0)
    meter.close_window(1, 3.0, 1e-3)
    _step(meter, clock, wait=1.0, compute=1.0)
    meter.close_window(2, 2.0, 1e-3)
    s = meter.summary(steps=2, status="completed")
    assert s["tokens"] == 2000 and s["trained_tokens"] == 1200 and s["steps"] == 2
    assert s["tokens_per_s"] == pytest.approx(2000 / 3.0)
    assert s["data_wait_fraction"] == pytest.approx(1 / 3)
    assert s["final_loss"] == 2.0 and s["status"] == "completed"


def test_a_resume_that_trains_nothing_keeps_the_runs_figures() -> None:
    """A resume from the last step's checkpoint trains no window of its own: its summary said
    0 tok/s for the run. The figures come from the windows it resumed, weighted by their
    seconds as the meter's own summary is; hand-edited records are left out, not raised on."""
    clock = FakeClock()
    meter = _meter(clock)
    _step(meter, clock, wait=0.0, compute=1.0)
    windows = [meter.close_window(1, 3.0, 1e-3)]
    _step(meter, clock, wait=1.0, compute=1.0)
    windows.append(meter.close_window(2, 2.0, 1e-3))
    whole = meter.summary(steps=2, status="completed")
    figures = over_windows([*windows, "x", {"seconds": 10**400, "tokens_per_s": 1.0}])
    for key in ("tokens_per_s", "samples_per_s", "data_wait_fraction"):
        assert figures[key] == pytest.approx(whole[key]), key
    assert "mfu" not in figures  # no window had one (no GPU peak known)
    assert over_windows([{"seconds": 1e308, "tokens_per_s": 1e308}]) == {}  # overflows: out
    assert over_windows([{"seconds": 0, "tokens_per_s": 5.0}, {"seconds": True}]) == {}


def test_write_json_atomic_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    write_json_atomic(path, {"windows": [], "summary": {"status": "running"}})
    assert json.loads(path.read_text())["summary"]["status"] == "running"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_failing_rank_closes_its_window_without_the_others() -> None:
    """`alone`: no gather (the other ranks may be stuck in a step or gone), own counts only."""
    clock = FakeClock()

    def gather(values: list[float]) -> list[list[float]]:
        raise AssertionError("a failing rank must not wait for the others")

    meter = _meter(clock, world_size=2, gather=gather)
    _step(meter, clock, wait=0.0, compute=1.0)
    rec = meter.close_window(1, None, None, at_last_step=True, alone=True)
    assert rec["tokens_per_s"] == pytest.approx(1000.0) and "ranks" not in rec


def test_allocator_flushes_are_counted_per_window_and_named(monkeypatch) -> None:
    """A run whose memory is at its limit: each of the allocator's cache flushes stalls the
    GPU, and nothing said so (a ~5 s dip of the H100 monitor run stayed unexplained). The
    windows count them since the meter started (the model's load before it left out), the
    summary totals them over every process, and the end of the run names the ways out."""
    from expert_cli.cli.train_view import window_line
    from expert_cli.telemetry.throughput import flush_note

    counter = {"n": 3}  # three flushes while the model was loaded
    monkeypatch.setattr(ThroughputMeter, "flushes", staticmethod(lambda: counter["n"]))
    clock = FakeClock()
    meter = _meter(clock, world_size=2, gather=lambda values: [values, values])
    _step(meter, clock, wait=0.0, compute=1.0)
    assert meter.close_window(step=1, loss=2.0, lr=1e-4)["allocator_flushes"] == 0
    counter["n"] = 5
    _step(meter, clock, wait=0.0, compute=1.0)
    rec = meter.close_window(step=2, loss=2.0, lr=1e-4)
    assert rec["allocator_flushes"] == 4  # 2 on each of the two processes
    summary = meter.summary(2, "completed")
    assert summary["allocator_flushes"] == 4
    note = flush_note(summary)
    assert note is not None and "4 time(s)" in note and "expandable_segments:True" in note
    assert window_line(rec, 10).endswith("allocator flushes 4")  # the console's window line
    # a GPU's allocated memory is `mem`; a CPU run's figure is the process's resident set
    assert "  mem 1.50 GB  " in window_line(rec, 10) and "rss" not in window_line(rec, 10)
    assert "  rss 1.50 GB  " in window_line(rec, 10, on_cpu=True)
    # no CUDA: no figure at all, and no note
    monkeypatch.setattr(ThroughputMeter, "flushes", staticmethod(lambda: None))
    meter = _meter(FakeClock())
    _step(meter, clock, wait=0.0, compute=1.0)
    assert "allocator_flushes" not in meter.close_window(step=1, loss=2.0, lr=1e-4)
    assert flush_note(meter.summary(1, "completed")) is None


def test_evaluations_and_saves_are_left_out_of_the_windows() -> None:
    """An evaluation and a checkpoint save between steps were counted as training time: a run
    evaluating often read as slow training. Each window now leaves them out and records them
    apart; a save after the last step of a last window (Ctrl-C's checkpoint) is not in it."""
    clock = FakeClock()
    meter = _meter(clock)
    _step(meter, clock, wait=0.1, compute=0.9)
    first = meter.close_window(1, 2.0, None)  # the log closes the window; eval and save follow
    with meter.leaving_out("eval"):
        clock.t += 5.0
    with meter.leaving_out("save"):
        clock.t += 2.0
    _step(meter, clock, wait=0.1, compute=0.9)
    _step(meter, clock, wait=0.1, compute=0.9)
    second = meter.close_window(3, 1.9, None)
    assert first["seconds"] == pytest.approx(1.0) and "eval_s" not in first
    assert second["seconds"] == pytest.approx(2.0)
    assert (second["eval_s"], second["save_s"]) == (5.0, 2.0)
    assert second["tokens_per_s"] == pytest.approx(1000.0)
    _step(meter, clock, wait=0.1, compute=0.9)
    with meter.leaving_out("save"):  # the interrupt's checkpoint, after the last step
        clock.t += 30.0
    last = meter.close_window(4, None, None, at_last_step=True)
    assert last["seconds"] == pytest.approx(1.0) and "save_s" not in last
    summary = meter.summary(4, "interrupted")
    assert summary["train_runtime_s"] == pytest.approx(4.0)
    assert (summary["eval_s"], summary["save_s"]) == (5.0, 32.0)  # the interrupt's save too
    assert summary["tokens_per_s"] == pytest.approx(1000.0)


class FakeMark:
    """A CUDA event's stand-in: the time the GPU reaches it, on a clock of its own."""

    def __init__(self, gpu_time: float) -> None:
        self.gpu_time, self.waited = gpu_time, False

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, end: FakeMark) -> float:
        return (end.gpu_time - self.gpu_time) * 1000  # milliseconds, as torch's


def test_a_last_window_ends_where_the_gpu_finished_its_last_step(monkeypatch) -> None:
    """The host queues a step and goes on: a last window closed after its last step (the run's
    end, an interrupt) ended at the host's step end, before the GPU ran the step, so its
    tokens/s read high. It ends where the GPU reached the step's end (CUDA events)."""
    clock = FakeClock()
    behind = 2.0  # the GPU finishes each step 2 s after the host queued it
    marks: list[FakeMark] = []

    def mark(event: FakeMark | None = None) -> FakeMark:  # recorded anew: a new time
        queued_after = 0.0 if not marks else behind  # the window's start: the GPU is idle
        marks.append(FakeMark(clock.t + queued_after))
        return marks[-1]

    monkeypatch.setattr(ThroughputMeter, "mark", staticmethod(mark))
    meter = _meter(clock)
    _step(meter, clock, wait=0.0, compute=1.0)  # host: 0 to 1; the GPU: done at 3
    clock.t += 10.0  # the final save
    last = meter.close_window(1, None, None, at_last_step=True)
    assert last["seconds"] == pytest.approx(3.0) and marks[1].waited
    # without CUDA (no marks) the host's step end stands
    monkeypatch.setattr(ThroughputMeter, "mark", staticmethod(lambda event=None: None))
    meter = _meter(clock)
    _step(meter, clock, wait=0.0, compute=1.0)
    clock.t += 10.0
    assert meter.close_window(1, None, None, at_last_step=True)["seconds"] == pytest.approx(1.0)


def test_windows_say_the_tokens_seen_and_the_summary_what_its_mfu_is_made_of(
    tmp_path: Path,
) -> None:
    """Each window records the run's tokens up to its end (a resumed run's earlier ones
    included), so losses of runs of other batch sizes compare at the same tokens; the summary
    holds the terms its MFU is worked out from, which give it again by hand."""
    from types import SimpleNamespace

    from expert_cli.train.callbacks import ThroughputCallback

    fm = FlopsModel(1_000_000, 10_000, 2, 64, 128, 1e12, head_params=200_000)
    clock = FakeClock()
    meter = _meter(clock, fm)
    callback = ThroughputCallback(meter, tmp_path / "metrics.json")
    for step in (1, 2):
        _step(meter, clock, wait=0.0, compute=1.0, tokens=1000, samples=2, trained=500,
              attended=100**2 + 900**2)  # fmt: skip
        callback.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": 2.0})
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert [w["tokens_seen"] for w in written["windows"]] == [1000, 2000]
    summary = callback.finish(2, "completed")
    terms = summary["mfu_terms"]
    assert terms["attended_length"] == pytest.approx(820)
    assert terms["trained_share"] == pytest.approx(0.5)
    assert terms["peak_flops"] == 1e12
    assert terms["flops_per_token"] == pytest.approx(fm.per_token(820, 0.5))
    by_hand = summary["tokens_per_s"] * terms["flops_per_token"] / terms["peak_flops"]
    assert summary["mfu"] == pytest.approx(by_hand)

    # resumed from a checkpoint whose windows say theirs: counted on from there
    earlier = {"windows": written["windows"], "evals": []}
    meter = _meter(clock, fm)
    resumed = ThroughputCallback(meter, tmp_path / "resumed.json", earlier=earlier)
    _step(meter, clock, wait=0.0, compute=1.0, tokens=700)
    resumed.on_log(None, SimpleNamespace(global_step=3), None, logs={"loss": 1.5})
    last = json.loads((tmp_path / "resumed.json").read_text())["windows"][-1]
    assert last["step"] == 3 and last["tokens_seen"] == 2700
    # earlier windows written before the count was: left out, not started again at 0
    old = {"windows": [{k: v for k, v in w.items() if k != "tokens_seen"} for w in
                       written["windows"]], "evals": []}  # fmt: skip
    meter = _meter(clock, fm)
    unknown = ThroughputCallback(meter, tmp_path / "old.json", earlier=old)
    _step(meter, clock, wait=0.0, compute=1.0)
    unknown.on_log(None, SimpleNamespace(global_step=3), None, logs={"loss": 1.5})
    assert "tokens_seen" not in json.loads((tmp_path / "old.json").read_text())["windows"][-1]
    no_mfu = ThroughputCallback(_meter(clock), None)  # a CPU's run: no MFU, so no terms
    _step(no_mfu.meter, clock, wait=0.0, compute=1.0)
    assert "mfu_terms" not in no_mfu.finish(1, "completed")
