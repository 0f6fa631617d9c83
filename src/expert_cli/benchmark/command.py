"""The command a benchmark samples: started in its own process group, stopped politely."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from expert_cli.errors import UserError

SIGINT_GRACE_S = 10.0  # after SIGINT, how long the command may take to save and exit
SIGTERM_GRACE_S = 5.0  # after SIGTERM, before SIGKILL


class Command:
    """A child command in its own process group, stopped politely when time is up."""

    def __init__(self, argv: list[str]) -> None:
        try:
            self.proc = subprocess.Popen(argv, start_new_session=True)
        except (FileNotFoundError, PermissionError) as exc:
            raise UserError(f"-- {argv[0]}: cannot start the command ({exc.strerror})") from exc
        self.argv = argv

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float | None) -> int | None:
        """Wait up to `timeout` seconds (None: to its end); the exit code if it ended."""
        try:
            limit = None if timeout is None else max(timeout, 0.0)
            return self._code(self.proc.wait(timeout=limit))
        except subprocess.TimeoutExpired:
            return None

    @staticmethod
    def _code(returncode: int) -> int:
        """A shell-style exit code: killed by signal N -> 128 + N."""
        return 128 - returncode if returncode < 0 else returncode

    def stop(self) -> int:
        """SIGINT, then SIGTERM, then SIGKILL to the whole group; the command's exit code."""
        for sig, grace in ((signal.SIGINT, SIGINT_GRACE_S), (signal.SIGTERM, SIGTERM_GRACE_S)):
            if self.proc.poll() is not None:
                break
            self._signal(sig)
            if self.wait(grace) is not None:
                break
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
        return self._code(self.proc.wait())

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
