"""The optimizer and schedule a run really gets: warmup counted exactly, the constant schedule
with the manifest's warmup, DoRA's magnitudes kept out of weight decay, and the adapter values
that are not applied said in notes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, TrainingArguments

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.errors import UserError
from expert_cli.train.args import training_args_kwargs, warmup_count
from expert_cli.train.trainer import ExpertTrainer


def _resolved(tmp_path: Path, config: dict, entry: dict | None = None):
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    adapter = {"type": "lora", "target_modules": ["q_proj"], **(entry or {})}
    manifest = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": "org/model", "adapters": [adapter]}],
        "training": {"dataset": {"path": "train.jsonl"}, "config": config},
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return resolve(load_manifest(path), cpu_environment())


@pytest.mark.parametrize(
    "ratio,total,expected",
    [(0.07, 100, 7), (0.07, 300, 21), (0.05, 100, 5), (0.03, 233, 7), (0.05, 1, 0), (1.0, 4, 3)],
)
def test_warmup_of_a_ratio_is_the_product_rounded_up(ratio, total, expected) -> None:
    assert warmup_count(ratio, total) == expected


def test_constant_schedule_keeps_the_manifests_warmup_only(tmp_path: Path) -> None:
    given = _resolved(tmp_path, {"lr_scheduler": "constant", "warmup_ratio": 0.2})
    assert given.lr_scheduler == "constant_with_warmup" and given.warmup_ratio == 0.2
    assert any("runs as constant_with_warmup" in n for n in given.notes)
    steps = _resolved(tmp_path, {"lr_scheduler": "constant", "warmup_steps": 3})
    assert steps.lr_scheduler == "constant_with_warmup" and steps.warmup_steps == 3
    plain = _resolved(tmp_path, {"lr_scheduler": "constant"})  # no default warmup added
    assert (plain.lr_scheduler, plain.warmup_ratio, plain.warmup_steps) == ("constant", 0, 0)
    assert not any("constant_with_warmup" in n for n in plain.notes)
    cosine = _resolved(tmp_path, {"lr_scheduler": "cosine"})
    assert cosine.warmup_ratio == 0.03  # the default warmup of every other schedule stays


@pytest.mark.parametrize("written", [{"warmup_ratio": 0}, {"warmup_steps": 0}])
def test_a_written_zero_warmup_is_none(tmp_path: Path, written: dict) -> None:
    """warmup_ratio 0 was read as unset and got the default 3% (the first step then ran at
    lr 0); either field written as 0 is no warmup."""
    cosine = _resolved(tmp_path, {"lr_scheduler": "cosine", **written})
    assert (cosine.warmup_ratio, cosine.warmup_steps) == (0, 0)


def _trainer(tmp_path: Path, model, config: dict) -> ExpertTrainer:
    resolved = _resolved(tmp_path, {**config, "evaluation_strategy": "no"})
    kwargs = training_args_kwargs(resolved, tmp_path / "ckpt", max_steps=100)
    return ExpertTrainer(model=model, args=TrainingArguments(**kwargs))


def test_warmup_ratio_steps_and_dora_decay_in_the_trainer(tmp_path: Path, tiny_model_dir) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], use_dora=True)
    model = get_peft_model(base, config)
    trainer = _trainer(
        tmp_path,
        model,
        {"lr_scheduler": "linear", "warmup_ratio": 0.07, "learning_rate": 1.0, "weight_decay": 0.1},
    )
    decayed = trainer.get_decay_parameter_names(model)
    assert any("lora_A" in n for n in decayed) and any("lora_B" in n for n in decayed)
    assert not any("lora_magnitude_vector" in n for n in decayed)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    groups = trainer.optimizer.param_groups
    magnitudes = {id(p) for n, p in model.named_parameters() if "lora_magnitude_vector" in n}
    assert magnitudes and all(
        g["weight_decay"] == 0 for g in groups if {id(p) for p in g["params"]} & magnitudes
    )
    rates = []
    for _ in range(9):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    # 7 warmup steps (the Trainer counted 8: 0.07 x 100 = 7.000000000000001, rounded up)
    assert rates[7] == pytest.approx(1.0) and rates[6] == pytest.approx(6 / 7)
    assert rates[8] < 1.0


def test_constant_with_the_manifests_warmup_warms_up(tmp_path: Path, tiny_model_dir) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = _trainer(
        tmp_path, model, {"lr_scheduler": "constant", "warmup_steps": 4, "learning_rate": 1.0}
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    rates = []
    for _ in range(6):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert rates == pytest.approx([0, 0.25, 0.5, 0.75, 1.0, 1.0])
    assert torch.isfinite(torch.tensor(rates)).all()


def test_adams_moments_reach_the_optimizer_and_unused_ones_are_said(
    tmp_path: Path, tiny_model_dir
) -> None:
    """adam_beta1, adam_beta2 and adam_epsilon (Axolotl's and the Trainer's names) were
    refused as unknown fields: they reach AdamW's parameter groups; unset, the Trainer's
    defaults are recorded; an optimizer that does not read them says so."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    moments = {"adam_beta1": 0.8, "adam_beta2": 0.95, "adam_epsilon": 1e-6}
    trainer = _trainer(tmp_path, model, moments)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    group = trainer.optimizer.param_groups[0]
    assert (group["betas"], group["eps"]) == ((0.8, 0.95), 1e-6)
    plain = _resolved(tmp_path, {})
    assert (plain.adam_beta1, plain.adam_beta2, plain.adam_epsilon) == (0.9, 0.999, 1e-8)
    assert not any("not used by optim" in n for n in plain.notes)
    sgd = _resolved(tmp_path, {"optim": "sgd", "adam_beta2": 0.95})
    assert "adam_beta2: not used by optim sgd" in sgd.notes
    with pytest.raises(UserError, match="adam_beta2"):
        _resolved(tmp_path, {"adam_beta2": 1.0})  # the running mean would never move


