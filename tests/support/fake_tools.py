"""Executable stand-ins for vendor tools (fpgaconf, xbmgmt): record argv, exit as told."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def make_tool(path: Path, *, exit_code: int = 0, stderr: str = "", sleep: float = 0) -> Path:
    """Write an executable that appends its argv (JSON, one line per run) to ``<path>.calls``."""
    calls = f"{path}.calls"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, time\n"
        f"with open({calls!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"time.sleep({sleep})\n"
        f"sys.stderr.write({stderr!r})\n"
        f"sys.exit({exit_code})\n")
    os.chmod(path, 0o755)
    return path


def calls(path: Path) -> list[list[str]]:
    """The argv lists the tool was run with."""
    record = Path(f"{path}.calls")
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]
