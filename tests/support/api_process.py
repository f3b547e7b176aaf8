"""`acceld api` as its own process (gunicorn and its workers), from a config file's text:
started, waited for until the version document answers, and stopped by its PID's group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import requests


def stop(proc: subprocess.Popen) -> None:
    """Stop the process group of the PID we started (gunicorn and its workers)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def running(state: Path, conf_text: str, port: int) -> Iterator[str]:
    """`acceld api --config-file <state>/acceld.conf` (``conf_text``) listening on ``port``;
    yields its base URL once the version document answers."""
    conf = state / "acceld.conf"
    conf.write_text(conf_text)
    acceld = Path(sys.executable).with_name("acceld")
    with open(state / "stderr.log", "wb") as err:
        proc = subprocess.Popen([str(acceld), "api", "--config-file", str(conf)],
                                stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (state / "stderr.log").read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                if requests.get(base + "/accelerator/v2", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "acceld api did not start"
            time.sleep(0.1)
        yield base
    finally:
        stop(proc)
