"""What every command shares when it prints: consoles, the build progress bar, errors."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from expert_cli.errors import UserError


def console(stderr: bool = False) -> Console:
    """A console for plain text: no highlighting, long lines wrap instead of being cut."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


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
    lines = exc.lines if isinstance(exc, UserError) else [str(exc)]
    out.print(f"[bold red]{kind}:[/bold red]")
    for line in lines:
        out.print(f"  {line}", markup=False)
