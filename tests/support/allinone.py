"""Start a real `acceld all` for a test, wait until it announces its API, stop it by PID."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from tests.support.net import free_port


@dataclass
class Launched:
    proc: subprocess.Popen
    url: str  # the announced API URL, .../accelerator/v2
    state_path: str
    lines: list[str] = field(default_factory=list)  # everything it printed, kept up to date


SERVICES = ("conductor", "api", "agent")  # what `acceld all` starts and announces


def _pump(stream, lines: list[str], announced: "queue.Queue[tuple[str, str]]") -> None:  # type: ignore[no-untyped-def]
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        lines.append(line)
        for service in SERVICES:
            if line.startswith(f"acceld {service}: "):
                announced.put((service, line.split(": ", 1)[1].strip()))
    announced.put(("", ""))  # the process closed its output: it is gone


def launch(state_path: str, config_file: str, *, timeout: float = 60.0,
           port: int | None = None) -> Launched:
    """`acceld all` on ``port`` (default a free one), returned once every service has
    announced itself; RuntimeError with its last output if that does not happen within
    ``timeout`` seconds."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "acceld.cmd.main", "all", "--port", str(port or free_port()),
         "--state-path", str(state_path), "--config-file", str(config_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    announced: queue.Queue[tuple[str, str]] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines, announced), daemon=True).start()
    urls: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while set(urls) != set(SERVICES):
        try:
            service, url = announced.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            service = ""
        if not service:
            stop(proc)
            raise RuntimeError("acceld all did not announce all its services:\n"
                               + "\n".join(lines[-40:]))
        urls[service] = url
    return Launched(proc, urls["api"], str(state_path), lines)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the all-in-one (it stops its services), then its process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