def test_max_grad_norm_0_clips_nothing(tmp_path: Path, tiny_model_dir) -> None:
    """The Trainer's 0 turns clipping off; it was refused (greater than 0 only), so a run
    could not train unclipped. At 0 the adapter trains as at a norm no gradient reaches, not
    as at a small one, and a diverged run's advice asks for clipping, not a lower norm."""
    from safetensors.torch import load_file
    from train_helpers import run_here, write_expert

    from expert_cli.train.divergence import remedies

    resolved = _resolved(tmp_path, {"max_grad_norm": 0})
    assert "max_grad_norm: 0, gradients are not clipped" in resolved.notes
    assert "clipping: training.config.max_grad_norm 1.0 (now 0, no clipping)" in remedies(resolved)
    adapters, logged = {}, {}
    for norm in (0, 1e6, 1e-3):
        folder = tmp_path / f"n{norm:g}"
        manifest = write_expert(folder, tiny_model_dir, rows=16, config={"max_grad_norm": norm})
        proc = run_here("train", "--manifest", str(manifest), "--max-steps", "2")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        adapters[norm] = load_file(folder / "output" / "adapter_model.safetensors")
        windows = json.loads((folder / "output" / "metrics.json").read_text())["windows"]
        logged[norm] = [w.get("grad_norm") for w in windows]
    assert all(torch.equal(adapters[0][k], adapters[1e6][k]) for k in adapters[0])
    assert any(not torch.equal(adapters[0][k], adapters[1e-3][k]) for k in adapters[0])
    assert logged[0] == logged[1e6] and None not in logged[0]  # the norm is logged still


def test_adapter_values_not_applied_are_noted(tmp_path: Path) -> None:
    def notes(config: dict, entry: dict | None = None) -> str:
        return " | ".join(_resolved(tmp_path, config, entry).notes)

    dora = notes({"adapter_kernel": "fused", "adapter_type": "dora", "dropout": 0})
    assert "adapter_kernel" not in dora  # DoRA layers are fused
    grouped = notes({"adapter_kernel": "grouped", "adapter_type": "dora", "dropout": 0})
    assert "adapter_kernel: grouped groups plain LoRA layers; DoRA layers run fused" in grouped
    ia3 = notes({"adapter_kernel": "fused", "adapter_type": "ia3", "dropout": 0})
    assert "adapter_kernel: fused runs LoRA and DoRA layers; ia3 layers run peft's own" in ia3
    assert "adapter_kernel" not in notes({"adapter_kernel": "fused", "dropout": 0.1})
    assert "adapter_kernel" not in notes({"adapter_kernel": "fused", "dropout": 0})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["base_models"][0]["quantization"] = "int4"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    quantized = " | ".join(
        resolve(load_manifest(tmp_path / "manifest.json"), cpu_environment()).notes
    )
    assert "adapter_kernel" not in quantized  # int4 layers are fused
    manifest["base_models"][0]["quantization"] = "int8"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    quantized = " | ".join(
        resolve(load_manifest(tmp_path / "manifest.json"), cpu_environment()).notes
    )
    assert "the int8 base's layers run peft's own" in quantized
    scaled = notes({"dropout": 0}, {"scaling": "quartic"})  # the value is not quoted
    assert "scaling: kept as written, not applied" in scaled and "quartic" not in scaled
    assert "scaling" not in notes({"dropout": 0}, {"scaling": "standard"})
    assert "scaling" not in notes({"adapter_type": "dora", "dropout": 0}, {"scaling": "dora"})


