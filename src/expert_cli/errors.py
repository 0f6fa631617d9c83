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


class Terminated(BaseException):
    """SIGTERM (or SIGHUP: the terminal closed) where a command stops at once, as it does
    for Ctrl-C (undoing what it began); the CLI exits `code`, 128 + the signal's number (143
    for SIGTERM). Like KeyboardInterrupt, no `except Exception` stops it; unlike it, typer
    does not turn it into exit 130."""

    def __init__(self, code: int = 143) -> None:
        self.code = code
        super().__init__(code)


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM where a command can say what it left: its message says whether the
    work was put in place or nothing was written. The CLI prints it and exits `code` (130
    for SIGINT, 143 for SIGTERM)."""

    def __init__(self, message: str, code: int = 130) -> None:
        self.code = code
        super().__init__(message)


def left_by(signal: BaseException, what: str, shown: str | None, whole: str | None) -> Interrupted:
    """What a Ctrl-C or SIGTERM (`signal`) left where a command writes `what` at `shown` (a
    path as shown, None where unknown yet): `whole`, the words for it written in full ("X
    was"), or None where nothing was put in place."""
    code = signal.code if isinstance(signal, Terminated) else 130
    if whole is not None:
        return Interrupted(f"{whole} written in full before it", code)
    where = f" to {shown}" if shown is not None else ""
    return Interrupted(f"before {what} was in place: nothing written{where}", code)


def escaped(text: str) -> str:
    """`text` with what a terminal or a font cannot show plainly (control characters, bytes
    that are not UTF-8) as escapes: `\x1b`, `\udcff`."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def value_kind(value: object) -> str:
    """What a value is, without quoting it: errors name the place, never the contents of a
    user's file (a string there may be a secret, a page of text or terminal escapes)."""
    if isinstance(value, bool):
        return "true or false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return (
            "an empty string"
            if not value
            else f"a string of {len(value):,} character{'s' * (len(value) > 1)}"
        )
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items" if value else "an empty list"
    if isinstance(value, dict):
        return "an object"
    return "a value of another kind"


def exception_chain(exc: BaseException, limit: int = 8) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or while handling (`__cause__`, else
    `__context__`), at most `limit` of them: a library's wrapper hides the failure that matters."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < limit:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
