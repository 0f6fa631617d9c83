"""What `check` finds reading the data's rows, with the build's own reader and row checks: how
many rows each source holds, the conversations the chat template refuses, and the examples
with nothing to train on (an empty text, response or assistant turn), which the build drops."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expert_cli.config.resolve import ResolvedConfig, SourceRef
from expert_cli.data.answer_notes import (
    empty_answer,
    reasoning_in,
    result_tags,
    text_calls_not_json,
)
from expert_cli.data.build import (
    BuildProgress,
    NoProgress,
    nothing_left,
    quiet_datasets,
    split_fields,
)
from expert_cli.data.conversations import EMPTY
from expert_cli.data.dataset_rows import dataset_scan
from expert_cli.data.fields import FieldSpec
from expert_cli.data.format_check import KEEP_CHARS, KEEP_ROWS, row_chars
from expert_cli.data.hub import dataset_snapshot
from expert_cli.data.hub_snapshot import snapshot_lines
from expert_cli.data.rows import Scan, is_saved_dataset, scan_local
from expert_cli.data.sources import checked_columns, load_hub, load_saved
from expert_cli.data.spans import assistant_spans, has_content
from expert_cli.data.splits import held_rows
from expert_cli.data.stats_words import NO_COMPLETION, drop_reasons
from expert_cli.data.template_checks import TemplateVerdict
from expert_cli.errors import UserError

if TYPE_CHECKING:
    pass

PROGRESS_ROWS = 10_000


TRAINED_ROLE = {"text": "text", "instruction": "response"}  # what an example trains on
NO_MARKER = "no response_template"


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class TextMarks:
    """A text's response template, and the tokenizer's EOS (an answer of it alone is empty)."""

    response_template: str | None
    eos: str | None


@dataclass(frozen=True)
class Refusals:
    """Conversations the chat template refused, as one line of `check`'s report."""

    line: str
    every: bool  # no conversation rendered: train would have no example left


def source_key(src: SourceRef) -> str:
    """A source as check counts its rows: its location, with the split, configuration and
    task that tell apart two sources of one hub dataset (its train and test splits)."""
    key = "::".join(part for part in (src.location, src.split, src.config) if part)
    return f"{key} ({src.task})" if src.task else key


