"""`expert-cli check`: validate a manifest and everything it points at, without training.

The report says: the manifest (path, name, version, schema), the resolved configuration with
the manifest's own field names, the decisions (notes), each hub model and dataset (in the local
cache with its size, or to be downloaded: the hub reachable or not), the problems that stop a
run (a token cache folder that cannot be written among them, where that shows without
writing), and the machine.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expert_cli.config import load_manifest
from expert_cli.config.environment import probe_environment, unlaunched_world
from expert_cli.config.refs import windows_note
from expert_cli.config.resolve import ResolvedConfig, resolve
from expert_cli.config.warm_start import init_adapter_problem
from expert_cli.data.answer_notes import (
    empty_answer_note,
    reasoning_note,
    result_wrapper,
    text_calls_note,
    unwritten_reasoning,
    wrapped_results_note,
)
from expert_cli.data.build import (
    BuildProgress,
)
from expert_cli.data.cache import cache_root_problem
from expert_cli.data.fields import FieldSpec, detected_words, unread_words
from expert_cli.data.format_check import formatted_problems, small_splits
from expert_cli.data.formatting import (
    TEMPLATE_UNREAD,
    check_chat_template,
    instruction_checked,
    layout_notes,
)
from expert_cli.data.hub import HubStatus, endpoint, hub_refs, hub_status, missing_problems
from expert_cli.data.instruction import CHAT_TEMPLATE, check_prompt_template
from expert_cli.data.layouts import run_kind
from expert_cli.data.model_files import base_file_problems
from expert_cli.data.row_checks import DataCheck, TextMarks, source_key
from expert_cli.data.splits import (
    NO_EVAL_ROWS,
    held_examples,
    holds_nothing_out,
    split_note,
    unheld_note,
)
from expert_cli.data.template_checks import TemplateVerdict, blank_conversation, template_verdict
from expert_cli.data.tokenizer import ids_in_use, load_tokenizer, read_config
from expert_cli.data.turns import turn_layout
from expert_cli.errors import UserError
from expert_cli.paths import path_exists, shown_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


@dataclass
class CheckReport:
    """What `check` found; `problems` empty means a run can start."""

    manifest: dict[str, Any]
    environment: dict[str, Any]
    config: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    downloads: list[str] = field(default_factory=list)
    hub: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rows_checked: dict[str, int] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_manifest(
    path: Path,
    quick: int | None = None,
    progress: BuildProgress | None = None,
    overrides: list[str] | None = None,
    model_check: Callable[[ResolvedConfig, int | None], str | None] | None = None,
) -> CheckReport:
    """Everything `check` reports about one manifest (with `--set` overrides); never raises for
    bad input. Every row of the local data is read (the first `quick` rows with `quick`).
    `model_check` (the train layer's adapter check, which this layer cannot import) runs last,
    once nothing else is wrong, with the ids the tokenizer uses (None where it does not load
    here), and its answer is a problem. The tokenizer is loaded once, from local files."""
    env = probe_environment()
    report = CheckReport(manifest={"path": str(path)}, environment=env.to_dict())
    try:
        loaded = load_manifest(path, overrides)
        resolved = resolve(loaded, env)
    except UserError as exc:
        report.problems = exc.lines
        return report
    m = loaded.manifest
    report.manifest.update(name=m.name, version=m.version, schema_version=m.schema_version)
    report.config = resolved.model_dump(mode="json", exclude={"notes"})
    report.notes = resolved.notes
    if note := unlaunched_world(os.environ):  # train would wait for processes never started
        report.notes = [*report.notes, note]
    statuses = hub_status(hub_refs(resolved))
    report.hub = [s.to_dict() for s in statuses]
    report.downloads = [line for s in statuses if (line := _download_line(s))]
    tokenizer, tokenizer_problems = _local_tokenizer(resolved)
    verdict = template_verdict(resolved, tokenizer)
    data = _read_data(resolved, tokenizer, verdict, quick, progress)
    cache = cache_root_problem(Path(resolved.pretokenized_cache), resolved.expert)
    report.notes = [*report.notes, *data.notes, *_detected_notes(resolved, data)]
    report.notes += _test_notes(resolved, data, quick, progress)
    report.problems = [
        *_check_model(resolved, tokenizer_problems),
        *([start] if (start := init_adapter_problem(resolved)) else []),
        *missing_problems(statuses),
        *([cache] if cache else []),
        *data.problems,
        *_format_problems(resolved, data.fields, tokenizer),
    ]
    report.notes += _layout_notes(resolved, data, tokenizer, verdict, bool(quick))
    blank_problems, blank_notes = data.blank_lines(resolved)
    report.problems += blank_problems
    report.notes += blank_notes
    refusals = data.refusals()
    if refusals and refusals.every:
        report.problems.append(refusals.line)
    elif refusals:
        report.notes.append(refusals.line)
    some_left = not blank_problems and not (refusals and refusals.every)
    report.problems += _split_problems(report.problems, resolved, data, tokenizer, quick, some_left)
    tokens = ids_in_use(tokenizer) if tokenizer is not None else None
    if model_check is not None and not report.problems:
        problem = model_check(resolved, tokens)
        report.problems += [problem] if problem else []
    if not report.problems and (note := _positions_note(resolved)):
        report.notes = [*report.notes, note]
    if not (report.problems or quick):
        report.notes += _held_out_notes(resolved, data)
    report.rows_checked = data.rows
    # one line once: a mapping problem is found in each source that reads it (the training
    # and the validation file), and was listed twice
    report.problems = list(dict.fromkeys(report.problems))
    return report


def _read_data(
    resolved: ResolvedConfig,
    tokenizer: PreTrainedTokenizerFast | None,
    verdict: TemplateVerdict | None,
    quick: int | None,
    progress: BuildProgress | None,
) -> DataCheck:
    """Every source's rows read and checked (the first `quick` of each with `quick`)."""
    data = DataCheck(
        resolved.field_mapping,
        quick,
        progress,
        verdict,
        TextMarks(resolved.response_template, tokenizer.eos_token if tokenizer else None),
        blank_conversation(resolved, tokenizer),
    )
    for source in resolved.train_sources:
        data.source(source)
    for source in resolved.validation_sources:
        data.source(source, train=False)
    if specs := [f for f in data.detected.values() if f is not None]:
        try:  # instruction data beside conversations: the run's are conversations
            kind = run_kind(specs, resolved.prompt_template)
            data.fields = next(f for f in specs if f.kind == kind)
        except UserError as exc:
            data.problems += exc.lines
    return data


def _test_notes(
    resolved: ResolvedConfig, data: DataCheck, quick: int | None, progress: BuildProgress | None
) -> list[str]:
    """The local test files' rows read and checked as the training data's: what would stop
    `evaluate`, as notes (training does not read them: the manifest stays usable)."""
    tests = DataCheck(resolved.field_mapping, quick, progress, data.verdict, data.marks)
    tests.fields, tests.blank_turns = data.fields, data.blank_turns
    read = {os.path.realpath(s.location) for s in resolved.train_sources}
    read |= {os.path.realpath(s.location) for s in resolved.validation_sources}
    for source in resolved.test_sources:
        # a hub one is evaluate's to fetch; one not there, or read for training (its rows
        # checked above), is noted as the configuration is resolved
        there = source.kind == "local" and path_exists(Path(source.location))
        if there and os.path.realpath(source.location) not in read:
            tests.source(source, train=False)
    return [f"{line} (evaluate reads it; training does not)" for line in tests.problems]


def _held_out_notes(resolved: ResolvedConfig, data: DataCheck) -> list[str]:
    """The build's notes on the validation split from the rows read: few examples in it (or
    in a task's share, each task's loss given apart), a task too small to hold one out."""
    sources = resolved.validation_sources or resolved.train_sources
    counts = [data.rows.get(source_key(s)) for s in sources]
    held = held_examples(resolved, counts)
    if held is None:
        return []
    tasks = [  # each task's share (train/task_evals.py)
        {"task": s.task, "examples": held_examples(resolved, [n])}
        for s, n in zip(sources, counts, strict=True)
        if s.task and len(sources) > 1
    ]
    unheld = [t["task"] for t in tasks if t["examples"] == 0 and not resolved.validation_sources]
    notes = [split_note({"eval": {"examples": held, "tasks": tasks}})]
    return [note for note in (*notes, unheld_note(unheld) if held else None) if note]


def _detected_notes(resolved: ResolvedConfig, data: DataCheck) -> list[str]:
    """The columns detection chose (each source's, where the sources name them apart), and
    the fields beside them nothing reads."""
    notes = []
    if resolved.field_mapping is None and data.fields is not None:
        found: dict[str, list[str]] = {}  # sources by the columns detected in them
        for at, f in data.detected.items():
            if f is not None:
                found.setdefault(detected_words(f), []).append(shown_path(at))
        notes += [
            f"{_sources(at)}: {words}" if len(found) > 1 else words for words, at in found.items()
        ]
    unread = [unread_words(f) for f in data.detected.values() if f is not None]
    return notes + [note for note in dict.fromkeys(unread) if note]  # of any source


def _layout_notes(
    resolved: ResolvedConfig,
    data: DataCheck,
    tokenizer: PreTrainedTokenizerFast | None,
    verdict: TemplateVerdict | None,
    quick: bool,
) -> list[str]:
    """What the chat template (conversations) or the prompt template (instruction data)
    does to the data's answers."""
    kind = data.fields.kind if data.fields is not None else None
    notes: list[str] = []
    if kind == "messages" and tokenizer is not None:
        layout = turn_layout(tokenizer)
        notes += layout_notes(tokenizer, layout, resolved.response_template)
        notes += _reasoning_notes(data, tokenizer)
        if data.empty_answers:
            notes.append(empty_answer_note(data.empty_answers, data.blank[True][1]))
        if data.text_calls:
            notes.append(text_calls_note(data.text_calls, data.blank[True][1]))
        if data.result_tags and (tag := result_wrapper(tokenizer)) in data.result_tags:
            rows = data.result_tags[str(tag)]
            notes.append(wrapped_results_note(str(tag), rows, data.blank[True][1]))
        notes += verdict.notes(data.train[0], quick) if verdict is not None else []
    elif kind == "instruction" and tokenizer is not None:
        with contextlib.suppress(UserError):  # said among the problems
            notes += instruction_checked(
                tokenizer, resolved.prompt_template, resolved.response_template
            )
    elif kind == "instruction" and resolved.response_template:
        # no tokenizer (its problem is said): under chat_template the field is read
        notes += [TEMPLATE_UNREAD] if resolved.prompt_template != CHAT_TEMPLATE else []
    return notes


def _split_problems(
    problems: list[str],
    resolved: ResolvedConfig,
    data: DataCheck,
    tokenizer: PreTrainedTokenizerFast | None,
    quick: int | None,
    some_left: bool,
) -> list[str]:
    """Where nothing else is wrong (`problems`): a split the build would leave empty, formatted
    as the build will (small data), a held-out split of only dropped examples (`some_left`:
    not every example is dropped already), and no rows to hold out for evaluation."""
    found: list[str] = []
    splits: dict[bool, list] = {}
    if not problems and tokenizer is not None and data.fields is not None:
        splits = small_splits(resolved, data.kept)  # a split the build would leave empty
        found += formatted_problems(resolved, tokenizer, data.fields.kind, splits)
    if some_left and False not in splits:
        found += [held] if (held := data.held_out_problem(resolved)) else []
    counted = [data.rows.get(source_key(src)) for src in resolved.train_sources]
    if quick:  # a count cut at --quick rows says only "at least that many"
        counted = [None if n is not None and n >= quick else n for n in counted]
    if not (problems or found) and None not in counted and holds_nothing_out(resolved, counted):
        found.append(NO_EVAL_ROWS)  # as train would find once the data is read
    return found


def _download_line(status: HubStatus) -> str | None:
    """What a run would download, for a reference not in the cache that can be fetched."""
    if status.reachable is not True:
        return None
    ref = status.ref
    rev = f" at revision {ref.revision}" if ref.revision else ""
    return f"{ref.kind}: {ref.repo}{rev} will be downloaded from {endpoint()} on first use"


# --------------------------------------------------------------------------- base model


def _check_model(cfg: ResolvedConfig, tokenizer_problems: list[str]) -> list[str]:
    """Problems with a local base model folder, its tokenizer's among them; a hub model's
    cached snapshot is judged on its files (whether it is cached at all is `hub_status`)."""
    where = "base model"
    if cfg.base_model_kind == "hub":  # judged in its cached snapshot, where it is cached
        return base_file_problems(cfg.base_model, "hub", cfg.revision, cfg.init)
    folder = Path(cfg.base_model)
    if not folder.is_dir():
        why = windows_note(folder) or (
            " (expected a local model folder with config.json, or a hub id such as Qwen/Qwen3-0.6B)"
        )
        return [f"{where}: {folder} is not a folder{why}"]
    problems = []
    if not (folder / "config.json").is_file():
        problems.append(f"{where}: {folder}/config.json is missing")
    problems += base_file_problems(cfg.base_model, "local", init=cfg.init)
    return problems + tokenizer_problems


def _positions_note(cfg: ResolvedConfig) -> str | None:
    """Rows longer than the positions the base's configuration gives (a rotary model runs
    past them, untrained there; a learned position table is refused by the model check)."""
    config, _ = read_config(cfg.base_model, cfg.trust_remote_code)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit < cfg.max_seq_length:
        return None
    return (
        f"training.config.max_seq_length: {cfg.max_seq_length:,} is over the {limit:,} "
        f"positions base model {shown_path(cfg.base_model)} is configured for "
        "(max_position_embeddings): an example longer than that trains positions it was not "
        f"pretrained on, and `generate` refuses prompts of {limit:,} tokens or more"
    )


def _local_tokenizer(cfg: ResolvedConfig) -> tuple[PreTrainedTokenizerFast | None, list[str]]:
    """The tokenizer from the files on this machine, or None and the problems `train` would
    find loading it (the same loader, no download)."""
    try:
        return load_tokenizer(cfg, local_only=True), []
    except UserError as exc:
        return None, exc.lines


def _format_problems(
    cfg: ResolvedConfig, fields: FieldSpec | None, tokenizer: PreTrainedTokenizerFast | None
) -> list[str]:
    """What the build would refuse before formatting a row: instruction data without a
    prompt template, `messages` data with a tokenizer whose chat template is missing or marks
    no assistant reply (a tokenizer that does not load is reported by the tokenizer checks)."""
    try:
        if fields is not None and fields.kind == "instruction" and tokenizer is not None:
            instruction_checked(tokenizer, cfg.prompt_template, cfg.response_template)
        elif fields is not None and fields.kind == "instruction":
            check_prompt_template(cfg.prompt_template)
        if fields is not None and fields.kind == "messages" and tokenizer is not None:
            check_chat_template(tokenizer, cfg.response_template)
    except UserError as exc:
        return exc.lines
    return []


def _reasoning_notes(data: DataCheck, tokenizer: Any) -> list[str]:
    """check's note where training conversations give reasoning the template does not write
    (the build says it too: conversations.conversation_notes)."""
    given = set().union(*data.reasoning) if data.reasoning else set()
    unwritten = set(unwritten_reasoning(tokenizer, given)) if given else set()
    rows = sum(n for keys, n in data.reasoning.items() if keys & unwritten)
    if not rows:
        return []
    found = sorted(set().union(*(keys & unwritten for keys in data.reasoning)))
    return [reasoning_note(found, rows, data.blank[True][1])]


def _sources(places: list[str]) -> str:
    """Sources as a note names them: the first three, and how many more."""
    more = f" and {len(places) - 3} more" if len(places) > 3 else ""
    return ", ".join(places[:3]) + more
