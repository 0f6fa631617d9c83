"""`expert-cli check`: validate a manifest and everything it points at, without training.

The report says: the manifest (path, name, version, schema), the resolved configuration with
the manifest's own field names, the decisions (notes), each hub model and dataset (in the local
cache with its size, or to be downloaded: the hub reachable or not), the problems that stop a
run (a token cache folder that cannot be written among them, where that shows without
writing), and the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expert_cli.config import load_manifest
from expert_cli.config.environment import probe_environment
from expert_cli.config.refs import windows_note
from expert_cli.config.resolve import ResolvedConfig, SourceRef, resolve
from expert_cli.data.build import (
    NO_COMPLETION,
    BuildProgress,
    NoProgress,
    nothing_left,
    split_fields,
)
from expert_cli.data.cache import cache_root_problem
from expert_cli.data.conversations import (
    conversation_shape,
    conversation_text,
    render_conversation,
    without_fill_ins,
)
from expert_cli.data.formatting import (
    assistant_spans,
    check_chat_template,
    check_prompt_template,
    has_content,
)
from expert_cli.data.hub import HubStatus, endpoint, hub_refs, hub_status, missing_problems
from expert_cli.data.rows import FieldSpec, Scan, is_saved_dataset, scan_local
from expert_cli.data.sources import NO_EVAL_ROWS, checked_columns, holds_nothing_out, load_saved
from expert_cli.data.tokenizer import ids_in_use, load_tokenizer
from expert_cli.errors import UserError
from expert_cli.weights import damaged_weights

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PROGRESS_ROWS = 10_000
MAX_SHAPES = 4096  # conversation shapes whose template verdict is remembered
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
TRAINED_ROLE = {"text": "text", "instruction": "response"}  # what an example trains on


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
    statuses = hub_status(hub_refs(resolved))
    report.hub = [s.to_dict() for s in statuses]
    report.downloads = [line for s in statuses if (line := _download_line(s))]
    tokenizer, tokenizer_problems = _local_tokenizer(resolved)
    verdict = _template_verdict(resolved, tokenizer)
    data = DataCheck(resolved.field_mapping, quick, progress, verdict, resolved.response_template)
    for source in resolved.train_sources:
        data.source(source)
    for source in resolved.validation_sources:
        data.source(source, train=False)
    cache = cache_root_problem(Path(resolved.pretokenized_cache), resolved.expert)
    report.problems = [
        *_check_model(resolved, tokenizer_problems),
        *missing_problems(statuses),
        *([cache] if cache else []),
        *data.problems,
        *_format_problems(resolved, data.fields, tokenizer),
    ]
    blank_problems, blank_notes = data.blank_lines(resolved)
    report.problems += blank_problems
    report.notes = [*report.notes, *blank_notes]
    refusals = data.refusals()
    if refusals and refusals.every:
        report.problems.append(refusals.line)
    elif refusals:
        report.notes = [*report.notes, refusals.line]
    counted = [data.rows.get(src.location) for src in resolved.train_sources]
    if quick:  # a count cut at --quick rows says only "at least that many"
        counted = [None if n is not None and n >= quick else n for n in counted]
    if not report.problems and None not in counted and holds_nothing_out(resolved, counted):
        report.problems.append(NO_EVAL_ROWS)  # as train would find once the data is read
    tokens = ids_in_use(tokenizer) if tokenizer is not None else None
    if model_check is not None and not report.problems:
        problem = model_check(resolved, tokens)
        report.problems += [problem] if problem else []
    report.rows_checked = data.rows
    return report


def _download_line(status: HubStatus) -> str | None:
    """What a run would download, for a reference not in the cache that can be fetched."""
    if status.reachable is not True:
        return None
    ref = status.ref
    rev = f" at revision {ref.revision}" if ref.revision else ""
    return f"{ref.kind}: {ref.repo}{rev} will be downloaded from {endpoint()} on first use"


# --------------------------------------------------------------------------- base model


def _check_model(cfg: ResolvedConfig, tokenizer_problems: list[str]) -> list[str]:
    """Problems with a local base model folder, its tokenizer's among them (a hub model is in
    `hub_status`)."""
    where = "base model"
    if cfg.base_model_kind == "hub":
        return []
    folder = Path(cfg.base_model)
    if not folder.is_dir():
        why = windows_note(folder) or (
            " (expected a local model folder with config.json, or a hub id such as Qwen/Qwen3-0.6B)"
        )
        return [f"{where}: {folder} is not a folder{why}"]
    problems = []
    if not (folder / "config.json").is_file():
        problems.append(f"{where}: {folder}/config.json is missing")
    if cfg.init == "pretrained" and not any(next(folder.glob(p), None) for p in WEIGHT_PATTERNS):
        problems.append(
            f"{where}: {folder} has no weights (*.safetensors or *.bin); add them, "
            'or set "init": "random" to train from a random initialisation'
        )
    if cfg.init == "pretrained":
        problems += [f"{where}: {folder}: {line}" for line in damaged_weights(folder)]
    return problems + tokenizer_problems


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
        if fields is not None and fields.kind == "instruction":
            check_prompt_template(cfg.prompt_template)
        if fields is not None and fields.kind == "messages" and tokenizer is not None:
            check_chat_template(tokenizer, cfg.response_template)
    except UserError as exc:
        return exc.lines
    return []


def _template_verdict(
    cfg: ResolvedConfig, tokenizer: PreTrainedTokenizerFast | None
) -> Callable[[list[Any]], str | None] | None:
    """Why the chat template refuses one conversation (None when it renders it), where the
    template itself works; the build drops what it refuses.

    Templates refuse by a conversation's shape (roles that do not alternate, a system turn
    where none may be, a role or key they do not know, more tool calls than one), so each
    shape (`conversations.conversation_shape`) is rendered once: `check` stays about as fast
    as reading the rows (a render costs 30-60 us, a million rows were a minute more). A
    template that refuses by a message's text is found by the build, which counts every row
    it drops."""
    if tokenizer is None:
        return None
    try:
        check_chat_template(tokenizer, cfg.response_template)
    except UserError:  # said by _format_problems
        return None
    seen: dict[tuple[Any, ...], str | None] = {}

    def verdict(messages: list[Any]) -> str | None:
        shape = conversation_shape(without_fill_ins(messages))  # as the template will see it
        if shape in seen:
            return seen[shape]
        why = render_conversation(tokenizer, conversation_text(messages))[1]  # as the build
        if len(seen) < MAX_SHAPES:
            seen[shape] = why
        return why

    return verdict


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Refusals:
    """Conversations the chat template refused, as one line of `check`'s report."""

    line: str
    every: bool  # no conversation rendered: train would have no example left


