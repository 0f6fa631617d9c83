"""From a validated manifest to one explicit, JSON-serialisable training configuration.

Every field the manifest leaves unset is chosen here for the machine described by an
`Environment`, and every choice that overrides or ignores what the manifest asked for is
recorded in `notes` ("field: what was decided and why"), so nothing is dropped silently.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from expert_cli.config import choices
from expert_cli.config.adapters import adapter_settings
from expert_cli.config.batching import DEFAULT_MAX_SEQ, batch_plan
from expert_cli.config.choices import checkpoint_problem, first
from expert_cli.config.environment import Environment
from expert_cli.config.evaluated_tasks import task_metric_problem, unevaluated_tasks
from expert_cli.config.models import AdapterType, LoadedManifest
from expert_cli.config.optimizer import ADAM_DEFAULTS
from expert_cli.config.refs import (
    held_out_notes,
    local_path,
    looks_like_hub_id,
    on_another_system,
    trained_test_notes,
    unread_fields,
    unread_notes,
    windows_reason,
)
from expert_cli.config.sources import (
    SourceRef,
    data_folder_holding,
    resolve_sources,
    resolve_test_sources,
)
from expert_cli.config.trackers import TRACKERS
from expert_cli.config.warm_start import start_adapter
from expert_cli.errors import UserError
from expert_cli.paths import path_exists, path_is_file, shown_path

# Defaults for a LoRA expert on a ~0.6B model; each is overridable in the manifest.
DEFAULT_EVAL_FRACTION = 0.02
DEFAULT_EVAL_SEED = 42  # the held-out examples do not follow training.config.seed
DEFAULT_SAVE_STEPS = 500
DEFAULT_SAVE_LIMIT = 3
DEFAULT_LOGGING_STEPS = 10


class ResolvedConfig(BaseModel):
    """Everything a run needs, with every automatic choice made explicit."""

    expert: str
    expert_version: str
    manifest_path: str
    # model
    base_model: str
    base_model_kind: Literal["local", "hub"]
    init: Literal["pretrained", "random"]
    revision: str | None
    trust_remote_code: bool
    quantization: Literal["int4", "int8", "fp16", "bf16", "none"]
    prompt_template: str
    chat_template: str | None = None  # "chatml", or the path of a Jinja file
    # adapter
    adapter_type: AdapterType
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str] | Literal["all-linear"]
    feedforward_modules: list[str] | None
    use_dora: bool
    use_rslora: bool = False  # alpha / sqrt(rank): peft's rank-stabilised LoRA
    loraplus_lr_ratio: float | None = None  # LoRA+: lora_B's learning rate over lora_A's
    init_adapter: str | None = None  # a trained adapter's folder the run starts from
    init_lora_weights: str = "default"  # peft's LoRA initialisation (pissa, olora: decomposed)
    # data
    train_sources: list[SourceRef]
    validation_sources: list[SourceRef]
    # what `evaluate` scores (it reads the manifest file as it is then): shown by check
    test_sources: list[SourceRef] = Field(default_factory=list)
    eval_fraction: float
    eval_seed: int = DEFAULT_EVAL_SEED
    field_mapping: dict[str, str] | None
    overlong: Literal["truncate", "drop", "split"]
    response_template: str | None
    max_seq_length: int
    packing: bool
    pretokenized_cache: str
    # schedule
    epochs: float
    max_steps: int
    learning_rate: float
    lr_scheduler: str
    lr_scheduler_kwargs: dict[str, Any] = Field(default_factory=dict)
    warmup_steps: int
    warmup_ratio: float
    batch_size: int
    gradient_accumulation_steps: int
    batch_auto: bool = Field(
        description="batch_size is probed from GPU memory at start (the numbers above are "
        "then provisional; the run's choice is in runtime.batch)"
    )
    rows_per_step: int = Field(description="Packed rows per optimizer step per device.")
    micro_batch: Literal["auto", "fixed"] = Field(
        "fixed",
        description="auto: the rows of a micro-step probed from the GPU's memory at start, "
        "rows_per_step kept; fixed: batch_size as resolved.",
    )
    optim: str
    weight_decay: float
    max_grad_norm: float
    adam_beta1: float = ADAM_DEFAULTS["adam_beta1"]
    adam_beta2: float = ADAM_DEFAULTS["adam_beta2"]
    adam_epsilon: float = ADAM_DEFAULTS["adam_epsilon"]
    neftune_noise_alpha: float | None = None
    label_smoothing_factor: float = 0.0
    seed: int
    # kernels and precision
    bf16: bool
    fp16: bool
    use_tf32: bool
    attn_implementation: Literal[
        "flash_attention_4", "flash_attention_2", "torch_varlen", "flex_attention", "sdpa", "eager"
    ]
    adapter_precision: Literal["compute", "fp32"]
    adapter_kernel: Literal["peft", "fused", "grouped"] = "peft"
    fused_loss: Literal["liger", "chunked", "off"]
    liger_kernels: bool
    gradient_checkpointing: bool
    gradient_checkpointing_kwargs: dict[str, Any] = Field(
        default_factory=lambda: {"use_reentrant": False}
    )
    torch_compile: bool
    torch_compile_backend: str | None
    torch_compile_mode: str | None
    # data loading
    dataloader_num_workers: int
    dataloader_pin_memory: bool
    dataloader_prefetch_factor: int | None
    dataloader_persistent_workers: bool
    group_by_length: bool
    # logging, saving, evaluation
    logging_steps: int
    save_strategy: str
    save_steps: int
    save_total_limit: int | None
    evaluation_strategy: str
    eval_steps: int
    load_best_model_at_end: bool
    eval_on_start: bool = False  # the eval loss before the first step
    report_to: list[str] = Field(default_factory=list)  # trackers besides TensorBoard
    early_stopping_patience: int | None = None  # evaluations without improvement, then stop
    early_stopping_threshold: float = 0.0
    metric_for_best_model: str
    greater_is_better: bool
    memory_clear_every: int
    distributed: dict[str, Any] | None
    notes: list[str] = Field(default_factory=list)


def base_model_settings(lm: LoadedManifest) -> dict[str, Any]:
    bm = lm.manifest.primary_base_model
    path = local_path(lm.folder, bm.name, "base_models[0].name")
    local = path_exists(path) or not looks_like_hub_id(bm.name)
    return dict(
        base_model=str(path) if local else bm.name,
        base_model_kind="local" if local else "hub",
        init=bm.init,
        revision=bm.revision,
        trust_remote_code=bm.trust_remote_code,
        quantization=bm.quantization or "none",
        prompt_template=bm.prompt_template or "chatml",
        chat_template=_chat_template(lm, bm.chat_template),
    )


def _has_own_template(model: Path) -> bool:
    """Whether a local base folder holds a chat template of its own, where transformers'
    tokenizer reads one (a hub model's is not looked up here): chat_template.jinja, named
    ones under additional_chat_templates/, or tokenizer_config.json's (chat_template.json is
    a multimodal processor's, which a causal LM's tokenizer does not read)."""
    if (
        path_is_file(model / "chat_template.jinja")
        or (model / "additional_chat_templates").is_dir()
    ):
        return True
    try:
        with open(model / "tokenizer_config.json", "rb") as file:
            return b'"chat_template"' in file.read(1 << 24)
    except OSError:
        return False


def _trackers(names: list[str]) -> list[str]:
    """`report_to`'s trackers, each installed here (UserError naming the first that is
    not), TensorBoard left to expert-cli's own events."""
    for name in names:
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise UserError(
                f"training.config.report_to: {name} is not installed here (pip install "
                f"{name.replace('_', '-')}), or remove it from the list"
            )
    return [name for name in dict.fromkeys(names) if name != "tensorboard"]


