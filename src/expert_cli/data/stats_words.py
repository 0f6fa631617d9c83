"""The words the build's counts are shown in: what the loss of a split's examples is on, by
masking rule, and why examples were dropped (`train`, `pretokenize` and the empty-data error
say them)."""

from __future__ import annotations

from typing import Any

from expert_cli.data.turns import MAX_ASKED

NO_COMPLETION = "with no completion tokens"
STYLE_WORDS = {
    "chatml": "ChatML assistant turns",
    "marker": "<|assistant|> turns",
    "marker_eos": "<|assistant|> turns ended by </s>",
    "template": "answers after the prompt",
    "turns": "assistant turns as the chat template writes them",
    "last_turns": "conversations with earlier answers left as context",
    "many_turns": f"conversations of over {MAX_ASKED} answers",
    "weighted": 'conversations with answers of "weight": 0 left as context',
}
# why a `many_turns` row trains only some of its answers
MANY_TURNS_WHY = (
    f"at most their first {MAX_ASKED - 1} answers and the last are trained, the others are "
    "context: the chat template is asked for each answer, at a cost growing with the square of "
    "a conversation's turns; split such conversations to train every answer"
)
# why a `last_turns` row trains only some of its answers
LAST_TURNS_WHY = (
    "the chat template writes their earlier answers otherwise than a last one, as a model "
    "answers (Qwen3 leaves their reasoning out): those are context, not trained"
)  # an empty reasoning block alone (Qwen3's) or an EOS after the conversation (Phi-3's) is alike


def masking_words(split: dict[str, Any]) -> str | None:
    """What the loss of a split's kept examples is on, by masking rule ("ChatML assistant
    turns 230, whole text 5 (...)"), where any example is trained whole: a text without an
    assistant marker trains its prompt too, which only plain documents want. None when every
    example trains its answers only, or the stats have no rules (an older cache)."""
    styles = split.get("styles")
    whys = {"last_turns": LAST_TURNS_WHY, "many_turns": MANY_TURNS_WHY}
    if not isinstance(styles, dict) or not any(styles.get(k) for k in ("none", "weighted", *whys)):
        return None
    parts = [
        f"{STYLE_WORDS[k]} {n:,}" + (f" ({whys[k]})" if k in whys else "")
        for k, n in styles.items()
        if k in STYLE_WORDS and n
    ]
    if styles.get("none"):
        parts.append(
            f"whole text {styles['none']:,} (no assistant marker: the prompt is trained too; "
            "set training.dataset.response_template to train what follows it)"
        )
    return ", ".join(parts)


def drop_reasons(split: dict[str, Any], max_seq_length: int | None = None) -> str:
    """Why a split's examples were dropped, one count per reason that dropped any ("none" when
    no example was): the words `train` and `pretokenize` show, and the empty-data error."""
    limit = _limit(max_seq_length)
    parts = [
        (split.get("dropped_overlong", 0), f"over max_seq_length{limit} with overlong: drop"),
        (split.get("dropped_no_marker", 0), "without response_template"),
        (split.get("dropped_no_completion", 0), NO_COMPLETION),
        (split.get("dropped_answer_cut", 0), f"with the answer past max_seq_length{limit}"),
        (
            split.get("dropped_template", 0),
            "refused by the chat template or with no assistant turn (the first: "
            f"{split.get('template_refusal') or 'not recorded'})",
        ),
    ]
    said = [f"{n:,} {why}" for n, why in parts if n]
    return "; ".join(said) or "none"


# what became of the examples over max_seq_length, by the stats key that counts them
LONG_WORDS = {
    "truncated": "cut to it: what follows is not trained (raise max_seq_length, set "
    "training.dataset.overlong: split to train all of each in pieces, or drop to leave them out)",
    "split": "split into pieces of it, each trained as an example (a piece's first token is "
    "not trained)",
}


def long_words(split: dict[str, Any], key: str, max_seq_length: int | None = None) -> str | None:
    """What became of a split's examples longer than max_seq_length, counted under `key`
    (`truncated`: their tokens past it are not trained, a corpus of long documents kept 1.5%
    of its tokens, said only as `train.truncated 25` among the counts; `split`). None for
    none."""
    count, read = split.get(key, 0), _formatted(split)
    if not isinstance(count, int) or count <= 0:
        return None
    return (
        f"{count:,} of {read:,} examples were longer than max_seq_length"
        f"{_limit(max_seq_length)} and {LONG_WORDS[key]}"
    )


def count_lines(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, words) of what a cache's training split lost or trains, where any: the drop
    reasons, the examples cut, and the loss's masking rules (`train` and `pretokenize`)."""
    train, limit = stats.get("train"), stats.get("max_seq_length")
    if not isinstance(train, dict):
        return []
    found = [
        ("dropped", drop_reasons(train, limit) if train.get("dropped") else None),
        ("cut", long_words(train, "truncated", limit)),
        ("split", long_words(train, "split", limit)),
        ("loss on", masking_words(train)),
    ]
    return [(label, said) for label, said in found if said]


def _formatted(split: dict[str, Any]) -> Any:
    """The examples a split's shards formatted (those held out for evaluation and a task
    weight's copies counted where they went), else those read (an older cache's stats)."""
    return split.get("examples", split.get("examples_read", 0))


def _limit(max_seq_length: Any) -> str:
    """`=2048` after max_seq_length where the length is known (an older cache's stats lack it)."""
    return f"={max_seq_length}" if isinstance(max_seq_length, int) and max_seq_length else ""