def test_a_checkpoint_whose_optimizer_groups_differ_is_refused_in_a_line(
    tmp_path: Path, tiny_model_dir
) -> None:
    """A DoRA run checkpointed by an earlier expert-cli (magnitude vectors in the decayed
    group) resumed into a torch ValueError traceback about parameter groups."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    trainer = _trainer(tmp_path, model, {"weight_decay": 0.1})
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    old = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    torch.save(old.state_dict(), checkpoint / "optimizer.pt")
    torch.save(trainer.lr_scheduler.state_dict(), checkpoint / "scheduler.pt")
    with pytest.raises(UserError) as caught:
        trainer._load_optimizer_and_scheduler(str(checkpoint))
    assert caught.value.lines[0].startswith(
        "--resume: checkpoint-4 holds an optimizer whose parameter groups are not this run's"
    )


def _said(tmp_path: Path, config: dict, total: int, step: int = 0) -> list[str]:
    """What ScheduleNote says as a run of `total` steps (from `step`) begins, given the
    manifest's `config` through the TrainingArguments a run gets."""
    from transformers import TrainerControl, TrainerState

    from expert_cli.train.callbacks import ScheduleNote

    resolved = _resolved(tmp_path, config)
    args = TrainingArguments(**training_args_kwargs(resolved, tmp_path / "out"))
    said: list[str] = []
    state = TrainerState(max_steps=total, global_step=step)
    ScheduleNote(said.append).on_train_begin(args, state, TrainerControl())
    return said


def test_a_schedule_longer_than_the_run_is_said(tmp_path: Path) -> None:
    """warmup_steps 500 in a 118-step run: the rate peaked at a quarter of the asked one,
    never decayed, and nothing said so; a warmup-stable-decay schedule whose decay outlasts
    the run fell from its first steps. A schedule that fits says nothing."""
    said = _said(tmp_path, {"warmup_steps": 500, "learning_rate": 0.002}, 118)
    assert said == [
        "warmup_steps: 500 of a 118-step run: the learning rate climbs for the whole run and "
        "never reaches its peak 0.002 (about 0.000468 at the last step); give fewer "
        "warmup_steps or a warmup_ratio"
    ]
    # the last step's rate is lr x (118 - 1) / 500: step k gets lr x (k - 1) / warmup
    # a 1-step run under any warm-up: its only step has a rate of 0 (it said "about 0.002")
    assert _said(tmp_path, {"warmup_steps": 1, "learning_rate": 0.002}, 1) == [
        "warmup_steps: 1 of a 1-step run: a warm-up starts at a learning rate of 0, so the "
        "run's only step changes nothing and the adapter adds nothing to the base model; give "
        "warmup_steps 0, or more steps"
    ]
    assert _said(tmp_path, {"warmup_ratio": 0.05}, 1) == []  # 5% of 1 step: no warm-up now
    assert _said(tmp_path, {"warmup_steps": 500}, 118, step=40) == []  # a resume: said before
    assert _said(tmp_path, {"warmup_steps": 10}, 118) == []
    assert _said(tmp_path, {"warmup_ratio": 0.5}, 118) == []
    wsd = {
        "lr_scheduler": "warmup_stable_decay",
        "lr_scheduler_kwargs": {"num_decay_steps": 200},
        "warmup_steps": 0,
    }
    said = _said(tmp_path, wsd, 20)
    assert len(said) == 1 and said[0].startswith(
        "lr_scheduler_kwargs.num_decay_steps: 200 of a 20-step run: the learning rate falls"
    )
    assert _said(tmp_path, {**wsd, "lr_scheduler_kwargs": {"num_decay_steps": 5}}, 20) == []