def _chat_template(lm: LoadedManifest, value: str | None) -> str | None:
    """`base_models[0].chat_template`: "chatml", or the path of a file that exists (read
    with the tokenizer: data/tokenizer.py)."""
    if value is None or value.lower() == "chatml":
        return value and "chatml"
    path = local_path(lm.folder, value, "base_models[0].chat_template")
    if not path_is_file(path):
        raise UserError(
            f"base_models[0].chat_template: {shown_path(path)} is not a file; expected "
            '"chatml" or a Jinja chat template file (relative to the manifest\'s folder)'
        )
    return str(path)


def _evaluation(lm: LoadedManifest, has_validation: bool, notes: list[str]) -> dict[str, Any]:
    cfg = lm.manifest.training.config
    ds = lm.manifest.training.dataset
    wants_eval = cfg.evaluation_strategy != "no"
    fraction = 0.0 if has_validation else first(ds.held_out, DEFAULT_EVAL_FRACTION)
    if not wants_eval and fraction > 0:  # held out, never evaluated: examples lost
        if ds.held_out:
            notes.append(
                f"training.dataset.{'eval_fraction' if ds.eval_fraction else 'validation_split'}"
                ': not used, as evaluation_strategy is "no"; every example is trained on'
            )
        fraction = 0.0
    if not wants_eval and has_validation:  # read and tokenized, never evaluated
        notes.append('validation examples: never evaluated, as evaluation_strategy is "no"')
    has_eval = has_validation or fraction > 0
    save_steps = first(cfg.save_steps, DEFAULT_SAVE_STEPS)
    strategy = first(cfg.evaluation_strategy, "steps" if has_eval else "no")
    if strategy != "no" and not has_eval:  # the build found no rows to evaluate, then
        held = "a validation_split" if ds.eval_fraction is None else "an eval_fraction"
        raise UserError(
            f"{lm.path.name}: training.config.evaluation_strategy: {strategy}, and the run has "
            f"nothing to evaluate (no validation file, and {held} of 0 holds none out); give "
            f"training.dataset.validation_path or {held} above 0, or set evaluation_strategy "
            "to no"
        )
    eval_steps = first(cfg.eval_steps, save_steps)
    best = bool(cfg.load_best_model_at_end) and strategy != "no"
    if lm.manifest.training.packaging_checkpoint == "best" and strategy == "no":
        notes.append(choices.BEST_UNEVALUATED)
    save_strategy = first(cfg.save_strategy, "steps")
    if problem := checkpoint_problem(best, save_strategy, strategy, save_steps, eval_steps):
        raise UserError(f"{lm.path.name}: training.config.{problem}")
    for name in ("early_stopping_patience", "eval_on_start"):
        if getattr(cfg, name) and strategy == "no":
            raise UserError(
                f"{lm.path.name}: training.config.{name}: reads the evaluation loss, and this "
                "run evaluates nothing (no validation data, none held out); give "
                "training.dataset.validation_path or eval_fraction, or remove it"
            )
    if problem := task_metric_problem(cfg.metric_for_best_model, ds.tasks or {}, ds.type):
        raise UserError(f"{lm.path.name}: training.config.metric_for_best_model: {problem}")
    if cfg.early_stopping_patience and not best:
        notes.append(
            "early_stopping_patience: the final adapter is the last step's, not the best "
            "evaluation's; set load_best_model_at_end to ship the best"
        )
    return dict(
        eval_fraction=fraction,
        eval_seed=first(ds.eval_seed, DEFAULT_EVAL_SEED),
        evaluation_strategy=strategy,
        eval_steps=eval_steps,
        save_strategy=save_strategy,
        save_steps=save_steps,
        save_total_limit=cfg.save_total_limit
        if "save_total_limit" in cfg.model_fields_set
        else DEFAULT_SAVE_LIMIT,
        load_best_model_at_end=best,
        eval_on_start=bool(cfg.eval_on_start),
        early_stopping_patience=cfg.early_stopping_patience,
        early_stopping_threshold=cfg.early_stopping_threshold or 0.0,
        metric_for_best_model=first(cfg.metric_for_best_model, "eval_loss"),
        greater_is_better=bool(first(cfg.greater_is_better, False)),
        logging_steps=first(cfg.logging_steps, DEFAULT_LOGGING_STEPS),
        report_to=_trackers(cfg.report_to or []),
        neftune_noise_alpha=cfg.neftune_noise_alpha,
        label_smoothing_factor=cfg.label_smoothing_factor or 0.0,
    )


