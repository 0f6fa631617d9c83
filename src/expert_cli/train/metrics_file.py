"""metrics.json, rewritten at every logging window without its cost growing with the run.

The file holds every window of the run. Serialising all of them again at each window made a
long run's writes grow with its length: 160 ms for 10,000 windows on the training thread (a
stall the GPU sees), 15 GB written over such a run. A window is not changed once closed, so
its text is made once and the file is put together from those texts; the bytes are those
`json.dumps(..., indent=2)` of the whole would give. Past MAX_EAGER_BYTES the file is rewritten
while the run goes on at most every LARGE_INTERVAL_S seconds; an evaluation, a checkpoint (a
resume after a kill reads the windows up to it from here) and any other status (the end, an
interrupt, a failure) are written at once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from expert_cli.atomic import atomic_file, json_numbers

MAX_EAGER_BYTES = 4 << 20
LARGE_INTERVAL_S = 30.0
_EMPTY = '"windows": []'


def _dumps(data: Any) -> str:
    return json.dumps(json_numbers(data), indent=2, default=str, allow_nan=False)


class MetricsFile:
    """The run's metrics.json at `path`; `write` replaces it atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._texts: list[str] = []  # each window's text, indented as inside the file
        self._written_at: float | None = None
        self._written_chars = 0  # the last write's length

    def text(self, windows: list[dict[str, Any]], rest: dict[str, Any]) -> str:
        """The file's text: `windows` (only appended to between calls) then `rest`."""
        for window in windows[len(self._texts) :]:
            self._texts.append("\n".join("    " + line for line in _dumps(window).split("\n")))
        head = _dumps({"windows": [], **rest})
        if not windows:
            return head
        listed = '"windows": [\n' + ",\n".join(self._texts[: len(windows)]) + "\n  ]"
        return head.replace(_EMPTY, listed, 1)

    def write(self, windows: list[dict[str, Any]], rest: dict[str, Any], running: bool) -> bool:
        """Replace the file; while `running`, a file past MAX_EAGER_BYTES waits until
        LARGE_INTERVAL_S have passed since its last write. Returns whether it was written."""
        now = time.monotonic()
        recent = self._written_at is not None and now - self._written_at < LARGE_INTERVAL_S
        wait = running and recent
        if wait and self._written_chars > MAX_EAGER_BYTES:  # it only grows: not put together
            return False
        text = self.text(windows, rest)
        if wait and len(text) > MAX_EAGER_BYTES:
            return False
        with atomic_file(self.path) as tmp:
            tmp.write_text(text + "\n", encoding="utf-8")
        self._written_at, self._written_chars = now, len(text)
        return True