class DataCheck:
    """Reads every row of the manifest's local sources with the build's own reader and row
    checks (the field mapping carries from one source to the next, as in the build); `messages`
    rows also go through `verdict`, the chat template, as the build renders them."""

    def __init__(
        self,
        mapping: dict[str, str] | None,
        quick: int | None,
        progress: BuildProgress | None,
        verdict: TemplateVerdict | None = None,
        text_marks: TextMarks | None = None,
        blank_turns: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.mapping, self.quick = mapping, quick
        self.marks = text_marks or TextMarks(None, None)
        self.progress = progress or NoProgress()
        self.verdict, self.blank_turns = verdict, blank_turns
        self.fields: FieldSpec | None = None
        self.detected: dict[str, FieldSpec | None] = {}  # by source, as it was read
        self.problems: list[str] = []
        self.notes: list[str] = []  # a hub snapshot's (hub_snapshot.snapshot_lines)
        self.rows: dict[str, int] = {}
        self.rendered = self.refused = 0
        self._train = True
        self.first_refused: tuple[str, str] | None = None  # place, why
        # training conversations: rendered, refused, and whether every training example was
        # rendered (all local files, read to their end)
        self.train = [0, 0]
        self.all_train_rendered = True
        # per split (True: training): rows with nothing to train on (an empty text,
        # response or assistant turn), rows read, and whether every row of the split was read
        self.blank = {True: [0, 0], False: [0, 0]}
        self.unmarked = {True: 0, False: 0}  # texts without the response template, by split
        self.reasoning: Counter[frozenset[str]] = Counter()  # training rows' reasoning keys
        self.empty_answers = 0  # training conversations with an empty answer beside others
        self.text_calls = 0  # training conversations with a call in an answer's text not JSON
        self.result_tags: Counter[str] = Counter()  # training rows by their results' opening tag
        self.whole_texts = {True: 0, False: 0}  # texts without an assistant marker: all trained
        self.whole = {True: True, False: True}
        # per training source: its rows' count and why the build drops each it drops (its
        # drop key), or None where it is not read whole (a hub or saved one, --quick)
        self.train_drops: list[tuple[int, dict[int, str]] | None] = []
        self._drops: dict[int, str] = {}
        # per source: whether a training one, and its rows where it has at most KEEP_ROWS
        # and was read whole (format_check formats them)
        self.kept: list[tuple[bool, list[dict[str, Any]] | None]] = []
        self._kept: list[dict[str, Any]] | None = []
        self._kept_chars = 0

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
        said = (
            "holds no assistant turn the template renders (the answers' role is `assistant`)"
            if why.startswith("no assistant turn")
            else "is dropped by train"
            if why.startswith("no response_template")
            else "is refused by the tokenizer's chat template"
        )
        fix = (  # a template may write no tools at all (the demo's ChatML one)
            "their roles or keys"
            if "its tools" not in why
            else "the tools' layout (or leave the tools unmapped, where the template writes none)"
        )
        if why.startswith(EMPTY):  # nothing for a template to take: none is to blame
            return Refusals(f"{at}: this conversation is empty (no messages); {share}", every)
        return Refusals(
            f"{at}: this conversation {said} ({why}); {share}: fix {fix}, or use a base "
            "model whose template takes them",
            every,
        )

    def source(self, src: SourceRef, train: bool = True) -> None:
        """Read one source (`train`: a training one, not validation). A hub one is read only
        from its cached snapshot, where the hub cannot be asked (else hub_status says where
        it stands: check downloads nothing)."""
        self._train, self._drops, self._kept, self._kept_chars = train, {}, [], 0
        self.kept.append((train, None))
        if train:
            self.train_drops.append(None)
        if src.kind == "hub":
            problems, notes = snapshot_lines(src)
            self.problems, self.notes = self.problems + problems, self.notes + notes
            if problems or dataset_snapshot(src.location, src.revision) is None:
                self.all_train_rendered = self.all_train_rendered and not train
                self.whole[train] = False
                return
        try:
            if src.kind == "hub" or is_saved_dataset(Path(src.location)):  # by column, then row
                with quiet_datasets():
                    ds = load_hub(src) if src.kind == "hub" else load_saved(src.location)
                    ds, self.fields = checked_columns(ds, src.location, self.fields, self.mapping)
                    self.detected[src.location] = self.fields
                    scan = dataset_scan(ds, self.fields, src.location)
                    self.rows[source_key(src)] = self._count(src, scan)
            else:
                scan = scan_local(src, self.fields, self.mapping)
                self.fields = self.detected[src.location] = scan.fields
                self.rows[source_key(src)] = self._count(src, scan)
                self.fields = self.detected[src.location] = scan.fields  # a later row's tools
            if train and self.whole[True]:
                self.train_drops[-1] = (self.rows[source_key(src)], self._drops)
            self.kept[-1] = (train, self._kept)
        except UserError as exc:
            self.problems += exc.lines

    def _count(self, src: SourceRef, scan: Scan) -> int:
        self.progress.start(f"checking {Path(src.location).name}", self.quick or 0)
        count = 0
        verdict = self.verdict if scan.fields.kind == "messages" else None
        trained = TRAINED_ROLE.get(scan.fields.kind)
        turns = self.blank_turns if scan.fields.kind == "messages" else None
        blank = self.blank[self._train]
        counted = trained is not None or turns is not None
        for row in scan.rows:  # a row refused later raises: the rows read so far are counted
            count += 1
            if self._kept is not None:
                self._kept_chars += row_chars(row)
                if count > KEEP_ROWS or self._kept_chars > KEEP_CHARS:
                    self._kept = None
                else:
                    self._kept.append(row)
            blank[1] += counted
            if verdict and self._train:  # notes on training conversations (checks.py)
                if keys := reasoning_in(row["messages"]):
                    self.reasoning[frozenset(keys)] += 1  # given: is it written?
                self.empty_answers += empty_answer(row["messages"])
                self.text_calls += text_calls_not_json(row["messages"])
                self.result_tags.update(result_tags(row["messages"]))
            why = self._render(verdict, row, scan.at) if verdict else None
            if trained is not None:
                found = self._blank(str(row.get(trained) or ""), scan.fields.kind)
                blank[0] += found is True
                self.unmarked[self._train] += found is None
                why = why or {True: NO_COMPLETION, None: NO_MARKER}.get(found)
            elif turns is not None and turns(row):
                blank[0] += 1
                why = why or NO_COMPLETION
            if why is not None:
                self._drops[count - 1] = _reason(why)
            if count % PROGRESS_ROWS == 0:
                self.progress.advance(PROGRESS_ROWS)
            if self.quick and count >= self.quick:
                self._kept = None
                self.all_train_rendered = self.all_train_rendered and not self._train
                self.whole[self._train] = False
                break
        self.progress.advance(count % PROGRESS_ROWS)
        return count

    def _blank(self, text: str, kind: str) -> bool | None:
        """Whether an example has nothing to train on: an empty response, or a text whose
        trained part (after the response template or an assistant marker) is empty; None for
        a text without the response template (the build drops it as such)."""
        if kind != "text":
            return not text.strip()
        spans, style = assistant_spans(text, self.marks.response_template)
        self.whole_texts[self._train] += style == "none"
        return None if style == "missing" else not has_content(text, spans, self.marks.eos)

    def blank_lines(self, resolved: ResolvedConfig) -> tuple[list[str], list[str]]:
        """(problems, notes) on examples the build drops before training (an empty text or
        response; a text without the response template): a problem in the build's words where
        that is every example of a split read whole, else a note per reason."""
        problems, notes = [], []
        for train, (blank, rows) in self.blank.items():
            unmarked, what = self.unmarked[train], "training" if train else "evaluation"
            fields = split_fields(resolved, train)
            if rows and blank + unmarked == rows and self.whole[train]:
                why = [f"{unmarked:,} without response_template"] if unmarked else []
                why += [f"{blank:,} {NO_COMPLETION}"] if blank else []
                problems.append(nothing_left(resolved, train, rows, "; ".join(why)))
                continue
            if unmarked:
                notes.append(
                    f"{fields}: {unmarked:,} of {rows:,} {what} texts read hold no "
                    "response_template; train drops them"
                )
            if whole := self.whole_texts[train]:
                notes.append(
                    f"{fields}: {whole:,} of {rows:,} {what} texts read hold no assistant marker: "
                    "each is trained whole, its prompt too (right for plain documents; set "
                    "training.dataset.response_template to train what follows it)"
                )
            if blank:
                notes.append(
                    f"{fields}: {blank:,} of {rows:,} {what} examples read have an empty text, "
                    "response or assistant turn; train drops them (no completion tokens)"
                )
        return problems, notes

    def _render(self, verdict: TemplateVerdict, row: dict[str, Any], at: str) -> str | None:
        self.rendered += 1
        self.train[0] += self._train
        why = verdict(row, self._train)
        if why is not None:
            self.refused += 1
            self.train[1] += self._train
            self.first_refused = self.first_refused or (at, why)
        return why

    def held_out_problem(self, resolved: ResolvedConfig) -> str | None:
        """The build's words where every example it will hold out for evaluation (no
        validation source) is one it then drops with nothing to train on, or without the
        response template: train would stop on an evaluation split of none. None where any
        is kept or refused by the chat template (whose verdict here is its shape's: small data
        is formatted exactly by format_check), or a training source is not read whole."""
        if resolved.validation_sources or None in self.train_drops:
            return None
        held: list[str] = []
        for i, (rows, drops) in enumerate(d for d in self.train_drops if d is not None):
            for row in held_rows(rows, resolved.eval_fraction, resolved.eval_seed + i):
                # a refusal is the verdict of the conversation's shape (a template may refuse
                # by a message's text): only format_check's exact one is said
                if drops.get(int(row), "template") == "template":
                    return None
                held.append(drops[int(row)])
        if not held:
            return None
        why = drop_reasons({f"dropped_{key}": n for key, n in Counter(held).items()}, None)
        return nothing_left(resolved, False, len(held), why)


def _reason(why: str) -> str:
    """The build's drop key of why a row is dropped."""
    if why == NO_COMPLETION:
        return "no_completion"
    return "no_marker" if why.startswith(NO_MARKER) else "template"