def test_warmup_stable_decay_phases_that_do_not_fill_the_run_are_said(tmp_path: Path) -> None:
    """A stable phase given beside the decay ended the schedule at step 76 of 118: the last 42
    steps trained at lr 0, in silence; one too long never decayed; a decay longer than the
    run after the warm-up began before the warm-up ended. Counted as the schedule runs."""
    from transformers import get_scheduler

    wsd = {"lr_scheduler": "warmup_stable_decay", "learning_rate": 0.002, "warmup_ratio": 0.05}
    phases = {"num_decay_steps": 20, "num_stable_steps": 50}
    said = _said(tmp_path, {**wsd, "lr_scheduler_kwargs": phases}, 118)
    assert said == [
        "lr_scheduler_kwargs: 6 warm-up + 50 stable + 20 decay steps = 76 of a 118-step run: "
        "its last 42 steps train at the final rate 0; leave num_stable_steps out (the stable "
        "phase then fills the run), or make the phases add up to 118"
    ]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
    schedule = get_scheduler(
        "warmup_stable_decay", optimizer, num_warmup_steps=6, num_training_steps=118,
        scheduler_specific_kwargs=phases,
    )  # fmt: skip
    rates = []
    for _ in range(118):  # step k trains at the rate the schedule gives k - 1
        rates.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert rates.count(0.0) == 42 + 1 and rates[0] == 0.0  # the first warm-up step's too
    long = {"num_decay_steps": 4, "num_stable_steps": 20}
    said = _said(tmp_path, {**wsd, "lr_scheduler_kwargs": long}, 12)
    assert len(said) == 1 and said[0].endswith(
        "= 25 of a 12-step run: the rate never decays; leave num_stable_steps out (the stable "
        "phase then fills the run), or make the phases add up to 12"
    )
    cut = {"num_decay_steps": 10, "num_stable_steps": 5}
    assert (
        "the decay is cut short at step 12 of its 16"
        in _said(tmp_path, {**wsd, "lr_scheduler_kwargs": cut}, 12)[0]
    )
    overlap = {**wsd, "warmup_steps": 10, "lr_scheduler_kwargs": {"num_decay_steps": 4}}
    del overlap["warmup_ratio"]
    assert _said(tmp_path, overlap, 12) == [
        "lr_scheduler_kwargs.num_decay_steps: 4 after 10 warm-up steps of a 12-step run: the "
        "decay begins at step 9, before the warm-up ends, and the rate never reaches its peak; "
        "give fewer decay or warm-up steps"
    ]
    fits = {"num_decay_steps": 20, "num_stable_steps": 92}
    assert _said(tmp_path, {**wsd, "lr_scheduler_kwargs": fits}, 118) == []


def test_data_wait_times_the_fetch_not_the_exchange_of_token_counts(
    tmp_path: Path, tiny_model_dir
) -> None:
    """The step's trained tokens are summed over every process after the fetch; on gloo that
    gather waits for the slowest process, and it was timed as data wait (a 2-process CPU run
    read 26.5% data-wait, 3.1% without it). The fetch alone is timed now."""
    from expert_cli.data.collate import COUNTS_KEY
    from expert_cli.telemetry.throughput import ThroughputMeter

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, lora_alpha=8)
    )
    trainer = _trainer(tmp_path, model, {})
    now = [0.0]
    trainer.meter = ThroughputMeter(None, clock=lambda: now[0], sync=lambda: None)

    def fetched():  # a batch the loader takes 0.5 s to give
        now[0] += 0.5
        labels = torch.tensor([[-100, 5, 6, 7]])
        yield {"input_ids": labels.abs(), "labels": labels, COUNTS_KEY: (4, 1, 3, 16)}

    def counted(batches, device):  # the exchange of counts: 5 s waiting for another process
        now[0] += 5.0
        return torch.tensor(3)

    trainer._get_num_items_in_batch = counted
    batches, items = trainer.get_batch_samples(fetched(), 1, "cpu")
    assert len(batches) == 1 and COUNTS_KEY not in batches[0] and int(items) == 3
    assert trainer.meter.win["wait"] == 0.5 and trainer.meter.win["tokens"] == 4


