"""Writing a file so that readers never see half of it: a temporary file beside it, then a
rename. A leaf module: the data path, telemetry and the benchmark all use it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as indented JSON to `path` through a temporary file and `os.replace`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
