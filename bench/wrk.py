"""wrk, the C load generator, for the benches: the client never competes with the server
for the machine's two cores, as a Python client parsing every answer did.

``run`` drives one URL from ``connections`` kept-alive connections for ``seconds`` (a
server that answers ``Connection: close`` gets a new connection per request) and returns
what bench/loadgen.py's Result reports. A body containing ``{unique}`` gets a value of its
own in every request (wrk's threads number themselves; each counts its requests), for
creates whose names must not clash. ``apt-get install wrk``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  prefix = args[1]
  n = 0
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  n = n + 1
  local body = string.gsub(BODY, "{unique}", prefix .. "-" .. tid .. "-" .. n)
  -- nil headers: wrk's own (every -H) go out; a table here would replace them.
  return wrk.format(METHOD, nil, nil, body)
end
"""


@dataclass
class Result:
    """One wrk run, with the fields the bench tables read from loadgen's Result."""

    name: str
    ops: int
    errors: int
    seconds: float
    p50_ms: float
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


def available() -> bool:
    return shutil.which("wrk") is not None


def _lua_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run(name: str, url: str, *, headers: dict[str, str], method: str = "GET",
        body: str | None = None, connections: int = 4, seconds: float = 5.0,
        timeout: float = 30.0, close: bool = False) -> Result:
    argv = ["wrk", "-t", str(min(2, connections)), "-c", str(connections),
            "-d", f"{seconds:g}s", "--latency", "--timeout", f"{timeout:g}s"]
    for key, value in headers.items():
        argv += ["-H", f"{key}: {value}"]
    if close:
        argv += ["-H", "Connection: close"]
    with tempfile.TemporaryDirectory(prefix="acceld-wrk-") as tmp:
        if body is not None or method != "GET":
            script = Path(tmp) / "request.lua"
            script.write_text(f"METHOD = {_lua_string(method)}\n"
                              f"BODY = {_lua_string(body or '')}\n" + SCRIPT)
            argv += ["-s", str(script), url, "--", f"{time.time_ns():x}"]
        else:
            argv.append(url)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + timeout + 30)
    return parse(name, out.stdout + out.stderr)


def parse(name: str, output: str) -> Result:
    """wrk's summary: requests completed, duration, the median latency, failures."""
    done = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b", output)
    if done is None:
        return Result(name, 0, 1, 0.0, float("nan"), f"wrk: {output.strip()[-300:]}")
    unit = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
    seconds = float(done.group(2)) * unit[done.group(3)]
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s|m)\b", output)
    p50_ms = float(p50.group(1)) * unit[p50.group(2)] * 1000 if p50 else float("nan")
    errors = 0
    first_error = ""
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if non_2xx:
        errors += int(non_2xx.group(1))
        first_error = f"{non_2xx.group(1)} non-2xx answers"
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                        r"timeout (\d+)", output)
    if sockets:
        # Connect and write failures and timeouts are failed requests; a read error is a
        # connection the server closed between requests (counted, and said, not failed).
        failed = int(sockets.group(1)) + int(sockets.group(3)) + int(sockets.group(4))
        errors += failed
        if (failed or int(sockets.group(2))) and not first_error:
            first_error = sockets.group(0)
    return Result(name, int(done.group(1)) - (int(non_2xx.group(1)) if non_2xx else 0),
                  errors, seconds, p50_ms, first_error)
