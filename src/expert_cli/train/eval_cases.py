"""`generate --eval N`: prompts and reference answers from a run's validation split (or, with
`--split test`, its test split: train/test_split.py).

The validation split is read from the token cache the run trained with, exactly as it was
tokenized (the test split from its own cache, tokenized as the training data was): the
tokens before an example's first trained token are its prompt, the trained ones its reference.
Examples come in the packed rows' order (the cache keeps no file order). An example cut at
`max_seq_length` in training is left out: its reference stops mid-answer, so no answer could
match it; so are an `overlong: split` example's pieces, where they can be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.formatting import IGNORE
from expert_cli.train.eval_split import Part, Split


@dataclass
class Case:
    """One prompt: its text as shown, its token ids, and the reference answer (eval)."""

    prompt: str
    ids: list[int]
    reference: str | None = None
    reference_tokens: int = 0  # the reference's length in tokens, special tokens left out
    budget: int | None = None  # new tokens for this case, where not the run's budget
    task: str | None = None  # a multi_task run's example: its task


def eval_cases(
    split: Split, resolved: ResolvedConfig, tokenizer: Any, n: int, notes: list[str]
) -> list[Case]:
    """The first `n` whole examples of `split` (the run's validation split, or its test
    split), split into prompt and reference by their labels; a multi_task run's taken from
    each task in turn. `notes` says how many examples were cut in training and left out, and
    when fewer than `n` remain."""
    by_task = len(split.parts) > 1 and all(part.task is not None for part in split.parts)
    found: list[list[Case]] = []  # each task's, or one list filled part after part
    cut = 0
    for part in split.parts:
        if by_task or not found:
            found.append([])
        wanted = n if by_task else n - len(found[0])
        cut += _cases(part, (resolved.max_seq_length, wanted, split.pieces), tokenizer, found[-1])
        if not by_task and len(found[0]) == n:
            break
    cases = [case for turn in zip_longest(*found) for case in turn if case is not None][:n]
    limits = (n, resolved.max_seq_length)
    notes += _eval_notes(split.name, len(cases), (cut, split.pieces), limits)
    if any(REASONING_END in (c.reference or "") for c in cases):
        notes.append(
            f"--eval: references hold reasoning (up to {REASONING_END}): an answer matches "
            f"where its text after its last {REASONING_END} is the reference's"
        )
    return cases


def _cases(part: Part, limits: tuple[int, int, int], tokenizer: Any, cases: list[Case]) -> int:
    """Up to `limits`[1] whole examples of `part`'s rows added to `cases`; the examples cut at
    max_seq_length (`limits`[0]) left out, and counted; pieces of split examples left out
    where the split has any (`limits`[2])."""
    limit, wanted, pieces = limits
    cut, found = 0, 0
    special = set(tokenizer.all_special_ids)  # the end-of-turn tokens match no answer's text
    for row in part.rows:
        for ids, labels in _examples(row):
            trained = [i for i, label in enumerate(labels) if label != IGNORE]
            if not trained:
                continue
            if pieces and (len(ids) >= limit or trained[0] <= 1):
                continue  # a piece: one that fills the limit, or begins inside an answer
            if len(ids) >= limit and ids[-1] != tokenizer.eos_token_id:
                cut += 1  # a whole example ends with EOS, one cut at the limit does not
                continue
            first = trained[0]
            stop = next((i for i in range(first, len(labels)) if labels[i] == IGNORE), len(ids))
            prompt = tokenizer.decode(ids[:first], skip_special_tokens=True).strip()
            reference = tokenizer.decode(ids[first:stop], skip_special_tokens=True)
            text_tokens = sum(1 for t in ids[first:stop] if t not in special)
            if pieces and not text_tokens:
                continue  # a piece holding only an answer's end-of-turn tokens
            cases.append(Case(prompt, ids[:first], reference.strip(), text_tokens, task=part.task))
            found += 1
            if found == wanted:
                return cut
    return cut


REASONING_END = "</think>"


def final_answer(text: str) -> str:
    """What an exact match compares: the text after its reasoning (after the last
    REASONING_END) where it holds any, else the whole, stripped. Two reasonings to one answer
    seldom agree word for word; the answer is what is asked."""
    return text.rsplit(REASONING_END, 1)[-1].strip()


def _eval_notes(name: str, found: int, lost: tuple[int, int], limits: tuple[int, int]) -> list[str]:
    """The notes on the examples of split `name` left out (`lost`: cut in training, split
    into pieces) and on fewer cases than asked for (`limits`: wanted, max_seq_length)."""
    (cut, split), (wanted, limit), notes = lost, limits, []
    if cut:
        notes.append(
            f"--eval: {cut:,} {name} example{'s were' if cut > 1 else ' was'} cut at "
            f"max_seq_length={limit:,}{' in training' if name == 'validation' else ''} and left "
            "out (a reference that stops mid-answer matches no answer)"
        )
    if found < wanted:
        plural = "" if found == 1 else "s"
        whole = "" if split else "whole "  # a piece may pass for a whole example
        notes.append(f"--eval {wanted:,}: the {name} split has {found:,} {whole}example{plural}")
    if split:
        notes.append(
            f"--eval: {split:,} {name} example{'s were' if split > 1 else ' was'} split "
            f"into pieces of max_seq_length={limit:,} (overlong: split); pieces are left out "
            "where they fill it or begin inside an answer, and one that begins inside a prompt "
            "cannot be told from a whole example"
        )
    return notes


def _examples(row: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """A packed row's examples (position ids restart at 0 for each)."""
    ids, labels, positions = row["input_ids"], row["labels"], row["position_ids"]
    starts = [i for i, p in enumerate(positions) if p == 0] + [len(ids)]
    pairs = zip(starts, starts[1:], strict=False)
    return [([int(t) for t in ids[a:b]], [int(t) for t in labels[a:b]]) for a, b in pairs if b > a]


def eval_budgets(cases: list[Case], budget: int, chosen: bool) -> list[str]:
    """A reference longer than the new-token budget can never be matched: without a
    `--max-new-tokens` such a case may run to its reference's length (`chosen`: the user's
    budget stands), and a note says which."""
    long = [c for c in cases if c.reference is not None and c.reference_tokens > budget]
    if not long:
        return []
    longest = max(c.reference_tokens for c in long)
    many = len(long) > 1
    which = f"--eval: {len(long):,} reference{'s are' if many else ' is'} longer than"
    answers = "their answers" if many else "its answer"
    if chosen:
        return [
            f"{which} --max-new-tokens {budget:,} (the longest {longest:,} tokens): "
            f"{answers} {'stop' if many else 'stops'} before matching"
        ]
    for case in long:
        case.budget = case.reference_tokens
    return [
        f"{which} the {budget:,}-token budget: {answers} may run to the reference's length "
        f"(the longest {longest:,} tokens)"
    ]