def test_length_groups_are_made_of_the_global_batch(tmp_path: Path, tiny_model_dir, monkeypatch):
    """transformers sizes group_by_length's megabatches by one process's batch: 2 processes x
    2 rows grouped other rows together than 1 x 4, and the loss curve differed from step 1
    (equal through the first epoch now, measured on gloo). The sampler takes the global one."""
    import datasets
    from transformers.trainer_pt_utils import LengthGroupedSampler

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, lora_alpha=8)
    )
    trainer = _trainer(
        tmp_path,
        model,
        {
            "packing": False,
            "group_by_length": True,
            "batch_size": 2,
            "gradient_accumulation_steps": 3,
        },
    )
    rows = datasets.Dataset.from_dict({"input_ids": [[1]] * 64, "num_tokens": list(range(64))})
    alone = trainer._get_train_sampler(rows)
    assert isinstance(alone, LengthGroupedSampler) and alone.batch_size == 6
    monkeypatch.setattr(type(trainer.args), "world_size", property(lambda self: 2))
    assert trainer._get_train_sampler(rows).batch_size == 12


STOPPED_EARLY = {"early_stopping_patience": 2, "early_stopping_threshold": 1e5,
                 "evaluation_strategy": "steps", "eval_steps": 1, "save_steps": 1,
                 "logging_steps": 5}  # fmt: skip


def _early_stopped(tmp_path: Path, model: Path, **extra: object) -> tuple[Path, Path, str]:
    """A run that early stopping stops at step 3 of 12 (patience 2, a threshold no loss can
    beat, an evaluation each step): its manifest, output folder and what it said."""
    from train_helpers import run_here, write_expert

    config = {**STOPPED_EARLY, **extra}
    manifest = write_expert(tmp_path / "e", model, rows=48, valid_rows=4, config=config)
    proc = run_here("train", "--manifest", str(manifest), "--max-steps", "12")
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, said
    return manifest, tmp_path / "e" / "output", said


