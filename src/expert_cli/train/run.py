"""`expert-cli train`, top to bottom: setup, data, model, Trainer, train, save.

The same code runs alone, under `torchrun --nproc_per_node N` and under `accelerate launch`
(DDP; FSDP/DeepSpeed from the manifest's `distributed` block). Only the main process reports
(through a `Reporter`, which the CLI turns into what a person reads) and writes outputs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import PrinterCallback
from transformers.utils import logging as hf_logging

from expert_cli.atomic import sigterm_raises
from expert_cli.config import load_manifest
from expert_cli.config.environment import crowded_gpus, probe_environment, unlaunched_world
from expert_cli.config.evaluated_tasks import metric_task, unmeasured_task
from expert_cli.config.loading import apply_overrides
from expert_cli.config.resolve import ResolvedConfig, resolve
from expert_cli.config.warm_start import init_adapter_problem
from expert_cli.data import PreparedData, prepare_data
from expert_cli.data.hub import hub_refs, require_hub
from expert_cli.data.model_files import base_file_problems, kept_base_problem
from expert_cli.data.splits import NO_EVAL_ROWS
from expert_cli.data.tokenizer import ids_in_use, load_tokenizer
from expert_cli.errors import Interrupted, Terminated, UserError
from expert_cli.train import distributed
from expert_cli.train.adapter import start_problem
from expert_cli.train.architecture import cache_id_problem, positions_note, untrained_tokens_note
from expert_cli.train.args import (
    few_steps_note,
    joined,
    length_notes,
    one_gpu,
    planned_steps,
    training_args_kwargs,
)
from expert_cli.train.base_decoding import own_generation_config
from expert_cli.train.batch import plan_run_batch
from expert_cli.train.callbacks import (
    AdaLoraCallback,
    ResumedIntervals,
    ScheduleNote,
    earlier_records,
)
from expert_cli.train.causality import checked_isolation
from expert_cli.train.checkpoints import CheckpointMarker, checkpoint_step, finished_from
from expert_cli.train.choice import FINAL_STEP, final_step
from expert_cli.train.data_record import BASE_CONFIG_KEY, base_config_digest, refuse_changed_data
from expert_cli.train.divergence import DivergenceWatch
from expert_cli.train.early_stop import EarlyStop
from expert_cli.train.final_save import end_run, stopped_at_once
from expert_cli.train.folder_guard import FolderGuard, busy, claim
from expert_cli.train.fused_lora import is_fused
from expert_cli.train.grouped_lora import COMPILED_UNGROUPED, NOTHING_GROUPED, is_grouped
from expert_cli.train.lora_init import INIT_DIGEST, INIT_WEIGHTS, start_digest
from expert_cli.train.memory import Stopped, stage_out_of_memory
from expert_cli.train.model import (
    adapter_compute_dtype,
    attach_run_adapter,
    autocast_dtype,
    build_random_model,
    load_base_model,
    weight_dtype,
)
from expert_cli.train.model_flops import parameter_counts
from expert_cli.train.neftune import Neftune
from expert_cli.train.output_place import refuse_output_place
from expert_cli.train.outputs import (
    ADAPTER_WEIGHTS,
    RANDOM_BASE,
    held_by_another,
    materialize_random_base,
    output_dir,
    write_resolved,
)
from expert_cli.train.package_manifest import author_notes
from expert_cli.train.run_folder import (
    MAX_STEPS_KEY,
    decide,
    resumed_max_steps,
    set_aside,
    sweep_leftovers,
)
from expert_cli.train.session import Reporter, Run, Silent, TrainOptions, TrainResult
from expert_cli.train.speed import compile_decision, compile_layers
from expert_cli.train.stop_signal import Interrupt, InterruptCallback
from expert_cli.train.task_evals import evaluated_alone
from expert_cli.train.tracker_guard import guard_trackers, tensorboard
from expert_cli.train.trainer import Telemetry, build_trainer

__all__ = ["Reporter", "Run", "Silent", "TrainOptions", "TrainResult", "train"]


def setup(opts: TrainOptions, reporter: Reporter) -> tuple[Run, Path | None]:
    """Manifest -> resolved config, output folder, TrainingArguments (starts distributed)."""
    hf_logging.set_verbosity_warning()  # our reporter shows progress: transformers' own
    hf_logging.disable_progress_bar()  # bars and info logs would interleave with it
    loaded = load_manifest(opts.manifest, opts.overrides)
    env = probe_environment()
    if (crowded := crowded_gpus(env)) is not None:
        raise UserError(crowded)
    resolved = resolve(loaded, env)
    given = apply_overrides(loaded.raw, list(opts.overrides))  # as the package will hold it
    resolved.notes += author_notes(given, resolved.model_dump(mode="json"))
    output = output_dir(loaded.path, opts.output)
    sources = resolved.train_sources + resolved.validation_sources + resolved.test_sources
    refuse_output_place(output, loaded.folder, sources)
    if not opts.resume and (problem := init_adapter_problem(resolved, output)):
        raise UserError(problem)  # a resume's weights are its checkpoint's: not read then
    max_steps, said = resumed_max_steps(output, opts.resume, opts.max_steps, resolved)
    resolved.notes = length_notes(resolved.notes, max_steps)
    kwargs = training_args_kwargs(
        resolved, output / "checkpoints", max_steps=max_steps, on_gpu=env.has_gpu
    )
    if (note := unlaunched_world(os.environ)) is not None:
        reporter.note(note)
    args = joined(kwargs)
    if (note := one_gpu(args)) is not None:
        reporter.note(note)
    run = Run(resolved=resolved, args=args, output=output, reporter=reporter, source=loaded.raw)
    run.runtime["overrides"] = list(opts.overrides)  # the --set values, not in manifest.source.json
    run.runtime[MAX_STEPS_KEY] = max_steps
    run.runtime[BASE_CONFIG_KEY] = base_config_digest(resolved)
    resume = _take_folder(run, opts.resume, opts.overwrite, said)
    run.runtime.update(
        environment=env.to_dict(),
        world_size=args.world_size,
        has_eval=resolved.evaluation_strategy != "no",
        resumed_from=str(resume) if resume else None,
    )
    if resume and (output / ADAPTER_WEIGHTS[0]).is_file() and (step := final_step(output)):
        run.runtime[FINAL_STEP] = step  # the resumed run's final adapter stays until one is saved
    run.args.eval_on_start = run.args.eval_on_start and resume is None  # before training only
    return run, resume


def _take_folder(run: Run, resume_asked: bool, overwrite: bool, said: str) -> Path | None:
    """The run's claim on its output folder (the earlier run's outputs set aside under
    --overwrite); the checkpoint a --resume continues from."""
    output, reporter = run.output, run.reporter
    missing = [p for p in (output, *output.parents) if not os.path.lexists(p)]
    run.created = missing[-1] if missing else None  # runs/a/b new: runs goes if it stops
    if run.is_main and (swept := sweep_leftovers(output)):
        reporter.note(f"cleaned up after a killed run in {output}: {', '.join(swept)}")
    # a run still going there: say so on every rank (not what its half-written folder holds);
    # the collective is also the barrier before every rank decides on the same folder
    if distributed.any_rank(run.is_main and held_by_another(output)):
        raise busy(output)
    max_steps = run.runtime[MAX_STEPS_KEY]
    decision = decide(output, run.resolved, resume_asked, overwrite, max_steps, run.args.world_size)
    if run.is_main and decision.complete is None:
        run.hold = claim(output)  # before anything in the folder is moved or written
    resume, run.complete = decision.resume, decision.complete
    if run.is_main:
        if said:  # once the run is known to go on (a length it passed already is refused)
            reporter.note(said)
        for damaged in decision.passed_over:
            reporter.note(f"--resume: passing over {damaged}")
    try:  # a signal from here on: the folder as it was (claim made it, set_aside moved it)
        distributed.barrier()  # and before the main process sets the earlier run aside
        if decision.clear and run.is_main:
            run.aside, moved = set_aside(output)
            reporter.note(
                f"--overwrite: the earlier run's {', '.join(moved)} set aside; removed once "
                "this run starts training, put back if it stops before"
            )
    except BaseException as exc:
        run.release()
        run.stopped_before_training(exc)
        raise
    return resume


def load_data(run: Run, resume: Path | None = None) -> tuple[Any, PreparedData]:
    """Tokenizer, then the token cache (the data validated before any model loads); hub refs
    neither cached nor downloadable, a base model that cannot take the adapter (built with no
    weights), and a resume on edited data fail first, in seconds."""
    resolved = run.resolved
    require_hub(hub_refs(resolved), resolved.train_sources + resolved.validation_sources)
    if bad := base_file_problems(
        resolved.base_model, resolved.base_model_kind, resolved.revision, resolved.init
    ):  # a shard missing, an LFS pointer...: before the tokenizer is read from them
        raise UserError(bad)
    tokenizer = load_tokenizer(resolved)
    if problem := start_problem(resolved, ids_in_use(tokenizer)):
        raise UserError(problem)  # before any data is tokenized or weights read
    if resume:
        notes = refuse_changed_data(run.output, resolved, tokenizer)
        for note in notes if run.is_main else []:
            run.reporter.note(note)
    progress = run.reporter.build_progress() if run.is_main else None
    with run.args.main_process_first(desc="token cache"):
        data = prepare_data(run.resolved, tokenizer, progress=progress)
    if run.is_main:
        run.reporter.data(data)
    distributed.refuse_differing_data(data)  # node-local copies that are not the same
    if run.args.eval_strategy != "no" and data.eval is None:
        raise UserError(NO_EVAL_ROWS)
    run.runtime["data"] = {"stats": data.stats, "cache_dir": str(data.cache_dir)}
    run.runtime["data"] |= {"built": data.built, "reason": data.reason}
    return tokenizer, data


def load_model(run: Run, tokenizer: Any, data: PreparedData, resume: Path | None) -> Any:
    """Base model (a random init is materialised to OUTPUT/base_model first), adapter, batch
    plan and compilation."""
    resolved, device = run.resolved, run.device
    source = _random_base(run, tokenizer, resume)
    with stage_out_of_memory(resolved, Stopped("load", device=device)):
        model, choices = load_base_model(resolved, device, str(source) if source else None)
    if problem := cache_id_problem(model, data.largest_id(), resolved.base_model):
        raise UserError(problem)
    if resolved.init != "random" and (
        note := untrained_tokens_note(model, tokenizer, data.ids_present)
    ):
        choices.notes.append(note)
    if note := positions_note(model, data.longest_example(), resolved.base_model):
        choices.notes.append(note)
    dtype, kernel = autocast_dtype(resolved), choices.attn_implementation
    verdict = choices.attention_isolation = checked_isolation(model, kernel, resolved, dtype)
    if verdict.startswith("not probed"):
        choices.notes.append(
            f"attention: {verdict}; whether packed examples stay apart is not checked"
        )
    steps = planned_steps(resolved, len(data.train), run.args.world_size, run.args.max_steps)
    if run.args.max_steps <= 0 and (
        note := few_steps_note(resolved, steps, len(data.train), run.args.world_size)
    ):
        choices.notes.append(note)
    run.args.logging_steps = min(run.args.logging_steps, steps)  # a loss for a short run too
    if resume is not None and run.is_main:
        at = resume.name.rsplit("-", 1)[-1]
        run.reporter.note(f"resuming from {resume.name} (step {at} of {steps})")
    initial = run.output / INIT_WEIGHTS if run.is_main else None  # a decomposed base's A0 B0
    peft_model, notes = attach_run_adapter(model, resolved, steps, resume, initial)
    choices.adapter_precision = adapter_compute_dtype(resolved)
    choices.fused_lora_layers = sum(1 for m in peft_model.modules() if is_fused(m))
    choices.grouped_lora_layers = sum(1 for m in peft_model.modules() if is_grouped(m))
    ungrouped = resolved.adapter_kernel == "grouped" and not choices.grouped_lora_layers
    if ungrouped and choices.fused_lora_layers and not resolved.use_dora:  # DoRA's: noted
        choices.notes.append(NOTHING_GROUPED)
    choices.notes += notes
    if resolved.batch_auto and device.startswith("cuda"):
        with stage_out_of_memory(resolved, Stopped("probe", device=device)):
            plan_run_batch(run, peft_model, tokenizer, data, choices)
    _compiled(peft_model, resolved, device, choices)
    trainable, total = parameter_counts(peft_model)
    if run.is_main:
        run.reporter.decisions(run.resolved, choices, (trainable, total))
    run.runtime["model"] = {
        **choices.__dict__,
        "trainable_params": trainable,
        "total_params": total,
        "base_weights": str(source or resolved.base_model),
        INIT_DIGEST: start_digest(initial),
    }
    return peft_model


def _random_base(run: Run, tokenizer: Any, resume: Path | None) -> Path | None:
    """Where a random-init base is materialised (OUTPUT/base_model; kept by a resume), by the
    main process while the others wait; None for a pretrained base."""
    if run.resolved.init != "random":
        return None
    source = run.output / RANDOM_BASE
    kept = resume and (source / "config.json").is_file()
    if kept and run.is_main and (problem := kept_base_problem(source)):
        raise UserError(problem)
    if run.is_main and not kept:
        dtype = weight_dtype(run.resolved, run.device.startswith("cuda"))
        random_model = build_random_model(run.resolved, dtype, "eager", run.device)
        own_generation_config(random_model, run.resolved)
        materialize_random_base(random_model, tokenizer, source)
        del random_model
    distributed.barrier()
    return source


def _compiled(peft_model: Any, resolved: ResolvedConfig, device: str, choices: Any) -> None:
    """The decoder layers compiled where torch_compile says so (grouping then off), noted."""
    compile_on, why = compile_decision(resolved.torch_compile, device.startswith("cuda"))
    if compile_on:
        choices.compiled_layers = compile_layers(
            peft_model, resolved.torch_compile_backend, resolved.torch_compile_mode
        )
        if choices.grouped_lora_layers:  # traced, a group's layers run one by one
            choices.grouped_lora_layers = 0
            choices.notes.append(COMPILED_UNGROUPED)
    if why != "off":  # a plain "off" repeated the step line's "torch.compile off"
        choices.notes.append(f"torch_compile: {why}")


def make_trainer(
    run: Run, model: Any, tokenizer: Any, data: PreparedData, interrupt: Interrupt
) -> tuple[Any, Any, InterruptCallback, DivergenceWatch]:
    """The Trainer with telemetry, the reporter's callbacks, Ctrl-C, the divergence watch and
    TensorBoard."""
    metrics = run.output / "metrics.json"
    telemetry = Telemetry(
        metrics_path=metrics if run.is_main else None,
        on_window=run.reporter.window if run.is_main else None,
        earlier=earlier_records(metrics, run.runtime.get("resumed_from")),
        world_size=run.args.world_size,
        gather=distributed.gather_over_ranks,
    )
    kernel = run.runtime["model"]["attn_implementation"]
    trainer, throughput = build_trainer(model, run.args, data, tokenizer, kernel, telemetry)
    trainer.remove_callback(PrinterCallback)  # the reporter shows progress instead
    run.runtime["distributed"] = topology = distributed.topology(trainer)
    if run.is_main and topology["world_size"] > 1:
        asked = (run.resolved.distributed or {}).get("strategy", "ddp")
        run.reporter.note(distributed.describe(topology, asked))
    stop = InterruptCallback(interrupt, distributed.any_rank)
    watch, say = DivergenceWatch(), run.reporter.note if run.is_main else None
    extra = [*run.reporter.callbacks(), ScheduleNote(run.reporter.note)] if run.is_main else []
    marks = [CheckpointMarker(), ResumedIntervals(), tensorboard(run.output, say)]
    for callback in [*extra, stop, watch, *marks]:
        if callback is not None:
            trainer.add_callback(callback)
    task = metric_task(run.resolved.metric_for_best_model)  # one evaluated, or a KeyError
    if task and run.args.eval_strategy != "no" and task not in (trainer.task_names or []):
        if task not in evaluated_alone(data.stats):
            raise UserError(unmeasured_task(run.resolved.metric_for_best_model, task))
        run.args.metric_for_best_model = "eval_loss"  # the split is that task's alone
    if run.hold is not None:  # first: before any callback writes into the folder
        trainer.callback_handler.callbacks.insert(0, FolderGuard(run.hold, run.output))
    trainer.loraplus_ratio = run.resolved.loraplus_lr_ratio
    guard_trackers(trainer, say)
    if run.resolved.adapter_type == "adalora":
        trainer.add_callback(AdaLoraCallback(model))
    if run.resolved.neftune_noise_alpha:  # noise while training, each example by its length
        Neftune(model, run.resolved.neftune_noise_alpha)
    if patience := run.resolved.early_stopping_patience:  # every process stops at once
        threshold = run.resolved.early_stopping_threshold
        trainer.add_callback(EarlyStop(patience, threshold, throughput, say))
    return trainer, throughput, stop, watch


def train(opts: TrainOptions, reporter: Reporter | None = None) -> TrainResult:
    """Train the manifest's adapter; on SIGINT/SIGTERM save a checkpoint and stop (before
    training begins: stop at once, the folder left as it was)."""
    with sigterm_raises():  # as SIGINT does: what the run did to its folder is undone
        run, resume = setup(opts, reporter or Silent())
        if run.complete is not None:
            summary = {"steps": run.complete.steps, "status": "complete",
                       "stopped_early_of": run.complete.planned}  # fmt: skip
            return TrainResult(run.output, "complete", 0, summary, None, run.is_main)
        try:
            return _train(run, resume)
        finally:
            run.release()


def _train(run: Run, resume: Path | None) -> TrainResult:
    """The run from data to saved adapter, once its folder is held."""
    run.resuming = resume is not None
    try:
        tokenizer, data = load_data(run, resume)
        model = load_model(run, tokenizer, data, resume)
        if run.is_main:
            run.output.mkdir(parents=True, exist_ok=True)
    except BaseException as exc:
        run.stopped_before_training(exc)
        raise
    with Interrupt(run.reporter.note if run.is_main else None) as interrupt:
        try:
            trainer, throughput, stop, watch = make_trainer(run, model, tokenizer, data, interrupt)
        except BaseException as exc:
            if (failed := run.tracker_failed(exc)) is not None:
                raise failed from None
            run.stopped_before_training(exc)
            raise
        run.discard_earlier()
        if run.is_main:  # with runtime.distributed, known once the Trainer is built
            write_resolved(run.output, run.resolved, run.runtime, run.source)
        try:
            # a checkpoint of the last step is saved as it is, where every process finds it so
            if distributed.any_rank(not finished_from(trainer, resume)):
                trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except (KeyboardInterrupt, Terminated) as exc:  # a second signal: stop at once
            throughput.finish(trainer.state.global_step, "interrupted", alone=True)
            code = exc.code if isinstance(exc, Terminated) else 130
            said = stopped_at_once(run.output, trainer.state.global_step, run.is_main)
            raise Interrupted(said, code) from None
        except BaseException as exc:
            if not (trainer.state.global_step or resume) and (failed := run.tracker_failed(exc)):
                raise failed from None  # as it started: the run's folder undone
            # a resume that fails while loading its checkpoint has trained 0 steps of its own
            reached = trainer.state.global_step or (checkpoint_step(resume) or 0 if resume else 0)
            run.on_failure(throughput, reached, exc)
            raise
        status, summary = end_run(run, model, trainer, (throughput, stop, watch), interrupt)
    distributed.barrier()
    code = interrupt.exit_code if stop.stopped else 0
    return TrainResult(run.output, status, code, summary, resume, run.is_main)
