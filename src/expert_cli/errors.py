"""The two kinds of failure the CLI tells apart: the user's input, and everything else."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (manifest, data, paths, arguments). The CLI prints it and exits 2.

    `lines` are `location: message` strings, one per problem, so that several problems can be
    reported at once.
    """

    def __init__(self, lines: str | list[str]) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


class RunError(Exception):
    """A failure at run time that is not the user's input. The CLI prints it and exits 1."""
