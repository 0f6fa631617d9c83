"""`expert-cli generate`: try a trained expert.

Prompts are laid out as the run's data laid out its prompts (train/prompt_format.py) and
generated with the manifest's `training.decoding` settings where it has them (greedy otherwise,
or with `greedy`). `--eval N` takes the first N whole examples of the run's validation split
(train/eval_cases.py). `--compare-base` answers each prompt again with the adapter switched
off. Text is handed to a `GenerationView` as it is produced, so the CLI can stream it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import ValidationError
from transformers import TextStreamer

from expert_cli.config.base import strip_comments
from expert_cli.config.decoding import DecodingSpec
from expert_cli.config.environment import hardware_bf16
from expert_cli.config.error_lines import format_errors
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.errors import RunError, UserError
from expert_cli.train.base_decoding import inherited_settings, sampled_base_note
from expert_cli.train.checkpoints import refuse_incomplete
from expert_cli.train.eval_cases import Case, eval_budgets, eval_cases, final_answer
from expert_cli.train.eval_split import SplitChoice
from expert_cli.train.merge import dequantized, load_adapted, refuse_unfinished
from expert_cli.train.outputs import (
    SOURCE_MANIFEST,
    adapter_base,
    read_json_file,
    run_of,
)
from expert_cli.train.prompt_format import prompt_format
from expert_cli.train.prompts import asked
from expert_cli.train.run_source import run_decoding
from expert_cli.train.test_split import split_rows
from expert_cli.train.tokenizer_files import Stops, layout_stops, saved_tokenizer

DEFAULT_NEW_TOKENS = 256
NO_TEMPERATURE = "training.decoding: no temperature above 0, so decoding is greedy"
# training.decoding keys generate acts on (their bounds are DecodingSpec's)
USED_DECODING = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "max_new_tokens",
    "max_tokens",
)


@dataclass
class GenerateOptions:
    """What to generate for: prompts given, a file of prompts, or N validation examples."""

    adapter: Path
    prompts: list[str] = field(default_factory=list)
    prompts_file: Path | None = None
    eval_n: int | None = None
    split: str | None = None  # --eval's examples: "validation" (default) or "test"
    compare_base: bool = False
    max_new_tokens: int | None = None
    greedy: bool = False
    system: str | None = None  # the system turn before each prompt
    tools_file: Path | None = None  # tool definitions the chat template writes before it


@dataclass
class Generation:
    """One answered prompt."""

    prompt: str
    output: str
    new_tokens: int
    seconds: float
    base_output: str | None = None
    reference: str | None = None
    exact_match: bool | None = None
    task: str | None = None  # a multi_task run's --eval example: its task


@dataclass
class GenerateResult:
    generations: list[Generation]
    settings: dict[str, Any]
    notes: list[str]

    @property
    def exact_match_rate(self) -> float | None:
        marks = [g.exact_match for g in self.generations if g.exact_match is not None]
        return sum(marks) / len(marks) if marks else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "generations": [asdict(g) for g in self.generations],
            "exact_match_rate": self.exact_match_rate,
            "settings": self.settings,
            "notes": self.notes,
        }


class GenerationView(Protocol):
    """Hears each answer as it is produced (`which`: "expert" or "base")."""

    def start(self, index: int, case: Case, which: str) -> None: ...

    def text(self, piece: str) -> None: ...

    def end(self, generation: Generation) -> None: ...


class Silent:
    def start(self, index: int, case: Case, which: str) -> None:
        pass

    def text(self, piece: str) -> None:
        pass

    def end(self, generation: Generation) -> None:
        pass


# what decoding makes of a character's first bytes without the rest (a byte-level tokenizer
# writes one character in several tokens): an answer that ends in it was cut mid-character
CUT_CHARACTER = "\ufffd"


def uncut(text: str) -> str:
    """`text` without the one character the end of its tokens cut (the rest of a run of bytes
    that are not UTF-8, a random model's, is shown as it is)."""
    return text.removesuffix(CUT_CHARACTER)


class _Streamer(TextStreamer):
    """transformers' text streamer, handing finished pieces to the view up to a stop text
    (what may begin one is held back until the next piece)."""

    def __init__(self, tokenizer: Any, view: GenerationView, stops: Stops) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.view, self.stops, self.pending, self.stopped = view, stops, "", False

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if self.stopped:
            return
        text, self.pending = self.pending + text, ""
        if stream_end:  # a character whose last bytes the budget left ungenerated
            text = uncut(text)
        if (shown := self.stops.cut(text)) != text:
            text, self.stopped = shown, True
        elif not stream_end and (held := self.stops.held(text)):
            text, self.pending = text[:-held], text[-held:]
        if text:
            self.view.text(text)


# --------------------------------------------------------------------------- the run


@dataclass
class LoadedRun:
    resolved: ResolvedConfig
    decoding: dict[str, Any]
    model: Any
    tokenizer: Any
    device: str
    data_record: Any = None  # runtime.data of manifest.resolved.json: the run's token cache
    notes: list[str] = field(default_factory=list)  # how the base was loaded (dequantized)
    decoding_from: str = SOURCE_MANIFEST  # or the manifest file, edited since the run


def load_run(adapter: Path) -> LoadedRun:
    """The run's resolved configuration, decoding settings, tokenizer and adapted model
    (`adapter`: a run folder, or one of its checkpoints)."""
    refuse_unfinished(adapter)  # a run without its final adapter, that has checkpoints
    refuse_incomplete(adapter)  # a checkpoint written in part: before its files are judged
    base = adapter_base(adapter)  # UserError for a folder without an adapter
    run_dir = run_of(adapter)
    data = read_json_file(run_dir / "manifest.resolved.json")
    if not data:
        there = (run_dir / "manifest.resolved.json").is_file()
        what = "holds no run's configuration (damaged, or emptied)" if there else "is missing"
        raise UserError(f"--adapter {adapter}: its manifest.resolved.json {what} (train writes it)")
    runtime = data.pop("runtime", None)
    try:
        resolved = ResolvedConfig.model_validate(data)
    except ValueError:
        raise UserError(
            f"{run_dir / 'manifest.resolved.json'}: not a run's configuration"
        ) from None
    # how the base loaded (dequantized, weights left out); decoding edited since the run
    decoding, where, loaded = run_decoding(run_dir, runtime, Path(resolved.manifest_path))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # bf16 on a GPU that has it; elsewhere fp32 (fp16 could overflow where the base was
    # trained in bf16: NaN logits)
    dtype = torch.bfloat16 if device == "cuda" and hardware_bf16() else None
    tokenizer = saved_tokenizer(adapter, run_dir)
    model = load_adapted(adapter, base, dtype or torch.float32, loaded).to(device).eval()
    record = runtime.get("data") if isinstance(runtime, dict) else None
    return LoadedRun(resolved, decoding, model, tokenizer, device, record, loaded, where)


def decoding_settings(
    decoding: dict[str, Any], greedy: bool, max_new_tokens: int | None, where: str = SOURCE_MANIFEST
) -> tuple[dict[str, Any], list[str]]:
    """`generate()` keyword arguments from the manifest's decoding block, and notes on what
    was not used; a value of the wrong type or out of bounds is a UserError naming it and the
    run's manifest.source.json it came from (the block is checked as the manifest's loader
    checks it)."""
    try:
        spec = DecodingSpec.model_validate(strip_comments(decoding))
    except ValidationError as exc:
        at = f"{where}: training.decoding"  # the run's copy of the manifest, or the file
        raise UserError([f"{at}.{line}" for line in format_errors(exc)]) from None
    given = spec.model_dump(exclude_none=True)
    notes = [
        f"training.decoding.{key}: not used by generate"
        for key in given
        if key not in USED_DECODING
    ]
    values = {key: value for key, value in given.items() if key in USED_DECODING}
    if {"max_new_tokens", "max_tokens"} <= values.keys() and not max_new_tokens:
        notes.append("training.decoding.max_tokens: not used; max_new_tokens is")
    new = max_new_tokens or values.pop("max_new_tokens", None) or values.pop("max_tokens", None)
    values.pop("max_new_tokens", None)
    values.pop("max_tokens", None)
    settings: dict[str, Any] = {"max_new_tokens": int(new or DEFAULT_NEW_TOKENS)}
    sample = not greedy and values.get("temperature", 0) > 0
    settings["do_sample"] = sample
    if sample:
        settings.update({k: values[k] for k in ("temperature", "top_p", "top_k") if k in values})
    elif values and not greedy:
        notes.append(NO_TEMPERATURE)
    if "repetition_penalty" in values:
        settings["repetition_penalty"] = values["repetition_penalty"]
    return settings, notes


# --------------------------------------------------------------------------- prompts


def base_notes(resolved: ResolvedConfig) -> list[str]:
    """What the answers are given by: a random-init base, or a base the run trained quantized."""
    notes = []
    if resolved.init == "random":
        notes.append(
            "the base model is a random initialisation: its answers are noise by design "
            "(the demo shows the mechanics; train on a pretrained base for real answers)"
        )
    if resolved.quantization in ("int4", "int8"):
        notes.append(
            f"quantization: the run trained against {resolved.quantization} base weights; "
            "the adapter answers here on the unquantized base, as merge ships it (answers can "
            "differ a little from the quantized model's)"
        )
    return notes


# --------------------------------------------------------------------------- generation


def model_context(run: LoadedRun) -> int:
    return getattr(run.model.config, "max_position_embeddings", None) or 32_768


def check_lengths(run: LoadedRun, cases: list[Case], wanted: int) -> list[str]:
    """Every prompt fits the model's context, checked before any is answered (a prompt is
    named by its number: its text may be a file's contents); a note for each whose answer the
    context cuts short of its budget (`wanted`, or the case's own)."""
    context = model_context(run)
    notes = []
    for number, case in enumerate(cases, 1):
        if len(case.ids) >= context:
            raise UserError(
                f"prompt {number}: {len(case.ids):,} tokens, over the model's context of "
                f"{context:,}; shorten it"
            )
        budget = case.budget or wanted
        if (room := context - len(case.ids)) < budget:
            notes.append(
                f"prompt {number}: room for {room:,} new tokens of {budget:,} in the model's "
                f"context of {context:,}"
            )
    return notes


def answer(
    run: LoadedRun, case: Case, settings: dict[str, Any], stops: Stops, view: GenerationView
) -> tuple:
    """(text, new tokens, seconds) of one generation, streamed to `view`, ended at `stops`."""
    context = model_context(run)
    limit = min(case.budget or settings["max_new_tokens"], context - len(case.ids))
    torch.manual_seed(run.resolved.seed)
    inputs = torch.tensor([case.ids], device=run.device)
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            out = run.model.generate(
                input_ids=inputs,
                attention_mask=torch.ones_like(inputs),
                **{**settings, "max_new_tokens": limit},
                eos_token_id=stops.ids,
                pad_token_id=run.tokenizer.pad_token_id or run.tokenizer.eos_token_id,
                streamer=_Streamer(run.tokenizer, view, stops),
                **(
                    {"stop_strings": list(stops.texts), "tokenizer": run.tokenizer}
                    if stops.texts
                    else {}
                ),
            )
    except RuntimeError as exc:
        if "probability tensor" not in str(exc):
            raise
        raise RunError(
            "sampling met probabilities that are NaN or infinite: the model's logits are not "
            "finite (adapter weights that overflow, or a run that diverged); train again"
        ) from None
    seconds = time.perf_counter() - start
    new = out[0, inputs.shape[1] :].tolist()
    text = stops.cut(uncut(run.tokenizer.decode(new, skip_special_tokens=True)))
    return text.strip(), len(new), seconds


def generate(opts: GenerateOptions, view: GenerationView | None = None) -> GenerateResult:
    """Answer every prompt (and with `compare_base` again without the adapter)."""
    view = view or Silent()
    if opts.split and not opts.eval_n:
        raise UserError(f"--split {opts.split}: chooses --eval's examples; give --eval N too")
    prompts, system, tools = asked(
        list(opts.prompts), opts.prompts_file, opts.system, opts.tools_file, opts.eval_n or 0
    )
    run = load_run(opts.adapter)
    settings, notes = decoding_settings(
        run.decoding, opts.greedy, opts.max_new_tokens, run.decoding_from
    )
    if opts.eval_n and not opts.greedy:  # exact match of sampled answers varies: greedy
        sampled = settings["do_sample"]
        settings, notes = decoding_settings(
            run.decoding, True, opts.max_new_tokens, run.decoding_from
        )
        if sampled:
            notes.append(
                "--eval: this call decodes greedily (an exact match of sampled answers changes "
                "from run to run); training.decoding's sampling applies to calls without --eval"
            )
    notes += run.notes + ([] if dequantized(run.notes) else base_notes(run.resolved))
    if not (opts.greedy or opts.eval_n) and (
        said := sampled_base_note(run.model, run.decoding, settings)
    ):  # one note of the greedy decoding, naming the base's sampling
        notes = [note for note in notes if note != NO_TEMPERATURE] + [said]
    if inherited := inherited_settings(run.model, settings):
        shown = ", ".join(f"{key} {value}" for key, value in inherited.items())
        notes.append(
            f"the base model's generation_config.json sets {shown}: transformers applies them "
            "where training.decoding does not (set them there to choose)"
        )
    layout, said = prompt_format(run.resolved, run.tokenizer, run.data_record)
    if prompts:
        notes += said
    cases = [Case(p, layout.render(run.tokenizer, p, system, tools)) for p in prompts]
    if opts.eval_n:
        choice = SplitChoice(opts.split or "validation", "--split" if opts.split else "--eval")
        split = split_rows(opts.adapter, run.resolved, run.tokenizer, run.data_record, choice)
        notes += [f"--eval: {note}" for note in split.notes]
        evals = eval_cases(split, run.resolved, run.tokenizer, opts.eval_n, notes)
        notes += eval_budgets(evals, settings["max_new_tokens"], opts.max_new_tokens is not None)
        cases += evals
    notes += check_lengths(run, cases, settings["max_new_tokens"])
    generations, stops = [], layout_stops(run.tokenizer, layout.stops)
    for index, case in enumerate(cases):
        view.start(index, case, "expert")
        text, new, seconds = answer(run, case, settings, stops, view)
        # a reference holds its turn end as trained; the answer is cut before it
        reference = None if case.reference is None else stops.cut(case.reference).strip()
        result = Generation(case.prompt, text, new, round(seconds, 3), reference=reference)
        result.task = case.task
        if reference is not None:
            result.exact_match = final_answer(text) == final_answer(reference)
        if opts.compare_base:
            view.start(index, case, "base")
            with run.model.disable_adapter():
                result.base_output = answer(run, case, settings, stops, view)[0]
        view.end(result)
        generations.append(result)
    info = {**settings, "device": run.device, "base_model": run.resolved.base_model}
    if prompts:
        info["prompt_layout"] = layout.described
    if stops.texts:  # markers the model writes as several tokens: stopped at as text
        info["stop_texts"] = list(stops.texts)
    info.update({f"{key} (base model's generation_config)": v for key, v in inherited.items()})
    return GenerateResult(generations, info, notes)
