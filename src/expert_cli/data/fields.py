"""Which column of a data source holds each role (text, messages, instruction, input,
response, system, tools): the manifest's `field_mapping` checked, or one detected from the
columns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from expert_cli.data.file_text import shown_names
from expert_cli.errors import UserError

ROLES = ("text", "messages", "instruction", "input", "response", "system", "tools")
OPTIONAL_ROLES = {"input", "system", "tools"}
TOOLS = "tools"  # a conversation's tool definitions, given to its chat template (TRL's column)
MESSAGE_TREE = {"message_id", "parent_id", "role", "text"}  # OpenAssistant's columns
# the columns detected where no field_mapping is given, each list in the order looked for
CONVERSATION_COLUMNS = ("messages", "conversations", "conversation")  # ShareGPT's, Capybara's
PROMPT_COLUMNS = ("instruction", "prompt", "question", "query", "problem", "inputs")
# a worked solution before a bare `answer` (MATH's, NuminaMath's, OpenMathInstruct's)
RESPONSE_COLUMNS = (
    *("response", "output", "completion", "solution", "generated_solution", "answer"),
    "targets",  # FLAN's, T0's, Aya's `inputs` and `targets`
)
# `response` beside `messages` (TRL's conversational prompt and completion, data/completions.py)
ANSWERED_BY = "the response's turns trained, the answers in messages kept as context"
DETECTED_COLUMNS = frozenset((*CONVERSATION_COLUMNS, *PROMPT_COLUMNS, *RESPONSE_COLUMNS, "text"))


@dataclass(frozen=True)
class FieldSpec:
    """Which column holds each role, and which of the three formats that makes."""

    kind: str  # "text" | "messages" | "instruction"
    mapping: dict[str, str]  # role -> column
    # detected optional roles (input, system) a source may not have as a column at all: a
    # local file's mapping is detected from its first row, which may lack them
    maybe: frozenset[str] = frozenset()
    # a `tools` column the mapping leaves out (unread_words says so)
    unread: frozenset[str] = frozenset()
    at: str = ""  # where it was worked out (a file's first row, a dataset), as errors name it
    others: tuple[str, ...] = ()  # the columns a detected mapping leaves unread, as check says
    # detected optional roles whose column a source's whole schema (Parquet's, a saved
    # dataset's) lacks: no row has them, so check does not say "where a row has it"
    lacked: frozenset[str] = frozenset()

    @property
    def required(self) -> list[str]:
        return [r for r in self.mapping if r not in OPTIONAL_ROLES]

    @property
    def stored(self) -> list[str]:
        """The roles a source's rows keep once read: a `response` or `system` beside
        `messages` is joined into the conversation (data/completions.py)."""
        joined = ("response", "system") if self.kind == "messages" else ()
        return [r for r in self.mapping if r not in joined]

    def named(self, role: str) -> str:
        """How an error names a role's column: a detected optional one (input, system, tools)
        has no mapping the user wrote to blame."""
        if role in self.maybe:
            return f"read as {role}: set training.dataset.field_mapping to leave it out"
        return f"field_mapping.{role}"

    def shape(self, role: str, value_is_text: bool) -> str:
        """The role whose shape a value of `role` must have: a `response` beside `messages`
        is a conversation's turns, unless given as one answer's text; `messages` beside a
        response may be a prompt's text (xlam's `query`)."""
        turns = self.kind == "messages" and role == "response" and not value_is_text
        asked = role == "messages" and value_is_text and "response" in self.mapping
        return "messages" if turns else "instruction" if asked else role


def field_spec(
    mapping: dict[str, str] | None,
    columns: list[str],
    where: str,
    turns: frozenset[str] = frozenset(),
    whole: bool = False,
) -> FieldSpec:
    """Validate `field_mapping`, or detect it from the columns when unset (`turns`: those
    holding lists of objects, turns of a conversation; `whole`: the columns are the source's
    whole schema, not a first row's keys)."""
    maybe: frozenset[str] = frozenset()
    detected = mapping is None
    if mapping is None:
        # names matched whatever their case (SVAMP's `Question`), the lower-case one first
        named = {c.lower(): c for c in sorted(columns, key=lambda c: c == c.lower())}
        lowered = frozenset(c.lower() for c in turns)
        found = _detect_mapping(named, where, lowered)
        mapping = {role: named.get(column, column) for role, column in found.items()}
        maybe = frozenset(OPTIONAL_ROLES & set(mapping))
    kind = mapping_kind(mapping)
    shared = {c for c in mapping.values() if list(mapping.values()).count(c) > 1}
    if shared:  # `instruction` and `response` of one column: trained to repeat its prompt
        column = sorted(shared)[0]
        roles = [f"`{r}`" for r, c in mapping.items() if c == column]
        raise UserError(
            f"training.dataset.field_mapping: {' and '.join(roles)} both name the column "
            f"'{column}'; each role reads a column of its own (an answer that is its own "
            "prompt trains the model to repeat it)"
        )
    if TOOLS in mapping and kind != "messages":
        raise UserError(
            "training.dataset.field_mapping: `tools` (tool definitions for the chat template) "
            "is read with `messages` only; map the conversations to `messages` (a prompt's text "
            'and its answer as {"messages": <prompt>, "response": <answer>}), or remove it'
        )
    # beside `messages`, `response` holds the turns that answer it (TRL's conversational
    # prompt and completion: data/completions.py)
    read = {kind, TOOLS} | ({"response", "system"} if kind == "messages" else set())
    unused = sorted(set(mapping) - read) if kind in ("text", "messages") else []
    if unused:  # a required role was required in every row, then never read
        unit = "example" if kind == "text" else "conversation"
        raise UserError(
            f"training.dataset.field_mapping: `{kind}` holds the whole {unit}, so "
            f"{', '.join(f'`{r}`' for r in unused)} would not be used; remove "
            + ("it" if len(unused) == 1 else "them")
            + (", or map `instruction` + `response` without `text`" if kind == "text" else "")
            + ("; beside it `response`, `system` and `tools` are read" if kind != "text" else "")
        )
    unread = frozenset({TOOLS} & set(columns)) - set(mapping)
    others = tuple(sorted(set(columns) - set(mapping.values()) - unread)) if detected else ()
    lacked = frozenset(r for r in maybe if mapping[r] not in columns) if whole else frozenset()
    return FieldSpec(kind, dict(mapping), maybe, unread, where, others, lacked)


def source_fields(
    columns: list[str], where: str, turns: frozenset[str], whole: bool = False
) -> FieldSpec:
    """A source's mapping where the manifest gives none: detected from its own columns (a
    multi_task expert's tasks may name their columns apart: instruction/output beside
    question/answer, or hold conversations beside instruction data: data/layouts.py joins
    them)."""
    return field_spec(None, columns, where, turns, whole)


KIND_WORDS = {"text": "text", "messages": "conversations", "instruction": "instruction data"}


def held_words(fields: FieldSpec) -> str:
    """The columns a mapping requires, as an error may show them."""
    return shown_names([fields.mapping[role] for role in fields.required])


def turn_lists(row: dict[str, Any]) -> frozenset[str]:
    """The columns of a row holding a list of objects (turns of a conversation), or an empty
    list (a first row's prompt of no turns)."""
    return frozenset(
        k
        for k, v in row.items()
        if isinstance(v, list) and all(isinstance(m, dict) for m in v)  # [] too: a first row
    )


def mapping_kind(mapping: dict[str, str]) -> str:
    """The data kind a field mapping names (text, messages, instruction); UserError for an
    unknown role or a mapping that names none. A run's recorded mapping is read with this
    alone: one trained before roles beside `text` were refused still has its kind."""
    unknown = sorted(set(mapping) - set(ROLES))
    if unknown:
        raise UserError(
            f"training.dataset.field_mapping: unknown key(s) {unknown}; "
            f"expected some of {list(ROLES)}"
        )
    if "text" in mapping:
        return "text"
    if "messages" in mapping:
        return "messages"
    if "instruction" in mapping and "response" in mapping:
        return "instruction"
    raise UserError(
        "training.dataset.field_mapping: needs `text`, `messages`, or "
        "`instruction` + `response` (optionally `input`, `system`; `tools` beside `messages`)"
    )


def _detect_mapping(named: dict[str, str], where: str, turns: frozenset[str]) -> dict[str, str]:
    """The mapping detected from the columns, by their lower-case names (`named`: each as the
    source names it, which an error shows); `turns`: those holding lists of turns."""
    cols = set(named)
    if cols >= MESSAGE_TREE:
        raise UserError(
            f"{where}: one message a row with its parent's id (OpenAssistant's message trees: "
            "columns message_id, parent_id, role, text); expected a conversation a row: "
            "flatten each tree's paths into `messages`, then map them"
        )
    response = next((c for c in RESPONSE_COLUMNS if c in cols), None)
    prompt = next((c for c in PROMPT_COLUMNS if c in cols), None)
    # a system prompt (OpenOrca's, Nemotron's `system_prompt`), read where a row has it
    system = "system_prompt" if "system_prompt" in cols and "system" not in cols else "system"
    if prompt == "inputs" and "definition" in cols and system not in cols:
        system = "definition"  # Natural Instructions': the task's own instruction
    # a conversation or a prompt/answer pair before a text column: a rendered text (Alpaca's
    # beside its instruction and output) trains its prompts too
    for name in CONVERSATION_COLUMNS:  # ShareGPT's and Capybara's turns are read as messages,
        if name in cols:  # with their tools and system prompt where a row has them (OpenAI's
            return {"messages": name, TOOLS: TOOLS, "system": system}  # files leave tools out)
    if prompt and "answers" in cols and TOOLS in cols and not response:  # Salesforce xlam's
        return {"messages": prompt, "response": "answers", TOOLS: TOOLS, "system": system}
    if {"response_0", "response_1"} <= cols and not response:  # PKU-SafeRLHF's pairs
        raise UserError(
            f"{where}: two answers a row (columns 'response_0' and 'response_1', preference "
            "data such as PKU-SafeRLHF's, whose other columns say which is better or safer); "
            "expert-cli trains on answers: keep the preferred one of each row in one column, "
            "then map it as the response"
        )
    if {"chosen", "rejected"} <= cols and not response:  # preference data (DPO) alone
        pair = '{"instruction": "prompt", "response": "chosen"}, or '
        raise UserError(
            f"{where}: preference pairs (columns 'chosen' and 'rejected', for DPO-style "
            "training); expert-cli trains on answers: set training.dataset.field_mapping to "
            f"train the preferred ones, e.g. {pair if 'prompt' in cols else ''}"
            '{"messages": "chosen"} where each holds a whole conversation'
        )
    if prompt and response and "history" in cols:  # LLaMA-Factory's earlier turns: unread
        raise UserError(
            f"{where}: a `history` column beside {named[prompt]!r} and {named[response]!r} "
            "(LLaMA-Factory's "
            "earlier turns, [[question, answer], ...]) would be read by nothing; write such rows "
            "as `messages` to train with their history, or set training.dataset.field_mapping "
            "to the columns to read"
        )
    # TRL's conversational prompt and completion (Nemotron's turns in `input`, answer in
    # `output`, where no prompt column holds text beside them)
    asked = prompt if prompt in turns else None if prompt else "input" if "input" in turns else None
    if asked and response and "label" in cols:  # KTO: each completion marked good or bad
        raise UserError(
            f"{where}: a `label` column beside {named[asked]!r} and {named[response]!r} "
            "(unpaired preference data, for KTO: each completion marked desirable or not) would "
            "train the undesirable completions too; keep the rows labelled true, drop the "
            "column, then train them"
        )
    if asked and response:
        return {"messages": asked, "response": response, TOOLS: TOOLS, "system": system}
    if prompt and response:  # input and system read in every row: the first may lack them
        given = "context" if "context" in cols and "input" not in cols else "input"  # Dolly's
        return {"instruction": prompt, "response": response, "input": given, "system": system}
    if "text" in cols:
        return {"text": "text"}
    if {"system", "chat"} <= cols:  # glaive-function-calling-v2: turns by markers in one text
        raise UserError(
            f"{where}: a `chat` text beside `system` (Glaive's function-calling layout: USER:, "
            "ASSISTANT: and FUNCTION RESPONSE: turns in one text, the functions in the system "
            "text); mapped as `text`, its user turns and function results would be trained too: "
            "convert each row to ShareGPT turns (human, function_call, observation, gpt, as "
            "LLaMA-Factory's glaive_toolcall data is) with its tools, then train those"
        )
    example = '{"text": "<column>"}'
    if prompt or response:  # half a pair (Nectar: a prompt, its answers in a list)
        found, role = (prompt, "instruction") if prompt else (response, "response")
        other = "response" if prompt else "instruction"
        column = named[found]
        example = f'{{"{role}": "{column}", "{other}": "<column>"}} (no {other} column was found)'
    raise UserError(
        f"{where}: cannot tell which column holds the data (columns: "
        f"{shown_names(sorted(named.values()))}); set training.dataset.field_mapping, e.g. "
        f"{example}"
    )


def detected_words(fields: FieldSpec) -> str:
    """What `check` says of a mapping detected from the columns (none given): which column
    holds each role, the optional ones read where a row has them."""
    held = {role: column for role, column in fields.mapping.items() if role not in fields.maybe}
    maybe = [f"{role} from {column!r}" for role, column in fields.mapping.items()
             if role in fields.maybe - fields.lacked]  # fmt: skip
    where = f"; {' and '.join(maybe)} where a row has it" if maybe else ""
    if fields.kind == "messages" and "response" in held:
        where += f"; {ANSWERED_BY}"
    if fields.others:  # s1K's reasoning beside its question and solution, say
        where += f"; not read: {shown_names(list(fields.others))}"
    return (
        f"training.dataset.field_mapping: none given; read as {json.dumps(held)}{where} "
        "(set it to read other columns)"
    )


def unread_words(fields: FieldSpec) -> str | None:
    """A note where the mapping leaves the data's `tools` unread (xlam's beside a query)."""
    if TOOLS not in fields.unread:
        return None
    if fields.kind != "messages":
        return (
            "training.dataset.field_mapping: the data's `tools` column (tool definitions) is not "
            f"read: {fields.kind} data is not laid out by a chat template, which is what writes "
            "tools into a prompt; to train tool calls with their definitions, write each row as "
            "`messages` (a call as an assistant turn's `tool_calls`) with `tools` beside it"
        )
    return (
        "training.dataset.field_mapping: the data's `tools` column (tool definitions) is not "
        'mapped, so the chat template is not given them; add "tools": "tools" to train '
        "the tool calls with their definitions"
    )