def test_early_stopping_stops_on_the_evaluation_loss_and_says_where(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`early_stopping_patience` 2, with a threshold no loss can beat: the first evaluation
    sets the best, the next two do not improve on it, and the run stops at step 3 of 12,
    saying so in a note and in metrics.json; its adapter is saved (the run completed). A
    resumed run goes on counting (next test); without evaluations the field is exit 2."""
    from train_helpers import run_here, write_expert

    manifest, output, said = _early_stopped(tmp_path, tiny_model_dir)
    assert (
        "stopped early at step 3 of 12: 2 evaluations in a row without the loss improving by "
        "more than 100000 (early_stopping_patience); the lowest eval_loss"
    ) in said
    assert "set load_best_model_at_end to ship the best" in said  # the last step's ships
    assert "EarlyStoppingCallback" not in said  # transformers' own warning: the note says it
    metrics = json.loads((output / "metrics.json").read_text())
    summary, evals = metrics["summary"], metrics["evals"]
    assert summary["status"] == "completed" and summary["steps"] == 3 and len(evals) == 3
    # the steps after the last logged window have their loss (logging_steps 5 logged none:
    # the run's final loss was null)
    assert metrics["windows"][-1]["step"] == 3 and summary["final_loss"] is not None
    stopped = summary["stopped_early"]
    lowest = min(evals, key=lambda e: e["eval_loss"])
    assert (stopped["step"], stopped["of"], stopped["best_step"]) == (3, 12, lowest["step"])
    assert stopped["best_eval_loss"] == pytest.approx(lowest["eval_loss"])
    assert f"the lowest eval_loss {lowest['eval_loss']:.4g}, at step {lowest['step']}" in said
    assert (output / "adapter_model.safetensors").is_file()
    # a --resume of it (a scheduler re-queuing the command) trained on past the stop and
    # replaced its adapter: the run is complete at the length it was given
    adapter = (output / "adapter_model.safetensors").read_bytes()
    again = run_here("train", "--manifest", str(manifest), "--max-steps", "12", "--resume")
    said = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 0, said
    assert "holds a finished run of 3 steps (stopped early, of 12: early_stopping_patience)" in said
    assert (output / "adapter_model.safetensors").read_bytes() == adapter
    # with load_best_model_at_end the stop names the checkpoint the final adapter is
    best = write_expert(tmp_path / "b", tiny_model_dir, rows=48, valid_rows=4,
                        config={**STOPPED_EARLY, "load_best_model_at_end": True})  # fmt: skip
    proc = run_here("train", "--manifest", str(best), "--max-steps", "12")
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, said
    evals = json.loads((tmp_path / "b" / "output" / "metrics.json").read_text())["evals"]
    lowest = min(evals, key=lambda e: e["eval_loss"])["step"]  # every step saved
    assert f"at step {lowest}; the final adapter is checkpoint-{lowest}'s" in said, said

    # no evaluation: nothing to stop on
    config = {"early_stopping_patience": 2, "evaluation_strategy": "no"}
    bare = write_expert(tmp_path / "n", tiny_model_dir, rows=8, config=config)
    refused = run_here("check", "--manifest", str(bare))
    text = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2 and "early_stopping_patience needs evaluation_strategy" in text
    data = json.loads(bare.read_text())
    del data["training"]["config"]["evaluation_strategy"]
    data["training"]["dataset"]["eval_fraction"] = 0.0
    bare.write_text(json.dumps(data))
    refused = run_here("check", "--manifest", str(bare))
    text = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2, text
    assert "training.config.early_stopping_patience: reads the evaluation loss" in text


def test_a_resumed_run_goes_on_counting_evaluations_without_improvement(tmp_path: Path) -> None:
    """The count is kept in the checkpoint's trainer_state.json (as transformers keeps a
    stateful callback's) and read back by the resumed run's callback."""
    from types import SimpleNamespace

    from transformers import TrainerState

    from expert_cli.telemetry.throughput import ThroughputMeter
    from expert_cli.train.callbacks import ThroughputCallback
    from expert_cli.train.early_stop import EarlyStop

    throughput = ThroughputCallback(ThroughputMeter(None), None)
    before = EarlyStop(3, 0.0, throughput)
    before.early_stopping_patience_counter = 2
    TrainerState(stateful_callbacks=[before]).save_to_json(str(tmp_path / "trainer_state.json"))
    state = TrainerState.load_from_json(str(tmp_path / "trainer_state.json"))
    state.best_metric, state.best_global_step, state.global_step, state.max_steps = 2.0, 4, 6, 9
    after = EarlyStop(3, 0.0, throughput)
    after.on_train_begin(SimpleNamespace(), state, SimpleNamespace())
    assert after.early_stopping_patience_counter == 2 and after.lowest == (2.0, 4)
    args = SimpleNamespace(metric_for_best_model="eval_loss", greater_is_better=False)
    control = SimpleNamespace(should_training_stop=False)
    after.on_evaluate(args, state, control, {"eval_loss": 2.5})  # the third without improving
    assert control.should_training_stop
    assert throughput.extra["stopped_early"] == {
        "step": 6, "of": 9, "best_eval_loss": 2.0, "best_step": 4}  # fmt: skip


def test_early_stopping_keeps_its_own_lowest_and_its_last_evaluation_is_no_stop() -> None:
    """Found by a review: with `save_strategy: no` the Trainer keeps no best step (the note
    said "at step None"); a run whose patience ran out at its last evaluation trained every
    step (it said "stopped early at step 20 of 20"); a checkpoint of a run without early
    stopping has no entry for it, which the Trainer's next save looked up (KeyError)."""
    from types import SimpleNamespace

    from transformers import TrainerState

    from expert_cli.telemetry.throughput import ThroughputMeter
    from expert_cli.train.callbacks import ThroughputCallback
    from expert_cli.train.early_stop import EarlyStop

    said: list[str] = []
    throughput = ThroughputCallback(ThroughputMeter(None), None)
    stop = EarlyStop(1, 0.0, throughput, said.append)
    state = TrainerState(max_steps=9)  # resumed from a checkpoint of a run without it
    state.stateful_callbacks = {}
    stop.on_train_begin(SimpleNamespace(), state, SimpleNamespace())
    assert state.stateful_callbacks["EarlyStop"]["attributes"] == {
        "early_stopping_patience_counter": 0
    }
    args = SimpleNamespace(metric_for_best_model="eval_loss", greater_is_better=False)
    control = SimpleNamespace(should_training_stop=False)
    for step, loss in ((2, 2.0), (4, 2.5)):  # best_metric is the Trainer's (no best step)
        state.global_step = step
        stop.on_evaluate(args, state, control, {"eval_loss": loss})
        state.best_metric = min(loss, state.best_metric or loss)
    assert control.should_training_stop
    assert throughput.extra["stopped_early"] == {
        "step": 4, "of": 9, "best_eval_loss": 2.0, "best_step": 2}  # fmt: skip
    assert not said  # said as training ends, when the adapter kept is known
    stop.on_train_end(SimpleNamespace(load_best_model_at_end=False), state, control)
    assert said[-1].endswith("the lowest eval_loss 2, at step 2")
    last = ThroughputCallback(ThroughputMeter(None), None)
    at_end = EarlyStop(1, 0.0, last)
    state = TrainerState(max_steps=4, global_step=4, best_metric=2.0)
    at_end.early_stopping_patience_counter = 0
    at_end.on_train_begin(SimpleNamespace(), state, SimpleNamespace())
    at_end.on_evaluate(args, state, SimpleNamespace(should_training_stop=False), {"eval_loss": 3})
    assert "stopped_early" not in last.extra  # the run's last step: it trained them all


def test_a_step_that_evaluates_logs_its_window() -> None:
    """Early stopping decides at an evaluation, after the step's log: a step that evaluates
    (every eval_steps, or an epoch's end under evaluation_strategy epoch) logs, so the run's
    last window has its loss."""
    from types import SimpleNamespace

    from expert_cli.telemetry.throughput import ThroughputMeter
    from expert_cli.train.callbacks import ThroughputCallback, _evaluates

    steps = SimpleNamespace(eval_strategy="steps", eval_delay=0)
    assert _evaluates(steps, SimpleNamespace(eval_steps=7, global_step=14))
    assert not _evaluates(steps, SimpleNamespace(eval_steps=7, global_step=15))
    assert not _evaluates(SimpleNamespace(eval_strategy="steps", eval_delay=20),
                          SimpleNamespace(eval_steps=7, global_step=14))  # fmt: skip
    assert not _evaluates(SimpleNamespace(eval_strategy="no", eval_delay=0),
                          SimpleNamespace(eval_steps=7, global_step=14))  # fmt: skip
    callback = ThroughputCallback(ThroughputMeter(None), None)
    for strategy, logs in (("epoch", True), ("steps", False)):
        control = SimpleNamespace(should_log=False)
        callback.on_epoch_end(SimpleNamespace(eval_strategy=strategy), SimpleNamespace(), control)
        assert control.should_log is logs


def test_eval_on_start_gives_the_bases_loss_apart(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`eval_on_start` evaluates the base before the first step: shown as the base's, kept
    out of the best evaluation and of early stopping's count, not evaluated again by a resume;
    report says when no later evaluation is below it."""
    from train_helpers import run_here, write_expert

    from expert_cli.train.report import summarize

    _, output, said = _early_stopped(tmp_path, tiny_model_dir, eval_on_start=True)
    config = {"eval_on_start": True, "evaluation_strategy": "steps", "eval_steps": 1,
              "save_steps": 1, "logging_steps": 5}  # fmt: skip
    assert "eval step 0 eval_loss" in said and "(before training)" in said
    assert "stopped early at step 3 of 12" in said  # the base's evaluation not counted
    metrics = json.loads((output / "metrics.json").read_text())
    assert [e["step"] for e in metrics["evals"]] == [0, 1, 2, 3]
    # the evaluation before the first window was left out of it: 4e12 tok/s there
    assert all(w["tokens_per_s"] < 1e8 for w in metrics["windows"]), metrics["windows"]
    assert metrics["summary"]["tokens_per_s"] < 1e8
    report = summarize(output)
    base = metrics["evals"][0]["eval_loss"]
    later = min(metrics["evals"][1:], key=lambda e: e["eval_loss"])
    assert report.base_eval_loss == pytest.approx(base)
    assert (report.best_eval_loss, report.best_eval_step) == (
        pytest.approx(later["eval_loss"]),
        later["step"],
    )
    metrics["evals"][0]["eval_loss"] = later["eval_loss"] / 2  # the base lower than any since
    (output / "metrics.json").write_text(json.dumps(metrics))
    notes = " ".join(text for _, text in summarize(output).adapters.notes)
    assert "no evaluation after the first step is below the eval loss before training" in notes
    shown = run_here("report", str(output))
    assert "(before training:" in " ".join(shown.stdout.split()), shown.stdout
    resumed = write_expert(tmp_path / "r", tiny_model_dir, rows=48, valid_rows=4, config=config)
    for steps, flags in (("2", []), ("3", ["--resume"])):
        done = run_here("train", "--manifest", str(resumed), "--max-steps", steps, *flags)
        assert done.returncode == 0, done.stdout + done.stderr
    evals = json.loads((tmp_path / "r" / "output" / "metrics.json").read_text())["evals"]
    assert [e["step"] for e in evals] == [0, 1, 2, 3]  # the resume did not evaluate at its start
    off = write_expert(tmp_path / "off", tiny_model_dir, rows=8,
                       config={"eval_on_start": True, "evaluation_strategy": "no"})  # fmt: skip
    refused = run_here("check", "--manifest", str(off))
    assert refused.returncode == 2
    assert (
        "eval_on_start needs evaluation_strategy steps or epoch" in refused.stdout + refused.stderr
    )
    implicit = write_expert(
        tmp_path / "none", tiny_model_dir, rows=8, config={"eval_on_start": True}
    )
    data = json.loads(implicit.read_text())
    data["training"]["dataset"]["eval_fraction"] = 0  # nothing held out, no validation file
    data["training"]["config"].pop("evaluation_strategy", None)
    implicit.write_text(json.dumps(data))
    refused = run_here("check", "--manifest", str(implicit))
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2, said
    assert (
        "training.config.eval_on_start: reads the evaluation loss, and this run evaluates" in said
    )


def test_early_stopping_keeps_the_evaluation_before_training_out() -> None:
    """The lowest loss early stopping names is of a step trained: with the base lowest it
    said "no eval_loss a number" (its step, 0, read as none)."""
    from types import SimpleNamespace

    from expert_cli.train.early_stop import EarlyStop

    stop = EarlyStop(2, 0.0, SimpleNamespace(extra={}), say=lambda text: None)
    args = SimpleNamespace(metric_for_best_model="eval_loss", greater_is_better=False)
    state = SimpleNamespace(global_step=0, max_steps=12, best_metric=None, best_global_step=None)
    control = SimpleNamespace(should_training_stop=False)
    for step, loss in ((0, 1.0), (1, 2.0), (2, 2.5), (3, 2.6)):
        state.global_step = step
        stop.on_evaluate(args, state, control, {"eval_loss": loss})
        if step and (state.best_metric is None or loss < state.best_metric):
            state.best_metric = loss  # as the Trainer keeps it, after its callbacks
    assert stop.lowest == (2.0, 1)
    assert stop.said is not None and "the lowest eval_loss 2, at step 1" in stop.said


def test_a_resume_to_more_steps_trains_its_first_step_at_the_new_schedules_rate(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A linear schedule of 4 steps ends at lr 0, and the optimizer's saved rate was that 0:
    a --resume to --max-steps 8 trained its first step at lr 0 (checkpoint-5's weights were
    checkpoint-4's). It trains at the 8-step schedule's rate at step 4, half the peak."""
    from safetensors.torch import load_file
    from train_helpers import run_here, write_expert

    config = {"lr_scheduler": "linear", "save_steps": 1, "save_total_limit": None}
    manifest = write_expert(tmp_path, tiny_model_dir, rows=48, config=config)
    args = ("train", "--manifest", str(manifest), "--max-steps")
    assert run_here(*args, "4").returncode == 0
    again = run_here(*args, "8", "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    output = tmp_path / "output"
    windows = json.loads((output / "metrics.json").read_text())["windows"]
    rates = {w["step"]: w["learning_rate"] for w in windows}
    assert rates[4] == pytest.approx(2e-3 * 1 / 4)  # the first run's schedule, step 3 of 4
    assert rates[5] == pytest.approx(2e-3 * 4 / 8)  # the new one's, at step 4 of 8
    assert rates[6] == pytest.approx(2e-3 * 3 / 8)
    weights = [
        load_file(output / "checkpoints" / f"checkpoint-{step}" / "adapter_model.safetensors")
        for step in (4, 5)
    ]
    moved = max((weights[1][k] - weights[0][k]).abs().max().item() for k in weights[0])
    assert moved > 1e-5
