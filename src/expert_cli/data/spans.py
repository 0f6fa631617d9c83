"""Which characters of a rendered example are trained, and which tokens that makes: the
assistant spans by the rules of data/formatting.py's module doc, mapped to tokens through the
tokenizer's offsets (a token is trained when its first character is inside a span; a character
written as several byte tokens is trained through its last)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

CHATML_ASSISTANT = "<|im_start|>assistant"
CHATML_END = "<|im_end|>"
MARKER_ASSISTANT = "<|assistant|>"
MARKER_END = "<|end|>"
EOS_TURN_END = "</s>"  # what some <|user|>/<|assistant|> data ends its turns with instead
EOS_BEFORE_ASSISTANT = re.compile(r"</s>\s*<\|assistant\|>")
MARKER_TURNS = ("<|user|>", "<|system|>")

Span = tuple[int, int]


def assistant_spans(text: str, response_template: str | None) -> tuple[list[Span], str]:
    """Character spans to train on, and the rule that found them (see the module doc)."""
    if response_template:
        at = text.find(response_template)
        if at < 0:
            return [], "missing"
        return [(at + len(response_template), len(text))], "template"
    if CHATML_ASSISTANT in text:
        return _turn_spans(text, CHATML_ASSISTANT, (CHATML_END,), ()), "chatml"
    if MARKER_ASSISTANT in text:
        spans = _turn_spans(text, MARKER_ASSISTANT, (MARKER_END,), MARKER_TURNS)
        # Zephyr's layout: the user turn before <|assistant|> ends with </s>, no <|end|> at all
        ended_by_eos = MARKER_END not in text and EOS_BEFORE_ASSISTANT.search(text) is not None
        return spans, "marker_eos" if ended_by_eos else "marker"
    return [(0, len(text))], "none"


def _turn_spans(
    text: str, marker: str, ends: tuple[str, ...], starts: tuple[str, ...]
) -> list[Span]:
    """Spans of each assistant turn: after marker(+newline) through its end token."""
    spans: list[Span] = []
    at = text.find(marker)
    while at >= 0:
        start = at + len(marker)
        for newline in ("\r\n", "\n"):  # a CSV cell from Excel keeps \r\n
            if text.startswith(newline, start):
                start += len(newline)
                break
        stop = len(text)
        for token in ends:
            hit = text.find(token, start)
            if 0 <= hit < stop:
                stop = hit + len(token)
        for token in starts + (marker,):
            hit = text.find(token, start)
            if 0 <= hit < stop:
                stop = hit
        spans.append((start, stop))
        at = text.find(marker, stop)
    return spans


END_MARKERS = ("<|im_end|>", "<|endoftext|>", "</s>")
# Qwen3's template writes an empty reasoning block into every answer after the last user turn:
# an empty answer is still empty with it
EMPTY_THINK = re.compile(r"<think>\s*</think>")


def _bare(part: str, eos: str | None, ends: tuple[str, ...] = ()) -> str:
    """`part` without end-of-turn markers (and the tokenizer's EOS, and `ends`: a chat
    template's own), an empty reasoning block, and surrounding space."""
    for marker in (*END_MARKERS, eos or "", *ends):
        if marker:
            part = part.replace(marker, "")
    return EMPTY_THINK.sub("", part).strip()


def has_content(text: str, spans: list[Span], eos: str | None, ends: tuple[str, ...] = ()) -> bool:
    """Whether the trained spans hold anything but whitespace and end-of-turn markers."""
    if any(_bare(text[start:end], eos, ends) for start, end in spans):
        return True
    return not spans  # no spans: the "missing" / whole-text rules decide


def runs_to_end(text: str, spans: list[Span], eos: str | None) -> bool:
    """Whether the last trained span reaches the text's end (end-of-turn markers and
    whitespace aside): then the example's EOS is trained, as the answer's end. A text that
    ends with a prompt (a user turn after the last answer) does not teach the model to stop
    there."""
    return bool(spans) and not _bare(text[max(stop for _, stop in spans) :], eos)


def span_mask(text: str, enc: Any, n_tokens: int, spans: list[Span]) -> Any:
    """Boolean mask of tokens whose first character lies inside one of `spans`, or whose
    part before a span is only whitespace (a response template ending in a space)."""

    mask = np.zeros(n_tokens, dtype=bool)
    for start, stop in spans:
        first = token_at_or_after(text, enc, start, stop)
        if first is None:
            continue
        last = enc.char_to_token(stop - 1)
        while last is None and stop - 1 > start:
            stop -= 1
            last = enc.char_to_token(stop - 1)
        # a character of several byte tokens (an emoji, an accented letter under byte-level
        # BPE): char_to_token names its first; the span runs through its last
        while last is not None and last + 1 < n_tokens:
            chars = enc.token_to_chars(last + 1)  # None for a special token the tokenizer adds
            if chars is None or chars[0] >= stop:
                break
            last += 1
        if last is not None and last >= first:
            mask[first : last + 1] = True
    return mask


def token_at_or_after(text: str, enc: Any, start: int, stop: int) -> int | None:
    """Index of the first token of the span from character `start` (before `stop`): one that
    starts there or after, or one that straddles `start` with only whitespace before it (BPE
    joins a template's trailing space to the answer's first word: " Yes")."""
    pos = start
    while pos < stop:
        token = enc.char_to_token(pos)
        if token is not None:
            begins = enc.token_to_chars(token)[0]
            if begins < start and not text[begins:start].isspace():  # mostly prompt
                token += 1
            return token
        pos += 1
    return None
