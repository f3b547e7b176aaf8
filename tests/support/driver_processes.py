"""Starting `acceld driver NAME` processes in tests and reading the URL they print."""

from __future__ import annotations

import select
import subprocess
import time


def read_url(proc: subprocess.Popen, deadline: float, name: str) -> str:
    """The URL from the process's 'acceld driver NAME: <url>' line (stdout must be a pipe)."""
    assert proc.stdout is not None
    prefix = f"acceld driver {name}: "
    buffer = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            buffer += line
            if line.startswith(prefix):
                return line.split(": ", 1)[1].strip()
        elif proc.poll() is not None:
            break
    raise AssertionError(f"no URL from acceld driver {name} (exit {proc.poll()}): {buffer} "
                         f"(its stderr log is in the test's tmp_path)")


def stop(proc: subprocess.Popen) -> None:
    """Terminate one process we started, killing it if it does not exit."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
