"""What every command shares when it prints: consoles, the build progress bar, errors."""

from __future__ import annotations

import os
import re
import sys
from contextlib import suppress
from dataclasses import dataclass, field
from errno import EPIPE
from typing import Any

from rich.console import Console
from rich.errors import MarkupError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
from rich.text import Text

from expert_cli.errors import UserError

# Characters a terminal acts on rather than shows: C0 and C1 controls (an ESC starts a
# sequence that can recolour, clear or retitle the terminal) and the bidirectional overrides
# that reorder what is shown. Tab and newline stay.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """`text` with every control character shown as an escape (`\x1b`, `\u202e`)."""
    return CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(text: str) -> str:
    """`text` as one line: control characters and line breaks shown as escapes (an item of a
    list, such as an error naming a file whose name holds a line break, cannot forge a
    second item)."""
    return visible(text).replace("\r", "\\r").replace("\n", "\\n")


def plain(value: Any) -> Text:
    """`value` as text shown as it is: no markup (a file named `[/x]` or `[red]` is shown,
    not obeyed), control characters as escapes."""
    return Text(visible(str(value)))


def labelled(label: str, style: str, text: Any, width: int = 0) -> Text:
    """`label` in `style`, padded to `width`, then `text` as it is: no markup is parsed in it
    (a path holding `[/x]` or `[red]`, or ending in a backslash, is shown as written), control
    characters as escapes."""
    return Text.assemble((label, style), " " * max(width - len(label), 1), visible(str(text)))


class SafeConsole(Console):
    """A rich console that shows control characters in what it prints (names, paths and
    values come from users' files and arguments) as escapes instead of sending them to the
    terminal. Every string printed or put in a table passes through `render_str`. A string
    that is not valid markup (a user's value put in a markup string unquoted) is shown as
    plain text, not a traceback."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        try:
            return super().render_str(visible(text), **kwargs)
        except MarkupError:
            return super().render_str(visible(text), **{**kwargs, "markup": False})

    def _check_buffer(self) -> None:
        """rich's write of what was printed; a stderr that cannot be written any more (or,
        under `keep_going_without_output`, stdout) stops the printing to it, not the
        command."""
        stream = "stderr" if self.stderr else "stdout"
        if stream in OUTPUT.lost:
            del self._buffer[:]
            return
        try:
            super()._check_buffer()
        except OSError as exc:  # EIO (the terminal hung up), EBADF (closed), ENOSPC (full)
            if not (OUTPUT.keep_going or self.stderr):  # stdout is the product of the others
                raise
            del self._buffer[:]
            give_up(stream, exc)

    def on_broken_pipe(self) -> None:
        """A pipe whose reader left (`| head`): rich's own answer is a silent exit 1."""
        if not (OUTPUT.keep_going or self.stderr):
            super().on_broken_pipe()
            return
        del self._buffer[:]
        give_up("stderr" if self.stderr else "stdout", BrokenPipeError(EPIPE, "Broken pipe"))


def give_up(stream: str, exc: OSError) -> None:
    """Stop printing to `stream` ("stdout" or "stderr"), which cannot be written (`exc`): later
    writes go to /dev/null, and a note on the other stream says so once."""
    OUTPUT.lost[stream] = exc.strerror or type(exc).__name__
    silence(stream)
    other = "stdout" if stream == "stderr" else "stderr"
    if other not in OUTPUT.lost:
        console(stderr=other == "stderr").print(
            f"note: {STREAM_NAMES[stream]} cannot be written "
            f"({OUTPUT.lost[stream]}); the command goes on without printing to it",
            markup=False,
        )


def silence(stream: str) -> None:
    """Send `stream`'s later writes (logging, the flush at exit) to /dev/null instead of
    failing: a stream full or gone."""
    file = sys.stderr if stream == "stderr" else sys.stdout
    with suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, file.fileno())
        finally:
            os.close(devnull)


STREAM_NAMES = {"stdout": "standard output", "stderr": "standard error"}


@dataclass
class Output:
    """Whether a command goes on when its output cannot be written (train, pretokenize:
    their product is files; a run lost its steps since the last checkpoint to a closed
    pipe or a terminal that hung up), and which streams are lost."""

    keep_going: bool = False
    lost: dict[str, str] = field(default_factory=dict)


OUTPUT = Output()


def keep_going_without_output() -> None:
    """From here on, a terminal that hangs up, a pipe whose reader left, or a closed or full
    stdout or stderr stops the printing, not the command."""
    OUTPUT.keep_going = True


def echo(text: str) -> None:
    """`text` and a newline on stdout (a command's JSON); where the command's product is files
    (keep_going_without_output), a stdout that cannot be written any more (`| head -1`)
    stops the printing, with a note on stderr, not the command: its work is done."""
    if "stdout" in OUTPUT.lost:
        return
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as exc:
        if not OUTPUT.keep_going:
            raise
        give_up("stdout", exc)


def console(stderr: bool = False) -> Console:
    """A console for plain text: no highlighting, long lines wrap instead of being cut,
    control characters shown, not obeyed."""
    return SafeConsole(stderr=stderr, highlight=False, soft_wrap=True)


class BuildBar:
    """A token-cache build's progress as a rich bar on stderr (a data.BuildProgress)."""

    def __init__(self) -> None:
        self.bar: Progress | None = None
        self.task = None

    def start(self, description: str, total: int) -> None:
        self.stop()
        self.bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console(stderr=True),
            transient=False,
        )
        self.bar.start()
        self.task = self.bar.add_task(description, total=total or None)  # 0: not known

    def advance(self, examples: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, examples)
            if self.bar.tasks[0].total and self.bar.finished:
                self.stop()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def print_error(kind: str, exc: BaseException) -> None:
    """`kind:` and the error's lines on stderr (a UserError's `location: message` lines)."""
    out = console(stderr=True)
    lines = exc.lines if isinstance(exc, UserError) else str(exc).splitlines()
    out.print(f"[bold red]{kind}:[/bold red]")
    for line in lines:
        out.print(f"  {one_line(line)}", markup=False)
