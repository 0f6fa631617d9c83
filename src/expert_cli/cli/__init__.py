"""The command line, and the only layer that prints, draws progress bars or exits.

One module per command group; each command parses its options, calls one library function and
renders the typed result it returns. `app` is the Typer application, `main` its entry point,
`console_script` the console script's (`main`, then an exit that a signal during the
interpreter's shutdown does not garble).
"""

from expert_cli.cli.app import app, console_script, main

__all__ = ["app", "console_script", "main"]
