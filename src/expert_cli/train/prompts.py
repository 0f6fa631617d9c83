"""The prompts `generate` answers: `--prompt` values and the lines of `--prompts FILE` (or
standard input), bounded and checked before any model loads."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from expert_cli.data.tools import TOOLS_SHAPE, parsed_tools, tools_text
from expert_cli.errors import UserError

MAX_PROMPTS = 10_000
MAX_PROMPT_CHARS = 200_000
MAX_TOOLS_BYTES = 4 << 20  # tool definitions: a few KB each


def prompt_texts(prompts: list[str], prompts_file: Path | None) -> list[str]:
    """`--prompt` values, then the lines of `--prompts FILE` (blank lines skipped), each
    checked: bounded, not empty, UTF-8 text."""
    if prompts_file is not None:
        prompts = [*prompts, *_prompt_lines(prompts_file)]
    if len(prompts) > MAX_PROMPTS:
        raise UserError(f"--prompts: more than {MAX_PROMPTS:,} prompts; split the file")
    for i, prompt in enumerate(prompts, 1):
        if not prompt.strip():
            raise UserError(f"prompt {i}: empty; give the text to answer")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UserError(f"prompt {i}: over {MAX_PROMPT_CHARS:,} characters")
        if any("\ud800" <= c <= "\udfff" for c in prompt):  # argv bytes that are not UTF-8
            raise UserError(f"prompt {i}: holds bytes that are not UTF-8 text")
    return prompts


def system_text(system: str | None) -> str | None:
    """`--system`, checked as a prompt is."""
    if system is None:
        return None
    if not system.strip():
        raise UserError("--system: empty; give the system turn's text or leave it out")
    if len(system) > MAX_PROMPT_CHARS:
        raise UserError(f"--system: over {MAX_PROMPT_CHARS:,} characters")
    if any("\ud800" <= c <= "\udfff" for c in system):
        raise UserError("--system: holds bytes that are not UTF-8 text")
    return system


def asked(
    prompts: list[str], prompts_file: Path | None, system: str | None, tools: Path | None, n: int
) -> tuple[list[str], str | None, list[Any] | None]:
    """`generate`'s prompts, system turn and tool definitions, checked: `--system` and
    `--tools` go with prompts given (`--eval`'s `n` examples have the run's own)."""
    texts, turn = prompt_texts(prompts, prompts_file), system_text(system)
    given = tools_given(tools)
    if not texts and not n:
        raise UserError("generate: give --prompt TEXT, --prompts FILE or --eval N")
    for option, value in (("--system", turn), ("--tools", given)):
        if value and not texts:
            raise UserError(f"{option}: goes with --prompt or --prompts (--eval's have their own)")
    return texts, turn, given


def tools_given(path: Path | None) -> list[Any] | None:
    """`--tools FILE`: the tool definitions the prompts are asked with (a JSON list of
    objects, as a training row's `tools`), checked; an error never quotes the file."""
    if path is None:
        return None
    if not path.is_file():
        what = "not a file" if os.path.lexists(path) else "does not exist"
        raise UserError(f"--tools {path}: {what}")
    try:
        if path.stat().st_size > MAX_TOOLS_BYTES:
            raise UserError(f"--tools {path}: over {MAX_TOOLS_BYTES >> 20} MB of definitions")
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"--tools {path}: byte {exc.start}: not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"--tools {path}: cannot be read ({exc.strerror})") from None
    tools, problem = parsed_tools(text)
    if problem or not tools:
        raise UserError(f"--tools {path}: {problem or f'holds none; expected {TOOLS_SHAPE}'}")
    try:  # JSON's escapes can write half a character
        tools_text(tools).encode()
    except UnicodeEncodeError:
        raise UserError(f"--tools {path}: holds a lone surrogate escape; not text") from None
    return tools


def _prompt_lines(path: Path) -> list[str]:
    """One prompt per line (`\\n` in a line stands for a newline), read in bounded pieces;
    `-` reads standard input."""
    stdin = str(path) == "-"
    if not stdin and not path.is_file():
        what = "not a file" if os.path.lexists(path) else "does not exist"
        raise UserError(f"--prompts {path}: {what} (- reads standard input)")
    lines: list[str] = []
    number = 0  # the file's line number, blank lines counted
    try:
        with _opened(path, stdin) as f:  # a BOM is no part of the first prompt
            while len(lines) <= MAX_PROMPTS and (line := f.readline(MAX_PROMPT_CHARS + 2)):
                number += 1
                if len(line.rstrip("\n")) > MAX_PROMPT_CHARS:  # 200,001 + "\n" fits the read
                    raise UserError(
                        f"--prompts {path}:{number}: a line over {MAX_PROMPT_CHARS:,} characters"
                    )
                if line.strip():
                    lines.append(line.rstrip("\n").replace("\\n", "\n"))
    except UnicodeDecodeError as exc:
        raise UserError(f"--prompts {path}: byte {exc.start}: not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"--prompts {path}: cannot be read ({exc.strerror})") from None
    if not lines:
        raise UserError(
            f"--prompts {path}: holds no prompt; expected one prompt per line (blank lines "
            "are skipped, \\n in a line stands for a newline)"
        )
    return lines


@contextmanager
def _opened(path: Path, stdin: bool) -> Iterator[Any]:
    """The prompts file, or standard input as UTF-8 text (left open: it is not ours)."""
    if not stdin:
        with path.open(encoding="utf-8-sig") as f:
            yield f
        return
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # standard input closed (`<&-`)
        raise UserError("--prompts -: standard input is closed; give a file or pipe prompts in")
    wrapper = io.TextIOWrapper(stream, encoding="utf-8-sig")
    try:
        yield wrapper
    finally:
        wrapper.detach()
