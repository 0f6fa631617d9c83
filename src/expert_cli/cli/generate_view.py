"""What `expert-cli generate` prints: each prompt, its answers as they stream, the reference
and whether the answer matched it, then the run's exact-match rate and notes."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from expert_cli.cli.render import labelled
from expert_cli.train.generate import Case, GenerateResult, Generation

WIDTH = 10  # the label column, as train's: "note      "


class GenerateView:
    """`expert-cli generate` on the console: each prompt, then its answers as they stream."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def start(self, index: int, case: Case, which: str) -> None:
        if which == "expert":
            task = "" if case.task is None else f" (task {escape(case.task)})"
            self.console.print(f"\n[bold]prompt {index + 1}[/bold]{task}", highlight=False)
            shown = case.prompt if len(case.prompt) <= 400 else "…" + case.prompt[-399:]
            self.console.print(shown, markup=False, highlight=False, style="dim")
        else:
            self.console.print()  # end the expert's streamed answer
        self.console.print(f"[bold cyan]{which}:[/bold cyan] ", end="", highlight=False)

    def text(self, piece: str) -> None:
        self.console.print(piece, end="", markup=False, highlight=False)

    def end(self, generation: Generation) -> None:
        self.console.print()
        if generation.reference is not None:
            self.console.print("[bold]reference:[/bold] ", end="", highlight=False)
            self.console.print(generation.reference, markup=False, highlight=False)
            mark = "[green]yes[/green]" if generation.exact_match else "[red]no[/red]"
            self.console.print(f"exact match: {mark}", highlight=False)


def print_generate_end(console: Console, result: GenerateResult) -> None:
    """Notes, and the exact-match rate of an --eval run."""
    rate = result.exact_match_rate
    if rate is not None:
        marks = [g.exact_match for g in result.generations if g.exact_match is not None]
        console.print(
            f"\n[bold]exact match[/bold] {sum(marks)}/{len(marks)} ({rate:.0%})", highlight=False
        )
    for note in result.notes:
        console.print(labelled("note", "yellow", note, WIDTH))