def resolve(lm: LoadedManifest, env: Environment) -> ResolvedConfig:
    """Make every automatic choice for `env` and return the explicit configuration."""
    cfg = lm.manifest.training.config
    ds = lm.manifest.training.dataset
    notes: list[str] = []
    train, valid = resolve_sources(lm)
    try:  # read by evaluate alone: a problem is training's to say, not to stop at
        tests = resolve_test_sources(ds, lm.folder)
    except UserError as exc:
        tests = []
        notes += [f"{line} (evaluate reads it; training does not)" for line in exc.lines]
    notes += choices.shared_sources(train, valid) + unevaluated_tasks(train, valid)
    notes += trained_test_notes(train, tests)
    notes += (
        held_out_notes(train, valid) + unread_notes(train + valid) + unread_fields(ds, lm.folder)
    )
    bf16, fp16 = choices.precision(cfg, env, notes)
    tf32 = bool(first(cfg.use_tf32, env.tf32)) and env.tf32
    if cfg.use_tf32 and not env.tf32:
        notes.append("use_tf32: not applicable on this machine (needs an Ampere or newer GPU)")
    notes += choices.dataset_notes(ds)
    unused = ["validation_split/eval_fraction"] if ds.held_out else []
    unused += ["eval_seed"] if ds.eval_seed is not None else []
    if valid and unused:
        notes.append(
            f"{', '.join(unused)}: not applied; validation_path gives the validation examples"
        )
    choices.hints(cfg, env, notes)
    if lm.manifest.training.decoding is not None:
        notes += lm.manifest.training.decoding.unknown_key_notes()
    dist = lm.manifest.training.distributed
    dist_dict = dist.model_dump(exclude_none=True) if dist else None
    if dist and dist.strategy != "ddp" and not env.has_gpu:
        notes.append(
            f"training.distributed.strategy: {dist.strategy} runs on GPUs only (accelerate); "
            "several processes on this machine would run DDP"
        )
    for value, label in (
        (cfg.pretokenized_cache, "training.config.pretokenized_cache"),
        ((dist_dict or {}).get("deepspeed"), "training.distributed.deepspeed"),
    ):
        if isinstance(value, str) and on_another_system(value):
            raise UserError(f"{label} {shown_path(value)}: {windows_reason(value)}")
    if dist_dict and isinstance(dist_dict.get("deepspeed"), str):
        dist_dict["deepspeed"] = str(
            local_path(lm.folder, dist_dict["deepspeed"], "training.distributed.deepspeed")
        )
    cache = local_path(
        lm.folder,
        cfg.pretokenized_cache or ".cache/pretokenized",
        "training.config.pretokenized_cache",
    )
    if held := data_folder_holding(cache, train + valid):
        raise UserError(
            f"training.config.pretokenized_cache: {shown_path(cache)} is inside the data folder "
            f"{shown_path(held)}; the cache's files would be read as data: put it elsewhere "
            "(the default is .cache/pretokenized beside the manifest)"
        )
    base = base_model_settings(lm)
    if base["chat_template"] and _has_own_template(Path(base["base_model"])):
        notes.append(
            "base_models[0].chat_template: replaces the base model's own chat template (its "
            "chat_template.jinja, additional_chat_templates/ or tokenizer_config.json's); the "
            "run's tokenizer ships it"
        )
    adapter = adapter_settings(lm.manifest, notes, env.has_gpu)
    return ResolvedConfig(
        expert=lm.manifest.name,
        expert_version=lm.manifest.version,
        manifest_path=str(lm.path),
        **base,
        **adapter,
        init_adapter=start_adapter(lm, adapter),
        train_sources=train,
        validation_sources=valid,
        test_sources=tests,
        field_mapping=ds.field_mapping,
        overlong=ds.overlong,
        response_template=ds.response_template,
        max_seq_length=first(cfg.max_seq_length, DEFAULT_MAX_SEQ),
        packing=first(cfg.packing, True),
        pretokenized_cache=str(cache),
        **choices.schedule(cfg, env, notes),
        **batch_plan(cfg, env, notes, sharded=choices.sharded(dist_dict)),
        bf16=bf16,
        fp16=fp16,
        use_tf32=tf32,
        **choices.kernels(cfg, env, bf16 or fp16, notes, sharded=choices.sharded(dist_dict)),
        **choices.checkpointing(cfg),
        torch_compile_backend=cfg.torch_compile_backend,
        torch_compile_mode=cfg.torch_compile_mode,
        **choices.loader(cfg, env, notes),
        group_by_length=bool(cfg.group_by_length) and cfg.packing is False,
        **_evaluation(lm, bool(valid), notes),
        memory_clear_every=(cfg.memory_clear_every or 0) if env.has_gpu else 0,
        distributed=dist_dict,
        notes=notes,
    )