class DataCheck:
    """Reads every row of the manifest's local sources with the build's own reader and row
    checks (the field mapping carries from one source to the next, as in the build); `messages`
    rows also go through `verdict`, the chat template, as the build renders them."""

    def __init__(
        self,
        mapping: dict[str, str] | None,
        quick: int | None,
        progress: BuildProgress | None,
        verdict: Callable[[list[Any]], str | None] | None = None,
        response_template: str | None = None,
    ) -> None:
        self.mapping, self.quick, self.response_template = mapping, quick, response_template
        self.progress = progress or NoProgress()
        self.verdict = verdict
        self.fields: FieldSpec | None = None
        self.problems: list[str] = []
        self.rows: dict[str, int] = {}
        self.rendered = self.refused = 0
        self._train = True
        self.first_refused: tuple[str, str] | None = None  # place, why
        # training conversations: rendered, refused, and whether every training example was
        # rendered (all local files, read to their end)
        self.train = [0, 0]
        self.all_train_rendered = True
        # per split (True: training): rows with nothing to train on (an empty text or
        # response), rows read, and whether every row of the split was read
        self.blank = {True: [0, 0], False: [0, 0]}
        self.whole = {True: True, False: True}

    def refusals(self) -> Refusals | None:
        """The refused conversations, if any."""
        if not self.refused:
            return None
        rendered, refused = self.train
        every = self.all_train_rendered and rendered > 0 and refused == rendered
        read = "conversations read (--quick)" if self.quick else "conversations"
        at, why = self.first_refused or ("", "")
        share = (
            f"it refuses every one of the {rendered:,} training conversations, so train would "
            "have nothing to train on"
            if every
            else f"{self.refused:,} of {self.rendered:,} {read} are refused and train drops them"
        )
        return Refusals(
            f"{at}: the tokenizer's chat template refuses this conversation ({why}); {share}: "
            "fix their roles or keys, or use a base model whose template takes them",
            every,
        )

    def source(self, src: SourceRef, train: bool = True) -> None:
        """Read one source (`train`: a training one, not validation)."""
        self._train = train
        if src.kind == "hub" or is_saved_dataset(Path(src.location)):
            self.all_train_rendered = self.all_train_rendered and not train
            self.whole[train] = False
        if src.kind == "hub":  # reported by hub_status
            return
        try:
            if is_saved_dataset(Path(src.location)):  # memory-mapped: checked by column
                ds = load_saved(src.location)
                ds, self.fields = checked_columns(ds, src.location, self.fields, self.mapping)
                self.rows[src.location] = len(ds)
                return
            scan = scan_local(src, self.fields, self.mapping)
            self.fields = scan.fields
            self.rows[src.location] = self._count(src, scan)
        except UserError as exc:
            self.problems += exc.lines

    def _count(self, src: SourceRef, scan: Scan) -> int:
        self.progress.start(f"checking {Path(src.location).name}", self.quick or 0)
        count = 0
        verdict = self.verdict if scan.fields.kind == "messages" else None
        trained = TRAINED_ROLE.get(scan.fields.kind)
        blank = self.blank[self._train]
        for row in scan.rows:
            count += 1
            if verdict is not None:
                self._render(verdict, row["messages"], scan.at)
            if trained is not None:
                blank[0] += self._blank(str(row.get(trained) or ""), scan.fields.kind)
            if count % PROGRESS_ROWS == 0:
                self.progress.advance(PROGRESS_ROWS)
            if self.quick and count >= self.quick:
                self.all_train_rendered = self.all_train_rendered and not self._train
                self.whole[self._train] = False
                break
        blank[1] += count if trained is not None else 0
        self.progress.advance(count % PROGRESS_ROWS)
        return count

    def _blank(self, text: str, kind: str) -> bool:
        """Whether an example has nothing to train on: an empty response, or a text whose
        trained part (after the response template or an assistant marker) is empty. A text
        without the response template is counted by the build as such, not here."""
        if kind != "text":
            return not text.strip()
        spans, style = assistant_spans(text, self.response_template)
        return style != "missing" and not has_content(text, spans, None)

    def blank_lines(self, resolved: ResolvedConfig) -> tuple[list[str], list[str]]:
        """(problems, notes) on examples with nothing to train on (an empty text or response,
        which the build drops): a problem in the build's words where it is every example of a
        split read whole, else a note."""
        problems, notes = [], []
        for train, (blank, rows) in self.blank.items():
            if not blank:
                continue
            if blank == rows and self.whole[train]:
                problems.append(nothing_left(resolved, train, rows, f"{rows} {NO_COMPLETION}"))
            else:
                what = "training" if train else "evaluation"
                notes.append(
                    f"{split_fields(resolved, train)}: {blank:,} of {rows:,} {what} examples "
                    f"read have an empty text or response; train drops them (no completion tokens)"
                )
        return problems, notes

    def _render(self, verdict: Callable[[list[Any]], str | None], messages: Any, at: str) -> None:
        self.rendered += 1
        self.train[0] += self._train
        why = verdict(messages)
        if why is not None:
            self.refused += 1
            self.train[1] += self._train
            self.first_refused = self.first_refused or (at, why)
